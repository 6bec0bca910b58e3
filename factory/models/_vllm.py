"""``vllm:PATH``: the in-process vLLM engine, batching concurrent branches into one request.

The fork runner calls ``chat`` once per branch, concurrently. A
:class:`MicroBatcher` gathers the calls that arrive within a few
milliseconds and hands them to the engine as one ``LLM.chat`` request with a
list of conversations and a list of per-branch ``SamplingParams``
(temperature and seed differ per branch), which is how vLLM reaches its
throughput. Tool calls come back as ``<tool_call>`` text and are parsed like
the other in-process engines'. Needs a GPU and the ``vllm`` extra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from factory.errors import ModelConfigError, ModelError
from factory.models._base import ChatResponse, Message, ModelOptions, ToolSpec, Usage, register_model
from factory.models._text_tools import parse_text_tool_calls

__all__ = ["BatchRequest", "MicroBatcher", "VLLMChatModel"]


@dataclass
class BatchRequest:
    """One branch's call waiting in a batch."""

    messages: list[Message]
    tools: list[ToolSpec] | None
    temperature: float
    seed: int | None
    max_tokens: int
    future: asyncio.Future


class MicroBatcher:
    """Collects concurrent requests for ``window_s`` (or ``max_batch``) and runs them together.

    Args:
        run_batch: Blocking function from requests to one result per request,
            run in a worker thread.
        window_s: How long the first request of a batch waits for company.
        max_batch: Largest batch.
    """

    def __init__(self, run_batch: Callable[[list[BatchRequest]], list[Any]], window_s: float = 0.01,
                 max_batch: int = 256):
        self._run_batch = run_batch
        self._window_s = window_s
        self._max_batch = max_batch
        self._queue: asyncio.Queue[BatchRequest] | None = None
        self._worker: asyncio.Task | None = None
        self.batches: list[int] = []

    async def submit(self, request: BatchRequest) -> Any:
        """Queue a request and wait for its result."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.create_task(self._work())
        await self._queue.put(request)
        return await request.future

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            deadline = asyncio.get_running_loop().time() + self._window_s
            while len(batch) < self._max_batch:
                timeout = deadline - asyncio.get_running_loop().time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            self.batches.append(len(batch))
            try:
                results = await asyncio.to_thread(self._run_batch, batch)
            except Exception as exc:  # the engine failed: every caller in the batch hears why
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(ModelError(f"vllm: batch failed: {exc}"))
                continue
            for request, result in zip(batch, results):
                if not request.future.done():
                    request.future.set_result(result)

    async def aclose(self) -> None:
        """Stop the worker."""
        if self._worker is not None:
            self._worker.cancel()


class VLLMChatModel:
    """vLLM's offline ``LLM`` engine in this process."""

    def __init__(self, path: str, options: ModelOptions):
        try:
            import vllm
        except ImportError as exc:
            raise ModelConfigError("vllm is not installed (needs a GPU): pip install 'factory-rlaif[vllm]'") from exc
        if not path:
            raise ModelConfigError("vllm: needs a model path, e.g. vllm:/models/qwen2.5-7b-instruct")
        self._vllm = vllm
        self._engine = vllm.LLM(model=path, max_model_len=options.context, **dict(options.extra))
        self._batcher = MicroBatcher(self._run_batch)
        self.spec = f"vllm:{path}"

    def _run_batch(self, batch: list[BatchRequest]) -> list[ChatResponse]:
        params = [self._vllm.SamplingParams(temperature=r.temperature, seed=r.seed, max_tokens=r.max_tokens)
                  for r in batch]
        # One request per distinct tool set (in practice: one for the whole batch).
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, request in enumerate(batch):
            groups.setdefault(tuple(t.name for t in request.tools or ()), []).append(index)
        results: list[ChatResponse | None] = [None] * len(batch)
        for indexes in groups.values():
            tools = batch[indexes[0]].tools
            outputs = self._engine.chat(
                [batch[i].messages for i in indexes], [params[i] for i in indexes],
                tools=[t.openai_schema() for t in tools] if tools else None, use_tqdm=False,
            )
            for i, output in zip(indexes, outputs):
                completion = output.outputs[0]
                if tools:
                    text, calls = parse_text_tool_calls(completion.text, known_tools=frozenset(t.name for t in tools))
                else:
                    text, calls = completion.text.strip(), ()
                results[i] = ChatResponse(
                    text=text, tool_calls=calls,
                    usage=Usage(len(output.prompt_token_ids or ()), len(completion.token_ids or ()), 0.0),
                    finish_reason=completion.finish_reason,
                )
        return [r for r in results if r is not None]

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        future = asyncio.get_running_loop().create_future()
        request = BatchRequest(list(messages), list(tools) if tools else None, temperature, seed, max_tokens, future)
        return await self._batcher.submit(request)

    async def aclose(self) -> None:
        await self._batcher.aclose()


@register_model("vllm", child_process=True)
def _create(name: str, options: ModelOptions) -> VLLMChatModel:
    return VLLMChatModel(name, options)
