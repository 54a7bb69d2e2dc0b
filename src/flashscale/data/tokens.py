"""Token files: corpus documents tokenized once into a memory-mapped array, cached by content hash.

A cache entry is a folder `<cache_dir>/tokens/<key>/`:
    tokens.bin       the token ids, uint16 when the vocabulary fits (< 65536 ids), else uint32, with the
                     end-of-text id after every document
    doc_starts.npy   int64 (D,): the offset of each document's first token (document i spans
                     [doc_starts[i], doc_starts[i+1]), its EOS last)
    meta.json        dtype, number of tokens and documents, vocab size, eos id, the sources
<key> hashes the files' bytes, the tokenizer's JSON and the EOS id, so the same inputs reuse the entry
(a second run reads nothing but the file digests) and any change makes a new one. The folder is built
under a temporary name and renamed into place: a killed run never leaves a partial entry behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from flashscale.data.cache import publish_dir
from flashscale.data.corpus import text_suffix, file_digest, read_documents, text_files
from flashscale.data.tokenizer import eos_token_id

FORMAT_VERSION = 1  # bump when the file layout or the document reading changes: old entries then miss
BATCH_CHARS = 16 << 20  # characters a encode_batch call: bounds memory on large corpora
CHUNK_CHARS = 64 << 10  # long documents are encoded in pieces of about this size, in parallel


class TokenFile:
    """A prepared token file (a cache entry folder). `.tokens` is a read-only np.memmap (N,)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"token file folder {str(self.path)!r} has no meta.json")
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"token file {str(self.path)!r}: format {self.meta.get('format')!r}, "
                             f"this version reads {FORMAT_VERSION}")
        n = int(self.meta["num_tokens"])
        self.tokens = np.memmap(self.path / "tokens.bin", dtype=np.dtype(self.meta["dtype"]), mode="r",
                                shape=(n,))  # (N,)
        self.doc_starts = np.load(self.path / "doc_starts.npy")  # (D,) int64
        self.vocab_size = int(self.meta["vocab_size"])
        self.eos_id = int(self.meta["eos_id"])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_docs(self) -> int:
        return int(self.doc_starts.shape[0])

    def __repr__(self) -> str:
        return (f"TokenFile({str(self.path)!r}, tokens={len(self)}, docs={self.num_docs}, "
                f"vocab_size={self.vocab_size}, dtype={self.tokens.dtype})")


def _cut_offset(tokenizer: Tokenizer) -> int | None:
    """Where, inside the "\\n\\n" between two paragraphs, a document can be cut so that encoding the
    two sides separately gives exactly the ids of encoding it whole (0: before the separator, 1: in
    the middle, 2: after), or None when no cut is exact for this tokenizer.

    Whether a cut is exact depends on the pre-tokenizer's regex (GPT-2's `\\s+(?!\\S)` splits "\\n\\n"
    before a word into "\\n", "\\n"; Llama-3's `\\s*[\\r\\n]+` keeps it whole) and on normalizers that
    prepend a marker to every encoded string (sentencepiece-style: no cut is exact), so it is tested
    on probes covering the character classes the regexes distinguish (letters, digits, punctuation,
    quotes, non-ASCII) on both sides of the separator. Paragraphs are only cut where neither side has
    whitespace next to the separator, the context the probes cover."""
    probes, seps = [], []
    for end in ".a\"?)9é—:,;!":
        for start in "Ta\"1(é—'-*[_":
            text = f"Some words {end}\n\n{start}ome more words"
            probes.append(text)
            seps.append(text.index("\n\n"))
    whole = [e.ids for e in tokenizer.encode_batch(probes, add_special_tokens=False)]
    for off in (1, 2, 0):
        parts = [t[: i + off] for t, i in zip(probes, seps)] + [t[i + off:] for t, i in zip(probes, seps)]
        enc = [e.ids for e in tokenizer.encode_batch(parts, add_special_tokens=False)]
        n = len(probes)
        if all(enc[k] + enc[n + k] == whole[k] for k in range(n)):
            return off
    return None


def _pieces(doc: str, cut: int | None, chunk: int) -> list[str]:
    if cut is None or len(doc) <= 2 * chunk:
        return [doc]
    pieces, start = [], 0
    pos = doc.find("\n\n", start + chunk)
    while pos != -1 and pos < len(doc) - chunk:
        if pos > 0 and not doc[pos - 1].isspace() and pos + 2 < len(doc) and not doc[pos + 2].isspace():
            pieces.append(doc[start: pos + cut])
            start = pos + cut
            pos = doc.find("\n\n", start + chunk)
        else:
            pos = doc.find("\n\n", pos + 1)
    pieces.append(doc[start:])
    return pieces


def encode_documents(tokenizer: Tokenizer, docs: Sequence[str], *, cut: int | None = None,
                     chunk: int = CHUNK_CHARS) -> list[np.ndarray]:
    """Each document's ids (int64, no special tokens), encoded in parallel by encode_batch; documents
    longer than 2*chunk characters are split at exact paragraph cuts (see _cut_offset) so that one
    long document still uses every core."""
    pieces, owner = [], []
    for i, doc in enumerate(docs):
        for p in _pieces(doc, cut, chunk):
            pieces.append(p)
            owner.append(i)
    encs = tokenizer.encode_batch(pieces, add_special_tokens=False)
    out: list[list[np.ndarray]] = [[] for _ in docs]
    for i, e in zip(owner, encs):
        out[i].append(np.asarray(e.ids, dtype=np.int64))
    return [np.concatenate(parts) if len(parts) > 1 else parts[0] for parts in out]


def encode_text(tokenizer: Tokenizer, text: str, *, add_special_tokens: bool = True,
                chunk: int = CHUNK_CHARS) -> np.ndarray:
    """tokenizer.encode(text).ids as int64 (N,), computed in parallel pieces when the tokenizer has an
    exact paragraph cut (see _cut_offset); the special tokens of the tokenizer's post-processor (a BOS
    template, say) are applied once to the whole, exactly as encode() would."""
    if not isinstance(text, str):
        raise TypeError(f"text: takes str, got {type(text).__name__}")
    cut = _cut_offset(tokenizer) if len(text) > 2 * chunk else None
    pieces = _pieces(text, cut, chunk)
    if len(pieces) == 1:
        return np.asarray(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids, dtype=np.int64)
    merged = Encoding.merge(tokenizer.encode_batch(pieces, add_special_tokens=False), growing_offsets=True)
    if add_special_tokens:
        merged = tokenizer.post_process(merged)
    return np.asarray(merged.ids, dtype=np.int64)


def _key(files: list[Path], tokenizer: Tokenizer, eos_id: int) -> str:
    key = {"format": FORMAT_VERSION, "eos_id": eos_id,
           # the suffix too: the same bytes read as .txt or as .jsonl are different documents
           "files": [(text_suffix(f), file_digest(f)) for f in files],
           "tokenizer": hashlib.sha256(tokenizer.to_str().encode()).hexdigest()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def prepare_tokens(files: Sequence[str | os.PathLike], tokenizer: Tokenizer, cache_dir: str | os.PathLike,
                   *, eos_id: int | None = None) -> TokenFile:
    """Tokenize the documents of files (in order; a folder stands for its text files, sorted) into a
    cached TokenFile, with eos_id (default: the tokenizer's end-of-text token) after every document."""
    if isinstance(files, (str, os.PathLike)) or not isinstance(files, Sequence) or not files:
        raise ValueError(f"files: takes a non-empty list of paths, got {files!r}")
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer: takes a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir: takes a path, got {type(cache_dir).__name__}")
    paths = [f for p in files for f in text_files(p)]
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if eos_id is None:
        eos_id = eos_token_id(tokenizer)
    elif isinstance(eos_id, bool) or not isinstance(eos_id, int) or not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id: takes an int in [0, {vocab_size}), got {eos_id!r}")
    root = Path(cache_dir).expanduser() / "tokens"
    final = root / _key(paths, tokenizer, eos_id)
    if (final / "meta.json").is_file():
        return TokenFile(final)

    dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        cut = _cut_offset(tokenizer)
        doc_starts: list[int] = []
        n = 0
        eos = np.array([eos_id], dtype=dtype)
        with open(tmp / "tokens.bin", "wb") as out:
            for f in paths:
                docs = read_documents(f)
                for lo, hi in _batches(docs, BATCH_CHARS):
                    for ids in encode_documents(tokenizer, docs[lo:hi], cut=cut):
                        if ids.size and int(ids.max()) > np.iinfo(dtype).max:
                            raise ValueError(f"tokenizer: produced id {int(ids.max())} beyond its vocab "
                                             f"size {vocab_size}")
                        doc_starts.append(n)
                        out.write(ids.astype(dtype).tobytes())
                        out.write(eos.tobytes())
                        n += ids.size + 1
            out.flush()
            os.fsync(out.fileno())
        if n == 0:
            raise ValueError(f"files: hold no text to tokenize: {[str(p) for p in paths]}")
        np.save(tmp / "doc_starts.npy", np.asarray(doc_starts, dtype=np.int64))
        meta = {"format": FORMAT_VERSION, "dtype": dtype.name, "num_tokens": n, "num_docs": len(doc_starts),
                "vocab_size": vocab_size, "eos_id": eos_id, "sources": [str(p) for p in paths]}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish_dir(tmp, final)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return TokenFile(final)


def _batches(docs: list[str], max_chars: int):
    lo, size = 0, 0
    for i, d in enumerate(docs):
        if size and size + len(d) > max_chars:
            yield lo, i
            lo, size = i, 0
        size += len(d)
    if lo < len(docs):
        yield lo, len(docs)


def split_tokens(tf: TokenFile, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) views of tf.tokens, cut at the document boundary nearest to a val_fraction tail,
    so no document is split between the two and both are non-empty."""
    if not isinstance(tf, TokenFile):
        raise TypeError(f"tf: takes a TokenFile, got {type(tf).__name__}")
    if (isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float))
            or not 0 < val_fraction < 1):
        raise ValueError(f"val_fraction: takes a float in (0, 1), got {val_fraction!r}")
    if tf.num_docs < 2:
        raise ValueError(f"tf: holds {tf.num_docs} document(s); a split on a document boundary needs >= 2")
    target = len(tf) * (1.0 - val_fraction)
    bounds = tf.doc_starts[1:]  # (D-1,) every boundary leaves both sides non-empty
    cut = int(bounds[np.argmin(np.abs(bounds - target))])
    return tf.tokens[:cut], tf.tokens[cut:]
