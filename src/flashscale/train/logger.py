"""Where a run's metrics go: the console (a rich progress bar and one line a log step), a JSONL file
and TensorBoard. Only the main rank logs.

Resuming rewinds the logs to the checkpoint: JSONL records after its step are dropped (they belong to
the killed run's lost future and would be written again), and TensorBoard purges its events after it,
so a killed-and-resumed run's logs read like an uninterrupted one's.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from flashscale.train.metrics import fmt_bytes, fmt_mfu


class RunLogger:
    def __init__(self, out_dir: Path | None, *, jsonl: bool, tensorboard: bool, total_steps: int,
                 start_step: int = 0, progress: bool = True, console: Console | None = None,
                 enabled: bool = True, quiet: bool = False):
        """enabled: this process logs at all (the main rank); quiet: nothing to the console (files still)."""
        self.enabled = enabled
        self.quiet = quiet
        self.console = console or Console(stderr=False, quiet=quiet)
        self.jsonl_path = out_dir / "log.jsonl" if (enabled and jsonl and out_dir is not None) else None
        self.tb = None
        if enabled and self.jsonl_path is not None:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            rewind_jsonl(self.jsonl_path, start_step)
        if enabled and tensorboard and out_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                self.console.print("[dim]tensorboard is not installed: TensorBoard logging skipped "
                                   "(pip install tensorboard)[/dim]")
            else:
                self.tb = SummaryWriter(str(out_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, disable=not (enabled and progress and not quiet), transient=False)
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, status="")

    def __enter__(self) -> "RunLogger":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.progress.stop()
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def advance(self, step: int, total: int | None = None) -> None:
        self.progress.update(self.task, completed=step, total=total)

    def note(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text, soft_wrap=True)

    def log(self, record: dict[str, Any]) -> None:
        """A train record (loss, lr, grad_norm, tokens_per_s, mfu, peak_mem) or an eval record (val_loss,
        val_ppl), keyed by "step"."""
        if not self.enabled:
            return
        step = record["step"]
        if self.jsonl_path is not None:
            with open(self.jsonl_path, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())  # the log is the run's record: it must survive a kill like the checkpoints
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(("val/" if k.startswith("val_") else "train/") + k, v, step)
            self.tb.flush()
        if "loss" in record:
            status = (f"loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                      f"{record['tokens_per_s']:,.0f} tok/s  MFU {fmt_mfu(record['mfu'])}")
            self.progress.update(self.task, status=status)
            self.progress.console.print(
                f"step {step:>6}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                f"gnorm {record['grad_norm']:.3f}  {record['tokens_per_s']:,.0f} tok/s  "
                f"MFU {fmt_mfu(record['mfu'])}  mem {fmt_bytes(record['peak_mem'])}",
                soft_wrap=True)
        if "val_loss" in record:
            self.progress.console.print(f"step {step:>6}  [bold]val loss {record['val_loss']:.4f}  "
                                        f"val ppl {record['val_ppl']:.2f}[/bold]", soft_wrap=True)


def rewind_jsonl(path: Path, step: int) -> None:
    """Keep only the records of steps <= `step` (all of them dropped when step is 0), atomically."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line the kill cut short
            continue
        if isinstance(rec, dict) and rec.get("step", math.inf) <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
