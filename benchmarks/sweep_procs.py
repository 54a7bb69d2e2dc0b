"""Worker subprocesses of the config sweeps (attention_fa3_sweep.py, attention_fa3_fp8_sweep.py): the parent never
touches the GPU; it spawns workers that print one JSON event a line, reads them as they come, keeps the clock (a
deadline for all, a stall limit for a silent one: a hung kernel costs its config, not the sweep) and kills what is
left.

    pr = Proc(script, "bench", payload, args)   # runs: python script --worker bench --payload JSON --tol ... --rep ...
    finished = pump([pr], deadline, on_event, stall=60, on_stall=on_stall)
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def emit(**kw) -> None:
    """A worker's event: one JSON line on stdout, flushed at once (the parent reads as it goes)."""
    print(json.dumps(kw), flush=True)


class Proc:
    """A worker subprocess of `script` in its own process group, its stdout read line by line (JSON events); args
    gives --tol, --warmup and --rep. last: when it last printed an event; stderr_tail: its last 40 stderr lines."""

    def __init__(self, script: Path, mode: str, payload, args):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, str(script), "--worker", mode, "--payload", json.dumps(payload),
               "--tol", str(args.tol), "--warmup", str(args.warmup), "--rep", str(args.rep)]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(REPO),
                                  start_new_session=True)
        self.last = time.time()
        self.stderr_tail: list[str] = []
        self.partial = {"out": b"", "err": b""}

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def pump(procs: list[Proc], deadline: float, on_event, stall: float | None = None, on_stall=None) -> bool:
    """Read events from the processes until all exit (True) or the deadline passes (False: the rest are killed).
    on_event(proc, event) for each JSON line of a stdout (other lines are ignored). With `stall`: a process silent
    for that many seconds is handed to on_stall(proc) (which kills it) and no longer read."""
    sel = selectors.DefaultSelector()
    for pr in procs:
        sel.register(pr.p.stdout, selectors.EVENT_READ, (pr, "out"))
        sel.register(pr.p.stderr, selectors.EVENT_READ, (pr, "err"))
    live = {id(pr): 2 for pr in procs}  # open streams per process
    while live:
        if time.time() > deadline:
            for pr in procs:
                pr.kill()
            return False
        for key, _ in sel.select(timeout=1.0):
            pr, kind = key.data
            chunk = os.read(key.fileobj.fileno(), 1 << 16)  # raw reads: no line buffer hides data from select
            if not chunk:
                sel.unregister(key.fileobj)
                live[id(pr)] -= 1
                if not live[id(pr)]:
                    del live[id(pr)]
                continue
            *lines, pr.partial[kind] = (pr.partial[kind] + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").rstrip()
                if kind == "err":
                    pr.stderr_tail = (pr.stderr_tail + [line])[-40:]
                    continue
                pr.last = time.time()
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if id(pr) in live:
                    on_event(pr, ev)
        if stall is not None:
            for pr in procs:
                if id(pr) in live and time.time() - pr.last > stall:
                    on_stall(pr)
                    for f in (pr.p.stdout, pr.p.stderr):
                        try:
                            sel.unregister(f)
                        except (KeyError, ValueError):
                            pass
                    live.pop(id(pr), None)
    for pr in procs:
        pr.p.wait()
    return True
