"""What the bench scripts share: the results table every benchmark prints at its end, and machine load."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RESULTS", "Row", "cpu_busy_seconds", "loadavg", "print_table", "record", "verdict"]


@dataclass
class Row:
    """One line of the final table."""

    bench: str
    metric: str
    value: str
    baseline: str
    ratio: str
    goal: str
    ok: bool | None


RESULTS: list[Row] = []


def record(bench: str, metric: str, value: str, baseline: str = "", ratio: str = "", goal: str = "",
           ok: bool | None = None) -> None:
    """Add a row to the table."""
    RESULTS.append(Row(bench, metric, value, baseline, ratio, goal, ok))


def verdict(ok: bool) -> str:
    """How a goal reads in the table."""
    return "MET" if ok else "MISSED"


def print_table() -> None:
    """Print the rows recorded so far as an aligned table."""
    if not RESULTS:
        return
    headers = ("bench", "metric", "value", "baseline", "ratio", "goal", "status")
    cells = [(r.bench, r.metric, r.value, r.baseline, r.ratio, r.goal,
              "" if r.ok is None else verdict(r.ok)) for r in RESULTS]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()

    print("\nresults")
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for c in cells:
        print(line(c))


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, or ``?`` where the system has none."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def cpu_busy_seconds() -> float | None:
    """CPU-seconds every process on the machine has used since boot (``/proc/stat``), None where unreadable."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
