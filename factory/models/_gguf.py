"""Read the key-value metadata of a GGUF file without loading the model.

Enough of the GGUF format (v2/v3, little-endian) to check a file before
handing it to an engine: the magic, the header counts and the typed
key-value pairs. Arrays are skipped over, not decoded.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from factory.errors import ModelConfigError

__all__ = ["read_gguf_metadata"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(handle: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise EOFError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _string(handle: BinaryIO) -> str:
    length = _read(handle, "<Q")
    data = handle.read(length)
    if len(data) != length:
        raise EOFError("truncated GGUF string")
    return data.decode("utf-8", errors="replace")


def _value(handle: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(handle, _SCALARS[kind])
    if kind == _STRING:
        return _string(handle)
    if kind == _ARRAY:
        item_kind, count = _read(handle, "<I"), _read(handle, "<Q")
        if item_kind in _SCALARS:
            handle.seek(struct.calcsize(_SCALARS[item_kind]) * count, 1)
        else:
            for _ in range(count):
                _value(handle, item_kind)
        return None  # arrays (vocabularies) are skipped
    raise ValueError(f"unknown GGUF value type {kind}")


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """Scalar and string metadata of a GGUF file (arrays map to None).

    Raises:
        ModelConfigError: If the file is not a readable GGUF.
    """
    try:
        with open(path, "rb") as handle:
            if handle.read(4) != b"GGUF":
                raise ModelConfigError(f"{path} is not a GGUF file (bad magic)")
            version = _read(handle, "<I")
            if version < 2:
                raise ModelConfigError(f"{path}: GGUF version {version} is not supported")
            _read(handle, "<Q")  # tensor count
            metadata = {}
            for _ in range(_read(handle, "<Q")):
                key = _string(handle)
                metadata[key] = _value(handle, _read(handle, "<I"))
            return metadata
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (EOFError, ValueError, struct.error) as exc:
        raise ModelConfigError(f"{path} is not a valid GGUF file: {exc}") from exc
