"""``local``: the embedded offline default, llama.cpp in process (llama-cpp-python).

By default it runs in a child process (:class:`~factory.models.ChildEngineModel`):
a native crash there (an instruction the CPU refuses) ends the run with one
line, not the fork. ``local`` (or ``local:``) uses the packaged Qwen2.5-Coder-0.5B-Instruct GGUF;
``local:/path/model.gguf`` takes any GGUF that carries a chat template (one
without is refused: the prompt format would be a guess). Prompts are rendered
with the GGUF's own template, tools included, and ``<tool_call>`` blocks in
the output become tool calls. llama.cpp contexts are not thread-safe, so
calls are serialized; ``threads`` sets the CPU threads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from factory.errors import ModelConfigError, ModelError
from factory.models._base import ChatResponse, Message, ModelOptions, ToolSpec, Usage, register_model
from factory.models._gguf import read_gguf_metadata
from factory.models._text_tools import parse_text_tool_calls, render_chat_template
from factory.models._weights import ensure_weights

__all__ = ["LocalChatModel"]


def _check_gguf(path: Path) -> None:
    """Refuse a file that is not a GGUF with a chat template, before any engine loads it.

    Raises:
        ModelConfigError: No such file, not a GGUF, or no chat template (the prompt format would be a guess).
    """
    if not path.is_file():
        raise ModelConfigError(f"local: no GGUF file at {path}")
    if not read_gguf_metadata(path).get("tokenizer.chat_template"):
        raise ModelConfigError(f"local: {path} has no chat template (tokenizer.chat_template); "
                               "use a GGUF converted with its chat template")


class LocalChatModel:
    """A GGUF model run by llama.cpp in this process."""

    def __init__(self, path: Path, options: ModelOptions, spec: str):
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelConfigError(
                "llama-cpp-python is not installed: CMAKE_ARGS=\"-DLLAVA_BUILD=OFF\" "
                "pip install 'factory-rlaif[local]'") from exc
        _check_gguf(path)
        threads = options.threads or int(os.environ.get("FACTORY_THREADS", "0")) or os.cpu_count() or 1
        try:
            self._llm = Llama(model_path=str(path), n_ctx=options.context, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelConfigError(f"local: cannot load {path}: {exc}") from exc
        self._template = self._llm.metadata["tokenizer.chat_template"]
        self._eos = self._token_text("tokenizer.ggml.eos_token_id")
        self._bos = self._token_text("tokenizer.ggml.bos_token_id")
        self._lock = asyncio.Lock()
        self.path = path
        self.threads = threads
        self.spec = spec

    def _token_text(self, key: str) -> str:
        token = self._llm.metadata.get(key)
        if token is None:
            return ""
        return self._llm.detokenize([int(token)], special=True).decode("utf-8", errors="replace")

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None) -> str:
        """The prompt text the model sees."""
        return render_chat_template(self._template, list(messages), list(tools) if tools else None,
                                    bos_token=self._bos, eos_token=self._eos)

    def _generate(self, prompt: str, temperature: float, seed: int | None, max_tokens: int) -> dict[str, Any]:
        stops = [s for s in {self._eos, "<|im_end|>", "<|endoftext|>"} if s]
        return self._llm.create_completion(
            prompt, max_tokens=max_tokens, temperature=temperature, seed=seed if seed is not None else -1,
            stop=stops, top_p=0.95, repeat_penalty=1.05,
        )

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        prompt = self.render(messages, tools)
        async with self._lock:
            try:
                result = await asyncio.to_thread(self._generate, prompt, temperature, seed, max_tokens)
            except (ValueError, RuntimeError) as exc:  # e.g. prompt longer than the context
                raise ModelError(f"local: generation failed: {exc}") from exc
        choice = result["choices"][0]
        if tools:
            text, calls = parse_text_tool_calls(choice["text"], known_tools=frozenset(t.name for t in tools))
        else:
            text, calls = choice["text"].strip(), ()
        usage = result.get("usage") or {}
        return ChatResponse(
            text=text, tool_calls=calls,
            usage=Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), 0.0),
            finish_reason=choice.get("finish_reason"),
        )

    async def aclose(self) -> None:
        self._llm.close()


@register_model("local", child_process=True)
def _create(name: str, options: ModelOptions) -> LocalChatModel:
    if name:
        return LocalChatModel(Path(name).expanduser(), options, f"local:{name}")
    return LocalChatModel(ensure_weights(), options, "local")


def _precheck(name: str) -> None:
    """In the fork's process, before the engine's child starts: the weights are there and usable."""
    _check_gguf(Path(name).expanduser() if name else ensure_weights())


_create.precheck = _precheck  # type: ignore[attr-defined]
