"""Tokenizers: train a byte-level BPE with HF `tokenizers`, or load an existing one (tokenizer.json, a
model folder holding one, or the tokenizer inside a GGUF file).

Our trained tokenizers (the GPT-2 recipe):
- byte-level: every byte is in the initial alphabet, so any UTF-8 text encodes, and decode(encode(s))
  == s exactly (no normalizer, no prefix space, whitespace and unicode kept as is);
- one special token, "<|endoftext|>" at id 0. It ends every document in the token files (EOS) and,
  being the token that precedes every document but the first, also serves as BOS; there is no
  separate BOS, PAD or UNK (padding is never needed: training windows are full, evaluation masks).
- encode() adds no special tokens (no post-processor): the data pipeline places EOS itself.
Training is deterministic: the same texts and settings give the same tokenizer.json byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from flashscale.data.cache import atomic_write_text, resolve_cache_dir
from flashscale.data.corpus import file_digest, read_documents

EOS_TOKEN = "<|endoftext|>"
# End-of-text tokens of the tokenizer families we load, most specific first: ours and GPT-2/SmolLM2,
# Llama-3 base, Llama-2/sentencepiece, Gemma-style.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
MIN_VOCAB = 257  # the 256 byte symbols + <|endoftext|>
_RECIPE = "bytelevel-bpe-v1"  # bump when the training recipe changes: old cache entries then miss


def _check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size: takes an int, got {type(vocab_size).__name__} {vocab_size!r}")
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size: takes an int >= {MIN_VOCAB} (256 bytes + {EOS_TOKEN}), "
                         f"got {vocab_size}")


def _new_bpe(vocab_size: int, min_frequency: int) -> tuple[Tokenizer, trainers.BpeTrainer]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    return tok, trainer


def _cache_path(cache_dir, key: dict, vocab_size: int) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return resolve_cache_dir(cache_dir) / "tokenizers" / f"bpe-{vocab_size}-{digest}.json"


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2,
                    cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """A byte-level BPE with at most vocab_size tokens (fewer when the texts hold fewer merges seen
    min_frequency times). Each text is one training unit (a document). With cache_dir, the result is
    cached there under a hash of (texts, vocab_size, min_frequency) and reused."""
    _check_vocab_size(vocab_size)
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency: takes an int >= 1, got {min_frequency!r}")
    if isinstance(texts, str):
        raise TypeError("texts: takes an iterable of strings (documents), got one str; wrap it in a list")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}]: takes str, got {type(t).__name__}")
    if not any(texts):
        raise ValueError("texts: takes at least one non-empty text, got none")
    path = None
    if cache_dir is not None:
        h = hashlib.sha256()
        for t in texts:  # length-prefixed, so ["ab", "c"] and ["a", "bc"] differ
            b = t.encode("utf-8")
            h.update(len(b).to_bytes(8, "little") + b)
        key = {"recipe": _RECIPE, "texts": h.hexdigest(), "vocab": vocab_size, "min_freq": min_frequency}
        path = _cache_path(cache_dir, key, vocab_size)
        if path.is_file():
            return Tokenizer.from_file(str(path))
    tok, trainer = _new_bpe(vocab_size, min_frequency)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    if path is not None:
        save_tokenizer(tok, path)
    return tok


def train_tokenizer_on_files(files: Sequence[str | os.PathLike], vocab_size: int, *,
                             min_frequency: int = 2, max_chars: int | None = None,
                             cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """train_tokenizer on the documents of corpus files, cached (default cache dir when cache_dir is
    None) under a hash of the files' bytes, so a cache hit reads no text at all. max_chars caps the
    training text (each file gives at most max_chars / len(files) characters, from its start): BPE
    merges settle on a few MB, and training time grows with the text."""
    if isinstance(files, (str, os.PathLike)) or not files:
        raise ValueError(f"files: takes a non-empty list of paths, got {files!r}")
    if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int)
                                  or max_chars < len(files)):
        raise ValueError(f"max_chars: takes None or an int >= len(files) ({len(files)}), got {max_chars!r}")
    _check_vocab_size(vocab_size)
    paths = [Path(f) for f in files]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"corpus file {str(p)!r} does not exist")
    digests = [file_digest(p) if p.is_file() else _dir_digest(p) for p in paths]
    key = {"recipe": _RECIPE, "files": digests, "vocab": vocab_size, "min_freq": min_frequency,
           "max_chars": max_chars}
    path = _cache_path(cache_dir, key, vocab_size)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    texts: list[str] = []
    budget = None if max_chars is None else max_chars // len(paths)
    for p in paths:
        left = budget
        for doc in read_documents(p):
            if left is not None:
                if left <= 0:
                    break
                doc = doc[:left]
                left -= len(doc)
            texts.append(doc)
    tok = train_tokenizer(texts, vocab_size, min_frequency=min_frequency)
    save_tokenizer(tok, path)
    return tok


def _dir_digest(path: Path) -> str:
    from flashscale.data.corpus import text_files

    h = hashlib.sha256()
    for f in text_files(path):
        h.update(f"{f.relative_to(path)}\0{file_digest(f)}\n".encode())
    return h.hexdigest()


def save_tokenizer(tokenizer: Tokenizer, path: str | os.PathLike) -> Path:
    """Write tokenizer.json atomically. path: a .json file, or a folder (gets path/tokenizer.json)."""
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer: takes a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
    path = Path(path)
    if path.suffix.lower() != ".json":
        path = path / "tokenizer.json"
    return atomic_write_text(path, tokenizer.to_str(pretty=False))


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """A tokenizer.json file, a model folder holding tokenizer.json, or a .gguf file's tokenizer."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {str(p)!r} does not exist")
    if p.is_dir():
        if not (p / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in folder {str(p)!r}")
        p = p / "tokenizer.json"
    if p.suffix.lower() == ".gguf":
        from flashscale.models import gguf  # lazy: the GGUF reader pulls in the model code

        if hasattr(gguf, "load_gguf_tokenizer"):  # metadata only: no tensor is read or dequantized
            return gguf.load_gguf_tokenizer(p)
        return gguf.load_gguf(p)[1]
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise ValueError(f"tokenizer file {str(p)!r} is not a valid tokenizer.json: {e}") from None


def eos_token_id(tokenizer: Tokenizer) -> int:
    """The id of the tokenizer's end-of-text token (the first of EOS_CANDIDATES it holds)."""
    for name in EOS_CANDIDATES:
        i = tokenizer.token_to_id(name)
        if i is not None:
            return i
    raise ValueError(f"tokenizer: holds none of the end-of-text tokens {EOS_CANDIDATES}; pass eos_id")
