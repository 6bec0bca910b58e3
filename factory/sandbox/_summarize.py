"""Deterministic summaries of tool output, shared by storage and the model's context.

Training data and inference context must see the same text, so every tool
output passes through :func:`summarize_tool_output` once, and that one
string is both stored and shown to the model.
"""

from __future__ import annotations

__all__ = ["summarize_tool_output"]


def _cap_bytes(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    # The marker's own length depends on the count it reports; two passes settle it.
    omitted = len(data) - max_bytes
    for _ in range(3):
        marker = f"\n[... {omitted} bytes omitted ...]\n"
        budget = max(0, max_bytes - len(marker.encode("utf-8")))
        head_size = budget * 3 // 8
        tail_size = budget - head_size
        omitted = len(data) - head_size - tail_size
    head = data[:head_size].decode("utf-8", errors="ignore")
    tail = data[len(data) - tail_size:].decode("utf-8", errors="ignore") if tail_size else ""
    return head + marker + tail


def summarize_tool_output(
    text: str, max_bytes: int = 800, keep_first_lines: int = 3, keep_last_lines: int = 5
) -> str:
    """Summarize ``text`` to at most ``max_bytes`` UTF-8 bytes, deterministically.

    Output that fits in ``max_bytes`` comes back verbatim. Longer output keeps
    its first ``keep_first_lines`` and last ``keep_last_lines`` lines around a
    ``[... N lines omitted ...]`` marker; if that is still over the budget
    (very long lines), the middle bytes are cut too, behind a
    ``[... N bytes omitted ...]`` marker.

    Args:
        text: The raw output.
        max_bytes: Byte budget of the result.
        keep_first_lines: Lines kept from the start.
        keep_last_lines: Lines kept from the end.

    Returns:
        The summary; never longer than ``max_bytes`` bytes.
    """
    if len(text.encode("utf-8")) <= max_bytes:
        return text
    lines = text.splitlines()
    if len(lines) > keep_first_lines + keep_last_lines:
        omitted = len(lines) - keep_first_lines - keep_last_lines
        tail = lines[len(lines) - keep_last_lines:] if keep_last_lines else []
        lines = [*lines[:keep_first_lines], f"[... {omitted} lines omitted ...]", *tail]
    return _cap_bytes("\n".join(lines), max_bytes)
