"""A fast reader of GGUF files (llama.cpp's format, versions 2 and 3, little-endian).

gguf.GGUFReader builds a numpy memmap view for every element of every metadata array; for SmolLM2's
49k tokens + 49k merges that is ~1.2M views and 5-15 s per open on our CPU machine. This reader parses
the header with `struct` from one buffered read (~0.1 s) and memory-maps only the tensor data. The
`gguf` package still provides what defines the format's numbers: value types, quantization types and
block sizes (GGML_QUANT_SIZES), and dequantization (gguf.quants).

Layout: magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv pairs (string key, u32 type,
value), tensor infos (string name, u32 n_dims, u64 dims innermost first, u32 ggml type, u64 offset),
padding to general.alignment (32 by default), tensor data.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flashscale.errors import UserError

GGUF_MAGIC = b"GGUF"

# GGUFValueType -> struct format of a scalar (8 STRING and 9 ARRAY are handled apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
               11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first), i.e. GGUF's dims reversed
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int


class _Cursor:
    """Sequential little-endian reads from a file, buffered, with one-line errors at the end of data."""

    def __init__(self, f, path: Path, size: int):
        self.f, self.path, self.size = f, path, size

    def read(self, n: int) -> bytes:
        if n > self.size - self.f.tell():  # also guards a corrupt length against a huge allocation
            raise UserError(f"{self.path} is truncated: GGUF header ends early (at byte {self.f.tell()}, "
                            f"{n} more bytes expected)")
        b = self.f.read(n)
        if len(b) != n:
            raise UserError(f"{self.path} is truncated: GGUF header ends early (at byte {self.f.tell()})")
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 30:
            raise UserError(f"{self.path}: corrupt GGUF header (a string of {n} bytes at {self.f.tell()})")
        try:
            return self.read(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{self.path}: invalid UTF-8 in GGUF header ({e})") from None

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.unpack("<I"), self.unpack("<Q")
            if itype in _NP_SCALARS:  # numbers in one read
                dt = np.dtype(_NP_SCALARS[itype])
                return np.frombuffer(self.read(count * dt.itemsize), dtype=dt).tolist()
            if count > 1 << 32:
                raise UserError(f"{self.path}: corrupt GGUF header (an array of {count} items)")
            return [self.value(itype) for _ in range(count)]
        raise UserError(f"{self.path}: corrupt GGUF header (unknown value type {vtype} at {self.f.tell()})")


class GGUFFile:
    """metadata: {key: python value}; tensors: {name: GGUFTensorInfo}; raw(name) / dequantize(name)."""

    def __init__(self, path: str | os.PathLike):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"GGUF file {p} does not exist")
        if p.is_dir():
            raise IsADirectoryError(f"{p} is a directory; expected a .gguf file")
        size = p.stat().st_size
        with open(p, "rb", buffering=1 << 20) as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise UserError(f"{p} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
            c = _Cursor(f, p, size)
            version = c.unpack("<I")
            if version not in (2, 3):
                raise UserError(f"{p}: GGUF version {version} is not supported (2 and 3 are; a big-endian "
                                "file reads as a huge version)")
            n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
            if n_tensors > 1 << 24 or n_kv > 1 << 24:
                raise UserError(f"{p}: corrupt GGUF header ({n_tensors} tensors, {n_kv} metadata keys)")
            self.metadata: dict[str, Any] = {}
            for _ in range(n_kv):
                key = c.string()
                self.metadata[key] = c.value(c.unpack("<I"))
            infos = []
            for _ in range(n_tensors):
                name = c.string()
                n_dims = c.unpack("<I")
                if n_dims > 8:
                    raise UserError(f"{p}: corrupt GGUF header (tensor {name!r} with {n_dims} dims)")
                dims = [c.unpack("<Q") for _ in range(n_dims)]
                infos.append((name, dims, c.unpack("<I"), c.unpack("<Q")))
            header_end = f.tell()
        align = int(self.metadata.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise UserError(f"{p}: general.alignment={align} is not a power of two")
        data_start = -(-header_end // align) * align

        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, dims, gtype, offset in infos:
            try:
                qtype = GGMLQuantizationType(gtype)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise UserError(f"{p}: tensor {name} has unknown ggml type {gtype}") from None
            numel = int(np.prod(dims, dtype=np.int64)) if dims else 1
            if dims and dims[0] % block:
                raise UserError(f"{p}: tensor {name}: row of {dims[0]} not a multiple of the {qtype.name} "
                                f"block ({block})")
            info = GGUFTensorInfo(name, tuple(reversed(dims)), gtype, data_start + offset,
                                  numel // block * type_size)
            if info.offset + info.nbytes > size:
                raise UserError(f"{p} is truncated: tensor {name} needs bytes up to "
                                f"{info.offset + info.nbytes}, the file holds {size}")
            self.tensors[name] = info

    def type_name(self, name: str) -> str:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.tensors[name].ggml_type).name

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 (rows, bytes per row), memory-mapped (read-only)."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
        # A plain ndarray view: slicing a memmap subclass costs a Python call per slice in gguf.quants.
        return np.asarray(data).reshape(rows, info.nbytes // rows)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a writable float32 array of its numpy shape, whatever its ggml type."""
        from gguf import GGMLQuantizationType, quants

        info = self.tensors[name]
        qtype = GGMLQuantizationType(info.ggml_type)
        raw = self.raw(name)
        try:
            if qtype == GGMLQuantizationType.F32:
                arr = raw.view(np.float32)
            elif qtype == GGMLQuantizationType.F16:
                arr = raw.view(np.float16)
            else:
                arr = quants.dequantize(raw, qtype)  # (rows, bytes) -> (rows, row length)
        except (NotImplementedError, AttributeError):
            raise UserError(f"{self.path}: tensor {name} has type {qtype.name}, which the installed gguf "
                            "package cannot dequantize (pip install -U gguf)") from None
        return np.array(arr, dtype=np.float32).reshape(info.shape)  # copies: writable, file released
