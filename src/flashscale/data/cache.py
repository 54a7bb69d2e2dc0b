"""Where derived data (trained tokenizers, token files) is cached, and atomic writes into it.

Everything cached is keyed by a content hash of its inputs, so a stale entry is never read back: a
changed input is a different key. Writes go to a temporary sibling and are renamed into place, so a
killed process leaves either nothing or a complete entry, never a truncated one that a later run
would trust.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ENV_VAR = "FLASHSCALE_CACHE"


def default_cache_dir() -> Path:
    """$FLASHSCALE_CACHE, else ~/.cache/flashscale (read when called, never at import)."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "flashscale"


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir: takes a path or None, got {type(cache_dir).__name__}")
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write text to path through a temporary file in the same folder and os.replace (atomic on POSIX). The file
    keeps the mode of the one it replaces, else gets 0o644 (mkstemp's own 0o600 would hide results from others)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def publish_dir(tmp_dir: Path, final_dir: Path) -> Path:
    """Rename a fully written temporary folder to its final name. When another process (another rank
    preparing the same data) got there first, its entry is as good as ours (same key, same content):
    keep it and drop ours."""
    try:
        os.rename(tmp_dir, final_dir)
    except OSError:
        if not final_dir.is_dir():
            raise
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir
