"""The agent's tools. Their names and JSON arguments are a contract: any client can drive them.

``read_file {path}``, ``write_file {path, content}``, ``list_files {path?}``,
``run {command, timeout?}`` (in the sandbox) and ``submit {answer}`` (ends
the branch). A bad call (unknown tool, missing argument, a path outside the
workspace) returns an error text to the model; it never ends the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from factory.errors import SandboxPathError
from factory.models import ToolCall, ToolSpec
from factory.sandbox import Sandbox

__all__ = ["AGENT_TOOLS", "ToolOutcome", "execute_tool"]


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


#: The tools every agent is offered, in the order the model sees them.
AGENT_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("read_file", "Read a text file from the workspace.",
             _object({"path": {"type": "string", "description": "Path relative to the workspace."}}, ["path"])),
    ToolSpec("write_file", "Create or overwrite a file in the workspace.",
             _object({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])),
    ToolSpec("list_files", "List files in the workspace (recursively).",
             _object({"path": {"type": "string", "description": "Directory; default the workspace root."}}, [])),
    ToolSpec("run", "Run a shell command in the workspace sandbox (no network).",
             _object({"command": {"type": "string"},
                      "timeout": {"type": "number", "description": "Seconds (capped by the sandbox limit)."}},
                     ["command"])),
    ToolSpec("submit", "Submit the final answer; this ends the task.",
             _object({"answer": {"type": "string"}}, ["answer"])),
)
_REQUIRED = {tool.name: tuple(tool.parameters["required"]) for tool in AGENT_TOOLS}


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call produced.

    Attributes:
        output: Raw text result (summarized by the caller before use).
        ok: Whether the call did what was asked (exit code 0 for ``run``).
        submitted: The answer, when the call was ``submit``.
    """

    output: str
    ok: bool
    submitted: str | None = None


async def execute_tool(call: ToolCall, sandbox: Sandbox, max_timeout: float) -> ToolOutcome:
    """Carry out one tool call in ``sandbox``."""
    if call.error:
        return ToolOutcome(f"error: {call.error}", ok=False)
    if call.name not in _REQUIRED:
        return ToolOutcome(f"error: unknown tool '{call.name}' (tools: {', '.join(_REQUIRED)})", ok=False)
    missing = [name for name in _REQUIRED[call.name] if name not in call.arguments]
    if missing:
        return ToolOutcome(f"error: {call.name} needs argument(s): {', '.join(missing)}", ok=False)
    args = call.arguments
    try:
        if call.name == "read_file":
            return ToolOutcome(await sandbox.read_file(str(args["path"])), ok=True)
        if call.name == "write_file":
            content = str(args["content"])
            await sandbox.write_file(str(args["path"]), content)
            return ToolOutcome(f"wrote {len(content.encode())} bytes to {args['path']}", ok=True)
        if call.name == "list_files":
            files = await sandbox.list_files(str(args.get("path") or "."))
            return ToolOutcome("\n".join(files) if files else "(no files)", ok=True)
        if call.name == "run":
            try:
                timeout = min(float(args.get("timeout") or max_timeout), max_timeout)
            except (TypeError, ValueError):
                timeout = max_timeout
            if not math.isfinite(timeout) or timeout <= 0:  # nan slips through min(); -inf would kill at once
                timeout = max_timeout
            result = await sandbox.exec(str(args["command"]), timeout=timeout)
            return ToolOutcome(result.describe(), ok=result.ok)
        answer = args["answer"]
        answer = answer if isinstance(answer, str) else str(answer)
        return ToolOutcome(f"submitted: {answer}", ok=True, submitted=answer)
    except SandboxPathError as exc:
        return ToolOutcome(f"error: {exc}", ok=False)
