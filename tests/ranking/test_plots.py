"""The PNG plots: drawn with matplotlib when the 'plot' extra is there, a clean error when it is not."""

from __future__ import annotations

import sys

import pytest

from factory.errors import ConfigError
from factory.ranking import plot_pass_rates, plot_strengths

PNG = b"\x89PNG\r\n\x1a\n"
ROWS = [
    {"task_id": "t1", "branch_index": 0, "rank": 1, "strength": 0.8, "ci_low": 0.2, "ci_high": 1.4,
     "objective_pass": True},
    {"task_id": "t1", "branch_index": 1, "rank": 2, "strength": -0.8, "ci_low": -1.4, "ci_high": -0.2,
     "objective_pass": False},
    {"task_id": "t2", "branch_index": 0, "rank": 1, "strength": None, "ci_low": None, "ci_high": None,
     "objective_pass": None},
]
ARMS = [{"label": "A", "k": 9, "n": 10, "rate": 0.9, "low": 0.6, "high": 0.98},
        {"label": "B", "k": 2, "n": 10, "rate": 0.2, "low": 0.06, "high": 0.5}]


@pytest.mark.parametrize("draw", [
    lambda path: plot_strengths(ROWS, path, "strengths"),
    lambda path: plot_pass_rates(ARMS, path, "pass rates", "powered and significant"),
], ids=["strengths", "pass-rates"])
def test_without_matplotlib_plotting_says_which_extra_to_install(monkeypatch, tmp_path, draw):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'factory-rlaif\[plot\]'"):
        draw(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_strength_plot_is_a_png_and_grows_with_the_rows(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the 'plot' extra)")
    small = plot_strengths(ROWS[:1], tmp_path / "one.png", "one branch")
    large = plot_strengths(ROWS * 10, tmp_path / "many.png", "thirty branches")
    assert small == tmp_path / "one.png" and small.read_bytes()[:8] == PNG
    assert large.read_bytes()[:8] == PNG

    from PIL import Image  # matplotlib depends on pillow

    assert Image.open(large).height > Image.open(small).height


def test_strength_plot_of_no_rows_still_writes_a_file(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the 'plot' extra)")
    assert plot_strengths([], tmp_path / "empty.png", "nothing ranked").read_bytes()[:8] == PNG


def test_pass_rate_plot_is_a_png_with_one_bar_per_arm(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the 'plot' extra)")
    one = plot_pass_rates(ARMS[:1], tmp_path / "one.png", "one arm")
    two = plot_pass_rates(ARMS, tmp_path / "two.png", "two arms", "a subtitle long enough to wrap " * 5)
    assert one.read_bytes()[:8] == PNG and two.read_bytes()[:8] == PNG

    from PIL import Image

    assert Image.open(two).height > Image.open(one).height
