"""``replay:FILE`` serves recorded responses; ``--record FILE`` records any provider's.

A replay file is JSONL. Two kinds of line:

- recorded (written by :class:`RecordingModel`): ``{"key": ..., "response": {...}}``.
  The key hashes the conversation's opening (system + first user turn), the
  turn number, temperature and seed, so a re-run of the same tasks and seeds
  gets the same answers even when tool outputs (timings, say) differ.
- scripted (written by hand, for tests and demos): ``{"prompt_contains":
  "17 + 25", "turn": 0, "response": {...}}``; ``prompt_contains`` and
  ``turn`` are optional filters, and among several matches the branch's seed
  picks one, so branches differ deterministically.

A response is ``{"text", "tool_calls": [{"name", "arguments"}], "usage"}``;
``delay_s`` on a line makes the replay wait that long (latency simulation).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.errors import ModelConfigError, ReplayMissError
from factory.models._base import ChatModel, ChatResponse, Message, ModelOptions, ToolSpec, register_model
from factory.provenance import content_hash

__all__ = ["RecordingModel", "ReplayModel", "request_key"]


def _text(content: Any) -> str:
    """A message's text: a multimodal content list (text and image parts) reads as its text parts."""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return content or ""


def _opening(messages: Sequence[Message]) -> list[dict[str, str]]:
    opening = []
    for message in messages:
        opening.append({"role": message["role"], "content": _text(message.get("content"))})
        if message["role"] == "user":
            break
    return opening


def _turn(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


def request_key(messages: Sequence[Message], temperature: float, seed: int | None) -> str:
    """The replay key of a request: conversation opening, turn, temperature and seed."""
    return content_hash({
        "opening": _opening(messages), "turn": _turn(messages),
        "temperature": round(float(temperature), 6), "seed": seed,
    })


@dataclass(frozen=True)
class _Entry:
    line: int
    response: ChatResponse
    delay_s: float
    prompt_contains: str | None = None
    turn: int | None = None


class ReplayModel:
    """Serves responses from a replay file; never calls out."""

    def __init__(self, path: Path):
        self.path = path
        self.spec = f"replay:{path}"
        self._recorded: dict[str, _Entry] = {}
        self._scripted: list[_Entry] = []
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ModelConfigError(f"replay file {self.path}: {exc.strerror or exc}") from exc
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{self.path}:{number}"
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError("expected a JSON object")
                if not isinstance(data.get("response"), dict):
                    raise ValueError("field 'response': expected an object")
                response = ChatResponse.from_dict(data["response"])
                delay = float(data.get("delay_s") or 0.0)
                turn = data.get("turn")
                if turn is not None and not isinstance(turn, int):
                    raise ValueError("field 'turn': expected an integer")
            except (ValueError, KeyError, TypeError) as exc:
                raise ModelConfigError(f"{where}: {exc}") from exc
            if "key" in data:
                self._recorded[str(data["key"])] = _Entry(number, response, delay)
            else:
                contains = data.get("prompt_contains")
                self._scripted.append(_Entry(number, response, delay, contains, turn))
        if not self._recorded and not self._scripted:
            raise ModelConfigError(f"replay file {self.path} holds no responses")

    def _find(self, messages: Sequence[Message], temperature: float, seed: int | None) -> _Entry:
        entry = self._recorded.get(request_key(messages, temperature, seed))
        if entry is not None:
            return entry
        opening = " ".join(m["content"] for m in _opening(messages) if m["role"] == "user")
        turn = _turn(messages)
        matches = [e for e in self._scripted
                   if (e.prompt_contains is None or e.prompt_contains in opening)
                   and (e.turn is None or e.turn == turn)]
        if not matches:
            raise ReplayMissError(f"{self.path}: no response recorded for turn {turn} of prompt {opening[:80]!r}")
        return matches[(seed or 0) % len(matches)]

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        entry = self._find(messages, temperature, seed)
        if entry.delay_s:
            await asyncio.sleep(entry.delay_s)
        return entry.response

    async def aclose(self) -> None:
        return None


class RecordingModel:
    """Wraps a model and appends every response to a replay file (flushed per line)."""

    def __init__(self, inner: ChatModel, path: Path):
        self.inner = inner
        self.spec = inner.spec
        self.path = path
        self._lock = asyncio.Lock()
        try:
            self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in aclose
        except OSError as exc:
            raise ModelConfigError(f"cannot record to {path}: {exc.strerror or exc}") from exc

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        response = await self.inner.chat(messages, tools, temperature=temperature, seed=seed, max_tokens=max_tokens)
        line: dict[str, Any] = {"key": request_key(messages, temperature, seed), "turn": _turn(messages),
                                "model": self.inner.spec, "response": response.to_dict()}
        async with self._lock:
            self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            self._handle.flush()
        return response

    async def aclose(self) -> None:
        self._handle.close()
        await self.inner.aclose()


@register_model("replay")
def _create(name: str, options: ModelOptions) -> ReplayModel:
    if not name:
        raise ModelConfigError("replay: needs a file, e.g. replay:responses.jsonl")
    return ReplayModel(Path(name))
