"""Streaming writers: an export file written chunk by chunk, its sha256 taken from the bytes as they go out.

JSONL chunks are Polars' ``write_ndjson`` of each chunk, one line per row,
so the concatenation is the file ``write_ndjson`` makes of the whole frame,
byte for byte. Parquet chunks go to one ``pyarrow.parquet.ParquetWriter``
(zstd, no statistics, as before), one row group or more per chunk, with the
schema of the first chunk (Arrow's large types, which ``datasets`` reads).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

__all__ = ["RowWriter"]

#: Rows per Parquet row group at most (a chunk with more is split; readers scan row groups independently).
ROW_GROUP_ROWS = 65_536


class _HashingFile(io.RawIOBase):
    """A binary file that hashes what is written to it (what ParquetWriter writes through)."""

    def __init__(self, path: Path):
        super().__init__()
        self._file = path.open("wb")
        self.digest = hashlib.sha256()
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self._file.write(view)
        self._position += len(view)
        return len(view)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        if not self.closed:
            super().close()  # flushes first
            self._file.close()


class RowWriter:
    """One export file (``jsonl`` or ``parquet``), written chunk by chunk.

    Attributes:
        rows: Rows written so far.
        columns: The columns (of the first chunk; every chunk must have them).
    """

    def __init__(self, path: Path, kind: str):
        self.path = path
        self.kind = kind
        self.rows = 0
        self.columns: list[str] | None = None
        self._file = _HashingFile(path)
        self._parquet: Any = None  # pyarrow.parquet.ParquetWriter, opened with the first chunk's schema
        self._schema: Any = None

    def write(self, frame: pl.DataFrame) -> None:
        """Append ``frame``'s rows."""
        if self.columns is None:
            self.columns = frame.columns
        elif frame.columns != self.columns:
            raise ValueError(f"{self.path}: a chunk with columns {frame.columns}, not {self.columns}")
        if self.kind == "jsonl":
            if frame.height:
                frame.write_ndjson(self._file)  # straight into the hashing file: no copy of the text held
        else:
            self._write_parquet(frame)
        self.rows += frame.height

    def _write_parquet(self, frame: pl.DataFrame) -> None:
        import polars as pl
        import pyarrow.parquet as pq

        table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
        if self._schema is None:
            self._schema = table.schema
        elif table.schema != self._schema:  # a chunk whose nulls left a column untyped: the first chunk's types
            table = table.cast(self._schema)
        if not frame.height:
            return
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self._file, self._schema, compression="zstd", write_statistics=False)
        self._parquet.write_table(table, row_group_size=ROW_GROUP_ROWS)

    def close(self) -> str:
        """Finish the file; return its sha256 (hex)."""
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            if self._parquet is None and self._schema is not None:  # no rows: a file with the schema only
                self._parquet = pq.ParquetWriter(self._file, self._schema, compression="zstd",
                                                 write_statistics=False)
            if self._parquet is not None:
                self._parquet.close()
        self._file.close()
        return self._file.digest.hexdigest()

    def abort(self) -> None:
        """Close without finishing (the staged file is removed by its owner)."""
        try:
            if self._parquet is not None:
                self._parquet.close()
        except Exception:  # noqa: BLE001 - the file is being thrown away; its first error is the one reported
            pass
        self._file.close()
