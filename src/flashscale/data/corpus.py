"""Text corpora: the bundled default corpus and user files (.txt, .jsonl, xz-compressed, or a folder).

The plain-text format is the one the bundled corpus uses (see corpus/README.md): one paragraph a line,
a blank line between documents. A document's text is its paragraphs joined with "\\n\\n", the same
joining the GPTQ/AWQ evaluation protocol applies to the held-out text, so a model trains on exactly
the layout it is evaluated on. A JSONL file holds one document a line, `{"text": "..."}`, taken as is.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
EVAL_NAME = "moby_dick"  # held out: evaluation only (the "WikiText-2 test" analogue)
TEXT_SUFFIXES = (".txt", ".txt.xz", ".jsonl", ".jsonl.xz")
PARAGRAPH_SEP = "\n\n"
DOCUMENT_SEP = "\n\n"

# A blank line (only whitespace on it) ends a document; "\r\n" files read the same as "\n" ones.
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")


def bundled_files() -> dict[str, Path]:
    """name -> path of every bundled corpus file, sorted by name (moby_dick among them: it is
    held out, use `train_files()` for training)."""
    files = {p.name.split(".")[0]: p for p in CORPUS_DIR.glob("*.txt.xz")}
    if not files:  # a broken install, not a user error
        raise FileNotFoundError(f"no bundled corpus files (*.txt.xz) in {CORPUS_DIR}")
    return dict(sorted(files.items()))


def train_files() -> list[Path]:
    """The bundled files for training: all but the held-out evaluation text."""
    return [p for name, p in bundled_files().items() if name != EVAL_NAME]


def text_suffix(path: Path) -> str:
    """The supported suffix path ends with (".txt", ".jsonl.xz", ...), or "" if none."""
    name = path.name.lower()
    for s in TEXT_SUFFIXES:
        if name.endswith(s):
            return s
    return ""


def text_files(path: str | os.PathLike) -> list[Path]:
    """A file, or the supported files in a folder (recursively, sorted, so the order and hence every
    token id position is reproducible)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"text path {str(p)!r} does not exist")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and text_suffix(f))
        if not files:
            raise FileNotFoundError(f"text folder {str(p)!r} holds no {'/'.join(TEXT_SUFFIXES)} files")
        return files
    if not text_suffix(p):
        raise ValueError(f"text file {str(p)!r}: unsupported type; takes {', '.join(TEXT_SUFFIXES)}")
    return [p]


def _read_raw(path: Path) -> str:
    opener = lzma.open if path.name.lower().endswith(".xz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            return f.read()
    except lzma.LZMAError as e:
        raise ValueError(f"text file {str(path)!r} is not a valid xz file: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"text file {str(path)!r} is not UTF-8 text: {e}") from None


def split_documents(text: str) -> list[str]:
    """Plain text in the corpus format -> documents: split on blank lines; inside a document each line
    is a paragraph, joined with "\\n\\n". Trailing whitespace of a line is dropped; empty documents
    are skipped."""
    text = text.replace("\r\n", "\n")
    docs = []
    for block in _BLANK_LINES.split(text):
        paragraphs = [line.rstrip() for line in block.split("\n")]
        paragraphs = [p for p in paragraphs if p.strip()]
        if paragraphs:
            docs.append(PARAGRAPH_SEP.join(paragraphs))
    return docs


def _jsonl_documents(path: Path, raw: str) -> list[str]:
    docs = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{str(path)!r} line {lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{str(path)!r} line {lineno}: takes an object with a string \"text\" field, "
                             f"got {line[:60]!r}")
        if record["text"]:
            docs.append(record["text"])
    return docs


def read_documents(path: str | os.PathLike) -> list[str]:
    """The documents of a file or folder, in order (see the module docstring for the formats)."""
    docs: list[str] = []
    for f in text_files(path):
        raw = _read_raw(f)
        docs.extend(_jsonl_documents(f, raw) if text_suffix(f).startswith(".jsonl") else split_documents(raw))
    return docs


def read_text(path: str | os.PathLike) -> str:
    """The whole text of a file or folder: its documents joined with "\\n\\n" (a corpus-format file
    with one document reads as its paragraphs joined with "\\n\\n", as the evaluation protocol takes)."""
    return DOCUMENT_SEP.join(read_documents(path))


def train_text() -> str:
    """The bundled training texts (all but the held-out one), joined with "\n\n" (calibration text)."""
    return DOCUMENT_SEP.join(read_text(p) for p in train_files())


def eval_text() -> str:
    """The held-out evaluation text: bundled moby_dick, paragraphs joined with "\\n\\n"."""
    return read_text(bundled_files()[EVAL_NAME])


def file_digest(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes (as stored: compressed files hash their compressed bytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
