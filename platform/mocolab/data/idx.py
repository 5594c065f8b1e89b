"""The IDX format (Fashion-MNIST's files), parsed with numpy alone."""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

__all__ = ["read_idx"]


# IDX type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Parse an IDX file (gzip-compressed or raw) into a numpy array.

    Parsed here rather than through torchvision so that Fashion-MNIST loads
    from the Debian package's ``.gz`` files with no download machinery and no
    extracted copies on disk. Compression is recognised by content, not by the
    file name. A corrupt or truncated file raises ValueError naming it.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read IDX file {path}: {exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(
                f"corrupt IDX file {path}: gzip data is damaged ({exc}); "
                "re-download it or reinstall `dataset-fashion-mnist`"
            ) from exc
    buf = bytearray(raw)  # writable, so torch.from_numpy does not warn
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES or buf[3] == 0:
        magic = buf[:4].hex() if len(buf) >= 4 else buf.hex()
        raise ValueError(
            f"corrupt IDX file {path}: bad magic number 0x{magic} (expected 0x0000TTDD with "
            f"type TT in {sorted(hex(t) for t in _IDX_DTYPES)} and DD >= 1 dimensions); "
            "re-download it or reinstall `dataset-fashion-mnist`"
        )
    dtype = np.dtype(_IDX_DTYPES[buf[2]])
    ndim = buf[3]
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise ValueError(f"corrupt IDX file {path}: truncated header ({len(buf)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(bytes(buf[4:header]), dtype=">u4"))
    expected = math.prod(shape) * dtype.itemsize
    if len(buf) - header != expected:
        raise ValueError(
            f"corrupt IDX file {path}: header declares shape {shape} ({expected} bytes of data) "
            f"but the file holds {len(buf) - header}; re-download it"
        )
    arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(shape)
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("="))
    return arr
