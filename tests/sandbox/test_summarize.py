"""summarize_tool_output: deterministic head + tail within a byte budget."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from factory.sandbox import summarize_tool_output


def test_short_output_is_verbatim():
    text = "line 1\nline 2\n" * 10
    assert summarize_tool_output(text) == text


def test_long_output_keeps_first_three_and_last_five_lines():
    lines = [f"line {i:03d} " + "x" * 20 for i in range(100)]
    summary = summarize_tool_output("\n".join(lines))
    assert summary.splitlines() == [*lines[:3], "[... 92 lines omitted ...]", *lines[-5:]]


def test_custom_budget_and_line_counts():
    lines = [f"row {i}" for i in range(50)]
    summary = summarize_tool_output("\n".join(lines), max_bytes=100, keep_first_lines=1, keep_last_lines=2)
    assert summary.splitlines() == ["row 0", "[... 47 lines omitted ...]", "row 48", "row 49"]


def test_very_long_lines_are_cut_to_the_byte_cap():
    text = "a" * 5000 + "\n" + "b" * 5000
    summary = summarize_tool_output(text)
    assert len(summary.encode()) <= 800
    assert summary.startswith("aaa") and summary.endswith("bbb")
    assert "bytes omitted" in summary


@given(st.text(max_size=3000), st.integers(min_value=60, max_value=2000))
def test_never_over_budget_and_deterministic(text, budget):
    summary = summarize_tool_output(text, max_bytes=budget)
    assert len(summary.encode("utf-8")) <= budget
    assert summary == summarize_tool_output(text, max_bytes=budget)
    if len(text.encode("utf-8")) <= budget:
        assert summary == text
