"""PNG plots a person would rather look at than read: a strength forest plot and pass rates with intervals.

matplotlib is imported (with the non-interactive Agg backend) only when a
plot is drawn; it comes with the ``plot`` extra. A command checks
:func:`check_plot_file` before its first write, so a missing extra fails it
before it changed anything. A plot is written atomically
(:func:`~factory.outputs.write_output`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.outputs import write_output

__all__ = ["check_plot_file", "plot_pass_rates", "plot_strengths"]

_PASS, _FAIL, _UNKNOWN = "#2e7d32", "#c62828", "#757575"
_MAX_ROWS = 60


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("plots need matplotlib: pip install 'factory-rlaif[plot]'") from exc
    matplotlib.use("Agg", force=True)  # files only; never opens a window
    import matplotlib.pyplot as plt

    return plt


def check_plot_file(path: Path) -> None:
    """Refuse a plot file now, before any work: without matplotlib (the ``plot`` extra), or of a type it cannot write.

    Raises:
        ConfigError: matplotlib is missing, or ``path``'s extension names no image format it writes.
    """
    _pyplot()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    kinds = FigureCanvasAgg.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix and suffix not in kinds:
        raise ConfigError(f"--plot {path}: cannot draw a .{suffix} file; use one of: "
                          f"{', '.join('.' + kind for kind in sorted(kinds))}")


def _save(fig: Any, path: Path, plt: Any) -> None:
    try:
        write_output(path, fig.savefig)
    finally:
        plt.close(fig)


def plot_strengths(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Forest plot: one row per branch (grouped by task), Bradley–Terry strength with its interval.

    The intervals are drawn as given (the ranker's never have zero width: see
    :func:`~factory.ranking.fit_bradley_terry`); a branch without one (the
    only branch of its task) is a point marked "no interval".

    Args:
        rows: Dicts with ``task_id``, ``branch_index``, ``rank``, ``strength``, ``ci_low``, ``ci_high``,
            ``objective_pass``; ranked order within each task.
        path: Where to write the PNG.
        title: Figure title.
    """
    plt = _pyplot()
    shown = list(rows)[:_MAX_ROWS]
    height = 1.2 + 0.28 * max(len(shown), 1)
    fig, ax = plt.subplots(figsize=(8.5, height), dpi=110)
    labels, last_task, band = [], None, False
    for y, row in enumerate(shown):
        if row["task_id"] != last_task:
            band, last_task = not band, row["task_id"]
        if band:
            ax.axhspan(y - 0.5, y + 0.5, color="#f2f2f2", zorder=0)
        color = {True: _PASS, False: _FAIL}.get(row.get("objective_pass"), _UNKNOWN)
        low, high, mid = row.get("ci_low"), row.get("ci_high"), row.get("strength")
        if low is not None and high is not None:
            ax.hlines(y, low, high, color=color, linewidth=2, zorder=2)
        elif mid is not None:
            ax.annotate("no interval (one branch)", (mid, y), xytext=(8, 0), textcoords="offset points",
                        va="center", fontsize=7, color=_UNKNOWN)
        if mid is not None:
            ax.plot(mid, y, "o", color=color, markersize=6, zorder=3)
        labels.append(f"{row['task_id']} · b{row['branch_index']} (#{row['rank']})")
    ax.axvline(0.0, color="#999999", linewidth=0.8, linestyle="--", zorder=1)
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Bradley–Terry strength with 95% interval (log scale, within-task fit; comparable within a "
                  "task only)\nintervals: Fisher (Laplace) of the prior-regularised fit below 50 comparisons per "
                  "branch, else bootstrap widened to it", fontsize=8)
    note = "" if len(rows) <= _MAX_ROWS else f"  (first {_MAX_ROWS} of {len(rows)} branches)"
    ax.set_title(title + note, fontsize=10, loc="left")
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], color=c, marker="o", linewidth=2, label=label) for c, label in
                       ((_PASS, "objective pass"), (_FAIL, "objective fail"), (_UNKNOWN, "not verified"))],
              loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    _save(fig, path, plt)
    return path


def plot_pass_rates(arms: Sequence[dict[str, Any]], path: Path, title: str, subtitle: str = "") -> Path:
    """Pass rate per arm with its Wilson interval, annotated with k/n.

    Args:
        arms: Dicts with ``label``, ``k``, ``n``, ``rate``, ``low``, ``high`` (rates in [0, 1]).
        path: Where to write the PNG.
        title: Figure title.
        subtitle: A second line (e.g. the verdict).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 2.0 + 0.8 * len(arms)), dpi=110)
    for y, arm in enumerate(arms):
        rate, low, high = 100 * arm["rate"], 100 * arm["low"], 100 * arm["high"]
        ax.barh(y, rate, color="#90caf9", height=0.55, zorder=2)
        ax.errorbar(rate, y, xerr=[[rate - low], [high - rate]], fmt="none", ecolor="#0d47a1", capsize=6,
                    linewidth=2, zorder=3)
        ax.text(min(high + 2, 101), y, f"{rate:.1f}%  ({arm['k']}/{arm['n']}, 95% CI {low:.1f}–{high:.1f})",
                va="center", fontsize=9)
    ax.set_yticks(range(len(arms)), [a["label"] for a in arms])
    ax.invert_yaxis()
    ax.set_xlim(0, 140)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("objective pass rate (%) with Wilson interval")
    wrapped = "\n".join(textwrap.wrap(subtitle, 90)) if subtitle else ""
    ax.set_title(title + (f"\n{wrapped}" if wrapped else ""), fontsize=9, loc="left")
    ax.grid(axis="x", color="#e0e0e0", zorder=0)
    fig.tight_layout()
    _save(fig, path, plt)
    return path
