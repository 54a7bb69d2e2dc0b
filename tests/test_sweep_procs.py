"""benchmarks/sweep_procs.py, the config sweeps' worker plumbing (no GPU): a worker's JSON events reach on_event in
order (its other stdout lines are ignored, its stderr kept as a tail), a silent worker is handed to on_stall and
killed, a deadline kills what is left and says so."""

import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sweep_procs import Proc, pump  # noqa: E402

WORKER = textwrap.dedent(f"""
    import json, sys, time
    sys.path.insert(0, {str(ROOT / "benchmarks")!r})
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    mode, payload = args["--worker"], json.loads(args["--payload"])
    from sweep_procs import emit
    print("not json", flush=True)
    print("a warning", file=sys.stderr, flush=True)
    for i in payload:
        emit(event="row", i=i, tol=float(args["--tol"]), rep=int(args["--rep"]))
    if mode == "hang":
        time.sleep(60)
    emit(event="done")
""")
ARGS = SimpleNamespace(tol=0.02, warmup=5, rep=20)


def _worker(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return script


def test_events_in_order_and_stderr_tail(tmp_path):
    script, seen = _worker(tmp_path), []
    procs = [Proc(script, "ok", [1, 2, 3], ARGS), Proc(script, "ok", [4], ARGS)]
    assert pump(procs, time.time() + 60, lambda pr, ev: seen.append((procs.index(pr), ev)))
    for n, want in ((0, [1, 2, 3]), (1, [4])):
        evs = [ev for i, ev in seen if i == n]
        assert [ev.get("i") for ev in evs] == want + [None] and evs[-1] == {"event": "done"}
        assert all(ev["tol"] == 0.02 and ev["rep"] == 20 for ev in evs[:-1])
        assert procs[n].stderr_tail == ["a warning"] and procs[n].p.returncode == 0


def test_a_silent_worker_is_handed_to_on_stall(tmp_path):
    script, seen, stalled = _worker(tmp_path), [], []

    def on_stall(pr):
        stalled.append(pr)
        pr.kill()

    pr = Proc(script, "hang", [7], ARGS)
    t0 = time.time()
    assert pump([pr], t0 + 60, lambda p, ev: seen.append(ev), stall=1.5, on_stall=on_stall)
    assert stalled == [pr] and [ev["i"] for ev in seen] == [7] and pr.p.poll() is not None
    assert time.time() - t0 < 30


def test_the_deadline_kills_the_rest(tmp_path):
    script, seen = _worker(tmp_path), []
    pr = Proc(script, "hang", [], ARGS)
    t0 = time.time()
    assert not pump([pr], t0 + 2, lambda p, ev: seen.append(ev))
    assert pr.p.poll() is not None and time.time() - t0 < 30
