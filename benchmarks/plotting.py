"""Shared glue of the benchmark scripts' results: the GPU's tag in a results file's name, matplotlib when it is
installed, and the `--plot RESULTS.json` entry that renders a results file's png again without rerunning its
measurement."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path


def gpu_tag(name: str) -> str:
    """The GPU's part of a results file's name (NAME-<gpu>.json): "h200" / "h100" / "a100" for those cards (whatever
    the driver appends: "NVIDIA H100 80GB HBM3" -> h100), else the device name as a lower-case slug."""
    for tag in ("H200", "H100", "A100"):
        if tag in name:
            return tag.lower()
    return re.sub(r"^nvidia-", "", re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")) or "gpu"


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is missing (the JSON is what counts)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_only(argv: list[str], plot: Callable[[dict, Path], None]) -> bool:
    """`--plot results/NAME.json`: write NAME.png beside it with plot(doc, path); True when that was the call."""
    if len(argv) == 2 and argv[0] == "--plot":
        src = Path(argv[1])
        plot(json.loads(src.read_text()), src.with_suffix(".png"))
        return True
    return False


if __name__ == "__main__":
    sys.exit("a helper module of the benchmark scripts")
