"""Streaming exports: rows built slice by slice (whole tasks) and the pieces that span slices.

A format streams by yielding one :class:`~factory.export.ExportRows` per
slice of the source (:meth:`~factory.export.ExportSource.batches`); the
exporter writes each as it comes and lets it go, so what an export holds at
once is one slice and the rows built from it, whatever the size of the store.
Everything a format does per task (pairs, winners, a task's first branch) is
the same on a slice of whole tasks as on the whole frame, in the same order,
so the streamed file is the whole-frame file byte for byte.

What spans slices is kept light: the length-bias sums, a 64-bit hash per kept
row for ``--dedupe``, and for ``--top-confidence`` / ``--length-balance``
(which rank every pair against every other) a first pass that keeps each
pair's margin and two lengths (about 28 bytes a pair) to decide which survive.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

__all__ = ["Deduper", "ExportStream", "LengthBias", "regrouped"]


@dataclass
class ExportStream:
    """A format's rows as they are built: chunks, and the facts known once they are all out.

    Attributes:
        chunks: The rows, one :class:`~factory.export.ExportRows` per slice (``rows`` and ``extra``; all
            chunks have the same columns). Iterating may raise ``ExportError`` (nothing to export) at the end.
        stats: Filled in as the chunks go out; complete once they are exhausted (see ``ExportRows.stats``).
        manifest: The manifest fields the format sets itself (see ``ExportRows.manifest``).
    """

    chunks: Iterable[Any]
    stats: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


class LengthBias:
    """:func:`~factory.export._formats.length_bias` summed over slices of pairs: the same figures."""

    def __init__(self) -> None:
        self.pairs = self.longer = self.shorter = self.ratios = 0
        self.ratio_sum = 0.0

    def add(self, pairs: pl.DataFrame) -> None:
        if pairs.is_empty():
            return
        chosen, rejected = pl.col("chosen_completion_chars"), pl.col("rejected_completion_chars")
        row = pairs.select(
            (chosen > rejected).sum().alias("longer"), (chosen < rejected).sum().alias("shorter"),
            (chosen.cast(pl.Float64) / rejected.cast(pl.Float64)).filter(rejected > 0).sum().alias("ratio"),
            (rejected > 0).sum().alias("ratios"),
        ).row(0, named=True)
        self.pairs += pairs.height
        self.longer += row["longer"]
        self.shorter += row["shorter"]
        self.ratios += row["ratios"]
        self.ratio_sum += row["ratio"] or 0.0

    def result(self) -> dict[str, Any]:
        if not self.pairs:
            return {"pairs": 0, "chosen_longer_share": None, "chosen_shorter_share": None, "mean_length_ratio": None}
        return {"pairs": self.pairs, "chosen_longer_share": round(self.longer / self.pairs, 4),
                "chosen_shorter_share": round(self.shorter / self.pairs, 4),
                "mean_length_ratio": round(self.ratio_sum / self.ratios, 4) if self.ratios else None}


class Deduper:
    """``--dedupe`` across slices: a row whose content repeats an earlier row's (in any slice) is dropped.

    Keeps a 64-bit hash of each kept row's content key (the key
    :func:`~factory.export._formats._dedupe` compares), 8 bytes a row; two
    different contents share a hash with odds of about n²/2⁶⁵ (1 in 10⁶ at
    5 million rows).
    """

    def __init__(self, content: list[str]):
        self.content = content
        self.seen = pl.Series("_key", [], dtype=pl.UInt64)
        self.removed = 0

    def __call__(self, rows: pl.DataFrame) -> pl.DataFrame:
        if rows.is_empty():
            return rows
        key = pl.concat_str([pl.col(c).map_elements(
            lambda v: json.dumps(v.to_list() if isinstance(v, pl.Series) else v, sort_keys=True),
            return_dtype=pl.String) for c in self.content], separator="\x1f").hash(seed=0)
        before = rows.height
        rows = (rows.with_columns(key.alias("_key")).unique("_key", keep="first", maintain_order=True)
                .filter(~pl.col("_key").is_in(self.seen.implode())))
        self.seen = pl.concat([self.seen, rows["_key"]])
        self.removed += before - rows.height
        return rows.drop("_key")


def numbered(batches: Iterable[pl.DataFrame], build: Callable[[pl.DataFrame], pl.DataFrame],
             column: str = "_pair") -> Iterator[pl.DataFrame]:
    """``build(batch)`` for each batch, its rows numbered on from the previous batch's (``column``, UInt64)."""
    offset = 0
    for batch in batches:
        built = build(batch)
        yield built.with_columns((pl.int_range(pl.len(), dtype=pl.UInt64) + offset).alias(column))
        offset += built.height


def regrouped(frames: Iterable[pl.DataFrame], key: str) -> Iterator[pl.DataFrame]:
    """The rows of ``frames`` grouped by ``key`` (smallest first), each group in arrival order; ``key`` dropped.

    One pass over ``frames``: each frame's rows go to a temporary Arrow IPC
    file per key value (in the system's temporary folder, removed at the
    end), read back batch by batch, so what is held at once is one frame.
    Arrow IPC keeps every type exactly: the rows come back as they went in.
    """
    import pyarrow as pa

    with tempfile.TemporaryDirectory(prefix="factory-export-") as folder:
        paths: dict[Any, Path] = {}
        writers: list[tuple[Any, Any]] = []
        by_value: dict[Any, Any] = {}
        schema = None
        try:
            for frame in frames:
                for (value,), part in frame.partition_by(key, as_dict=True, maintain_order=True).items():
                    table = part.drop(key).to_arrow()
                    schema = schema or table.schema
                    if value not in by_value:
                        paths[value] = Path(folder) / f"{len(paths)}.arrows"
                        sink = pa.OSFile(str(paths[value]), "wb")
                        by_value[value] = pa.ipc.new_stream(sink, schema)
                        writers.append((by_value[value], sink))
                    by_value[value].write_table(table.cast(schema) if table.schema != schema else table)
        finally:
            for writer, sink in writers:
                writer.close()
                sink.close()
        for value in sorted(paths):
            with pa.OSFile(str(paths[value]), "rb") as source:
                for batch in pa.ipc.open_stream(source):
                    yield pl.from_arrow(batch)
