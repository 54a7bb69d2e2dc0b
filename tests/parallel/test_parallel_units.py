"""Single-process tests of flashscale.parallel: layout validation, the pipeline split and schedules,
the vocab-parallel loss at tp = 1, and the engine at world size 1 (the same code path as any layout)
against the trainer's SingleDeviceEngine, its checkpoints and HF export/import."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _parallel_harness as H  # noqa: E402

from flashscale.errors import UserError  # noqa: E402
from flashscale.models.llama import Llama  # noqa: E402
from flashscale.parallel.checkpoint import MARKER, ShardedReader  # noqa: E402
from flashscale.parallel.config import ParallelConfig  # noqa: E402
from flashscale.parallel.engine import ParallelEngine  # noqa: E402
from flashscale.parallel.loss import vocab_parallel_cross_entropy  # noqa: E402
from flashscale.parallel.mesh import ParallelMesh, validate_layout  # noqa: E402
from flashscale.parallel.pipeline import (Action, build_plan, partition_layers, schedule_orders,  # noqa: E402
                                          simulate)
from flashscale.train.engine import OptimConfig  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread, as each worker process uses: on a shared 2-core machine the default
    oversubscribes and a tiny step takes 15-30x longer (measured 2026-11)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------ layout checks

@pytest.mark.parametrize("kw, world, match", [
    (dict(tp=2, pp=2), 6, "not divisible by tp \\* pp"),
    (dict(dp=2, tp=2), 8, "world size 8 != pp \\* dp \\* tp"),
    (dict(tp=8), 8, "num_attention_heads=4 is not divisible by tp=8"),
    (dict(tp=4), 4, "intermediate_size=66 is not divisible by tp=4"),
    (dict(pp=4, virtual_stages=2, schedule="interleaved"), 4, "8 pipeline chunks but the model has only 5"),
    (dict(pp=2, stage_layers=[2, 2]), 2, "sums to 4"),
])
def test_impossible_layouts_fail_before_any_collective(kw, world, match):
    cfg = H.model_config("gqa")
    if "intermediate" in match:
        cfg.intermediate_size = 66
    with pytest.raises(ValueError, match=match):
        validate_layout(ParallelConfig(**kw), world, cfg)


def test_kv_heads_split_or_replicated():
    cfg = H.model_config("gqa")  # 4 heads, 2 kv heads
    assert validate_layout(ParallelConfig(tp=2), 2, cfg) == (1, 1, 2)  # split
    assert validate_layout(ParallelConfig(tp=4), 4, cfg) == (1, 1, 4)  # replicated twice
    cfg3 = H.model_config("gqa")
    cfg3.num_attention_heads, cfg3.num_key_value_heads, cfg3.hidden_size = 6, 3, 36
    with pytest.raises(ValueError, match="num_key_value_heads=3 and tp=2"):
        validate_layout(ParallelConfig(tp=2), 2, cfg3)


@pytest.mark.parametrize("kw, match", [
    (dict(zero=4), "zero must be 0, 1, 2 or 3"),
    (dict(schedule="zb"), "schedule must be one of"),
    (dict(virtual_stages=2), "needs schedule='interleaved'"),
    (dict(tp=0), "tp must be a positive int"),
    (dict(activation_checkpointing="some"), "activation_checkpointing must be one of"),
    (dict(pp=2, stage_layers=[3]), "pp \\* virtual_stages = 2"),
])
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kw)


# ------------------------------------------------------------------------------- pipeline: split

def test_partition_counts_embedding_and_head():
    cfg = H.model_config("gqa")  # 5 layers; embedding and head each cost ~0.5 layer here
    parts = partition_layers(cfg, 2)
    assert [len(p) for p in parts] == [3, 2] and sum(parts, []) == list(range(5))
    big_vocab = H.model_config("gqa")
    big_vocab.vocab_size = 4000  # embedding and head outweigh 10 layers each: the ends keep one layer
    assert [len(p) for p in partition_layers(big_vocab, 3)] == [1, 3, 1]
    assert [len(p) for p in partition_layers(cfg, 5)] == [1] * 5
    with pytest.raises(ValueError, match="6 pipeline chunks for 5 layers"):
        partition_layers(cfg, 6)


# --------------------------------------------------------------------------- pipeline: schedules

def _check_plan(orders, plan, num_chunks, m):
    for r, steps in enumerate(plan):  # every action once, on its rank, in the rank's order
        assert [s.action for s in steps if s.action is not None] == orders[r]
        assert all(s.action.chunk % len(plan) == r for s in steps if s.action is not None)
    assert {a for o in orders for a in o} == {Action(k, c, i) for k in "FB" for c in range(num_chunks)
                                             for i in range(m)}
    sends = sorted((k, dst) for r, steps in enumerate(plan) for s in steps for k, dst in s.sends)
    recvs = sorted((k, r) for r, steps in enumerate(plan) for s in steps for k, src in s.recvs)
    assert sends == recvs  # every message is received by the rank it is sent to
    ticks = simulate(orders, num_chunks)
    for a, t in ticks.items():  # producers strictly before consumers
        if a.kind == "F" and a.chunk > 0:
            assert ticks[Action("F", a.chunk - 1, a.mb)] < t
        if a.kind == "B":
            assert ticks[Action("F", a.chunk, a.mb)] < t
            if a.chunk < num_chunks - 1:
                assert ticks[Action("B", a.chunk + 1, a.mb)] < t


@pytest.mark.parametrize("schedule, pp, v, m", [("gpipe", 2, 1, 3), ("1f1b", 4, 1, 6), ("1f1b", 3, 1, 2),
                                                 ("interleaved", 2, 2, 4), ("interleaved", 4, 2, 8),
                                                 ("interleaved", 2, 3, 2), ("1f1b", 1, 1, 3),
                                                 ("interleaved", 1, 2, 3)])
def test_schedule_plans_are_complete_and_deadlock_free(schedule, pp, v, m):
    orders = schedule_orders(schedule, pp, v, m)
    _check_plan(orders, build_plan(orders, pp * v), pp * v, m)


def test_1f1b_bounds_live_activations_and_interleaving_shrinks_the_bubble():
    pp, m = 4, 8
    for r, order in enumerate(schedule_orders("1f1b", pp, 1, m)):
        live = peak = 0
        for a in order:
            live += 1 if a.kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(pp - r, m)  # warm-up forwards + 1; GPipe keeps all m
    # On the unit-time clock: 1F1B idles 2(p-1) stage-slots; interleaving (chunks of half a stage,
    # half a slot each) idles about half as much: (p-1)/(v*m) of the ideal instead of (p-1)/m.
    plain = max(simulate(schedule_orders("1f1b", pp, 1, m), pp).values()) + 1
    inter = (max(simulate(schedule_orders("interleaved", pp, 2, m), 2 * pp).values()) + 1) / 2
    assert plain - 2 * m == 2 * (pp - 1)
    assert inter - 2 * m <= (pp - 1) + 0.5
    with pytest.raises(ValueError, match="divisible by pp"):
        schedule_orders("interleaved", 4, 2, 6)


# --------------------------------------------------------------------------------- loss at tp = 1

def test_vocab_parallel_cross_entropy_with_padding_equals_cross_entropy():
    """tp = 1 with padded columns takes the vocab-parallel Function (three reductions, no-ops here);
    without padding it is F.cross_entropy itself."""
    mesh = ParallelMesh(ParallelConfig())
    logits = torch.randn(2, 5, 11)
    padded = torch.cat([logits, torch.full((2, 5, 3), 50.0)], dim=-1).requires_grad_()  # 3 padding columns
    tgt = torch.randint(0, 11, (2, 5))
    tgt[1, 2] = -100
    ours = vocab_parallel_cross_entropy(padded, tgt, vocab_start=0, vocab_stop=11, axis=mesh.tp)
    ours.backward()
    ref_logits = logits.clone().requires_grad_()
    ref = F.cross_entropy(ref_logits.view(-1, 11), tgt.view(-1), ignore_index=-100)
    ref.backward()
    assert abs(ours.item() - ref.item()) <= 1e-6 * ref.item()
    torch.testing.assert_close(padded.grad[..., :11], ref_logits.grad, rtol=1e-6, atol=1e-8)
    assert torch.equal(padded.grad[..., 11:], torch.zeros(2, 5, 3))
    per_token = vocab_parallel_cross_entropy(padded, tgt, vocab_start=0, vocab_stop=11, axis=mesh.tp,
                                             reduction="none")
    assert per_token.shape == (2, 5) and per_token[1, 2] == 0


# ------------------------------------------------------------------------- engine at world size 1

def _engine(model_name, **kw):
    cfg = H.model_config(model_name)
    pc = ParallelConfig(**kw)
    return ParallelEngine(cfg, pc, OptimConfig(), model=Llama(cfg).init_weights(H.SEED), mesh=ParallelMesh(pc, cfg))


def _train(eng, steps, start=0, total=None):
    total = total or steps
    data = H.batches(eng.model_config, total)
    out = []
    for s in range(start, start + steps):
        o = eng.train_step(*data[s], lr=H.lr_at(s, total), micro_batches=2, max_grad_norm=1.0)
        out.append((float(o["loss"]), float(o["grad_norm"])))
    return out


def _weights(eng):
    from flashscale.parallel.checkpoint import rank_pieces

    return H.assemble_weights([dict(zip(("records", "tensors"), rank_pieces(eng.zero_data)))])


@pytest.mark.parametrize("kw", [dict(zero=0, schedule="gpipe"), dict(zero=1, activation_checkpointing="full"),
                                dict(zero=2, activation_checkpointing="attention", checkpoint_layers=[1, 3]),
                                dict(zero=3, schedule="interleaved", virtual_stages=2),
                                dict(zero=1, schedule="interleaved", virtual_stages=2, stage_layers=[4, 1])])
def test_world_size_1_equals_single_device_engine(kw):
    steps = 6
    model = "mqa_tied" if kw["zero"] % 2 else "gqa"
    ref = H.reference_run(model, steps, max_grad_norm=1.0)
    eng = _engine(model, **kw)
    got = _train(eng, steps)
    H.compare_run(str(kw), [a for a, _ in got], [b for _, b in got], _weights(eng), ref)


def test_checkpoint_roundtrip_resume_and_hf_export(tmp_path):
    steps = 6
    ref = H.reference_run("mqa_tied", steps, max_grad_norm=1.0)
    eng = _engine("mqa_tied", zero=2)
    first = _train(eng, 3, total=steps)
    eng.save(tmp_path / "ck")
    meta = json.loads((tmp_path / "ck" / "meta.json").read_text())
    assert meta["step"] == 3 and meta["layout"]["zero"] == 2 and (tmp_path / "ck" / MARKER).is_file()
    eng2 = _engine("mqa_tied", zero=0, schedule="gpipe")  # another layout: resharded on load
    eng2.load(tmp_path / "ck")
    rest = _train(eng2, 3, start=3, total=steps)
    got = first + rest
    H.compare_run("resume", [a for a, _ in got], [b for _, b in got], _weights(eng2), ref)
    # same-layout state_dict round trip
    eng3 = _engine("mqa_tied", zero=0, schedule="gpipe")
    sd = eng2.state_dict()
    eng3.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(eng3.model.parameters(), eng2.model.parameters()))
    assert eng3.optimizer_step() == eng2.optimizer_step() == steps
    with pytest.raises(ValueError, match="cannot load into"):
        eng.load_state_dict(eng2.state_dict())
    # HF export -> load_hf -> import into a parallel engine
    from flashscale.models.checkpoint import load_hf

    eng2.export_hf(tmp_path / "hf")
    hf = load_hf(tmp_path / "hf")
    for n, p in hf.named_parameters():
        assert torch.equal(p.detach(), ref[2][n]) or H.rel(p.detach(), ref[2][n]) < 1e-5, n
    x = H.batches(eng2.model_config, 1)[0][0]
    with torch.no_grad():
        torch.testing.assert_close(eng2.model(x), hf(x), rtol=1e-5, atol=1e-6)
    imported = ParallelEngine(hf.config, ParallelConfig(zero=3), OptimConfig(), model=load_hf(tmp_path / "hf"),
                              mesh=ParallelMesh(ParallelConfig(zero=3), hf.config))
    for n, t in _weights(imported).items():
        assert torch.equal(t, dict(hf.named_parameters())[n].detach()), n
    # AdamW moments came back with the state dict: the next step of the copy equals the original's
    x, y = H.batches(eng2.model_config, 1, seed=5)[0]
    a = eng2.train_step(x, y, lr=1e-3, micro_batches=1, max_grad_norm=1.0)
    b = eng3.train_step(x, y, lr=1e-3, micro_batches=1, max_grad_norm=1.0)
    assert float(a["loss"]) == float(b["loss"]) and float(a["grad_norm"]) == float(b["grad_norm"])
    assert all(torch.equal(p, q) for p, q in zip(eng3.model.parameters(), eng2.model.parameters()))


def test_incomplete_checkpoint_is_refused(tmp_path):
    eng = _engine("gqa", zero=1)
    eng.save(tmp_path / "ck")
    (tmp_path / "ck" / MARKER).unlink()  # as if the save had crashed before its last write
    with pytest.raises(UserError, match="incomplete"):
        ShardedReader(tmp_path / "ck")
    eng.save(tmp_path / "ck")  # saving again over it completes it
    ShardedReader(tmp_path / "ck")
    other = _engine("mqa_tied", zero=1)
    with pytest.raises(UserError, match="another model"):
        other.load(tmp_path / "ck")


def test_train_step_validates_its_inputs():
    eng = _engine("gqa", zero=1)
    x = torch.zeros(4, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="micro_batches=3"):
        eng.train_step(x, x, lr=1e-3, micro_batches=3, max_grad_norm=None)
    with pytest.raises(ValueError, match="one shape"):
        eng.train_step(x, x[:, :4], lr=1e-3, micro_batches=1, max_grad_norm=None)
    with pytest.raises(ValueError, match="max_grad_norm"):
        eng.train_step(x, x, lr=1e-3, micro_batches=1, max_grad_norm=0.0)


@pytest.mark.parametrize("zero", [1, 3])
def test_dropped_engine_frees_its_buffers(zero):
    """Gradient hooks live in autograd's C++ side, out of the garbage collector's sight: a hook holding
    the engine's units strongly kept every dropped engine's parameters and optimizer states alive (seen
    on the H200: +22 GB per 1B engine built in one process)."""
    import gc
    import weakref

    eng = _engine("gqa", zero=zero)
    _train(eng, 1)
    refs = [weakref.ref(eng.zero_data), weakref.ref(next(eng.model.parameters()))]
    del eng
    gc.collect()
    assert [r() for r in refs] == [None, None]
