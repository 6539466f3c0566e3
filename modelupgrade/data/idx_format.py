"""Reading IDX files (the MNIST family's format), gzipped or raw, with errors that say what broke.

Layout: two zero bytes, a type code, the number of dimensions, one big-endian uint32 per
dimension, then the values in C order (big-endian for multi-byte types).
"""

from __future__ import annotations

import gzip
import threading
import zlib
from pathlib import Path

import numpy as np

from modelupgrade.errors import UserError

_TYPE_CODES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_CACHE: dict[tuple[str, int, int], np.ndarray] = {}
_CACHE_LOCK = threading.Lock()


def _raw_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"IDX file {path} does not exist") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except EOFError:
        raise UserError(
            f"IDX file {path} is truncated: the gzip stream ends early",
            hint="the download or copy was cut off; reinstall or copy the file again",
        ) from None
    except (gzip.BadGzipFile, zlib.error, OSError) as err:
        raise UserError(f"IDX file {path} is corrupt: not a valid gzip stream ({err})") from None


def parse_idx(data: bytes, source: Path | str) -> np.ndarray:
    """Decode the bytes of one IDX file into an array (native byte order)."""
    if len(data) < 4:
        raise UserError(
            f"IDX file {source} is truncated: {len(data)} bytes, shorter than the header"
        )
    if data[0] != 0 or data[1] != 0 or data[2] not in _TYPE_CODES:
        raise UserError(
            f"IDX file {source} has a bad magic number 0x{data[:4].hex()} (expected 0x0000 + a "
            f"type code in {[hex(c) for c in _TYPE_CODES]} + the number of dimensions)",
            hint="this is not an IDX file, or it is corrupt",
        )
    dtype = _TYPE_CODES[data[2]]
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise UserError(f"IDX file {source} is truncated or corrupt: header of {ndim} dimensions")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header
    if actual < expected:
        raise UserError(
            f"IDX file {source} is truncated: the header announces shape {shape} "
            f"({expected} bytes of data) but only {actual} bytes follow",
            hint="the download or copy was cut off; reinstall or copy the file again",
        )
    if actual > expected:
        raise UserError(
            f"IDX file {source} has a size mismatch: shape {shape} needs {expected} bytes of data "
            f"but {actual} bytes follow"
        )
    array = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    return array.astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def read_idx(path: str | Path) -> np.ndarray:
    """Decode an IDX file once per process (cached by path, size and mtime); read-only result."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise UserError(f"IDX file {path} does not exist") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return cached
    array = parse_idx(_raw_bytes(path), path)
    array.flags.writeable = False
    with _CACHE_LOCK:
        _CACHE[key] = array
    return array


def clear_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()
