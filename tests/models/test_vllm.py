"""vLLM: concurrent branches batched into one engine request; the engine itself needs a GPU."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil

import pytest

from factory.errors import ModelConfigError, ModelError
from factory.models import create_model
from factory.models._vllm import BatchRequest, MicroBatcher


def test_concurrent_requests_share_one_batch_with_their_own_parameters():
    seen: list[list[tuple[float, int]]] = []

    def engine(batch: list[BatchRequest]) -> list[str]:
        seen.append([(r.temperature, r.seed) for r in batch])
        return [f"t={r.temperature} s={r.seed}" for r in batch]

    async def main():
        batcher = MicroBatcher(engine, window_s=0.05)
        loop = asyncio.get_running_loop()
        requests = [BatchRequest([{"role": "user", "content": "hi"}], None, 0.5 + b / 10, b, 16, loop.create_future())
                    for b in range(8)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.aclose()
        return results, batcher.batches

    results, batches = asyncio.run(main())
    assert batches == [8]
    assert results == [f"t={0.5 + b / 10} s={b}" for b in range(8)]
    assert sorted(seen[0]) == [(0.5 + b / 10, b) for b in range(8)]


def test_engine_failure_reaches_every_caller_of_the_batch():
    def engine(batch):
        raise RuntimeError("CUDA out of memory")

    async def main():
        batcher = MicroBatcher(engine, window_s=0.01)
        loop = asyncio.get_running_loop()
        requests = [BatchRequest([], None, 0.7, b, 8, loop.create_future()) for b in range(3)]
        outcomes = await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
        await batcher.aclose()
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, ModelError) and "CUDA out of memory" in str(o) for o in outcomes)


HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_GPU = shutil.which("nvidia-smi") is not None


def test_missing_vllm_is_a_clear_error():
    if HAVE_VLLM:
        pytest.skip("vllm is installed here")
    with pytest.raises(ModelConfigError, match="vllm is not installed"):
        create_model("vllm:/models/any")


@pytest.mark.skipif(not (HAVE_VLLM and HAVE_GPU and os.environ.get("FACTORY_VLLM_MODEL")),
                    reason="needs vllm, a GPU and FACTORY_VLLM_MODEL (a local model folder)")
def test_vllm_engine_samples_branches_in_one_request():
    model = create_model(f"vllm:{os.environ['FACTORY_VLLM_MODEL']}")

    async def main():
        messages = [{"role": "user", "content": "Say hello."}]
        replies = await asyncio.gather(*(model.chat(messages, temperature=0.8, seed=b, max_tokens=8)
                                         for b in range(4)))
        await model.aclose()
        return replies

    replies = asyncio.run(main())
    assert all(r.usage.output_tokens > 0 for r in replies)
    assert model._batcher.batches[0] == 4
