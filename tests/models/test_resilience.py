"""Retries with backoff and the adaptive concurrency limit, against a scripted model (no SDK, no server).

tests/models/test_providers.py runs the same wrapper over the real SDKs and a wire server.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from factory.errors import (
    MalformedResponseError,
    ProviderExhaustedError,
    ProviderRequestError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    ReplayMissError,
)
from factory.models import AdaptiveLimiter, ChatModel, ChatResponse, ResilientModel, RetryPolicy

FAST = RetryPolicy(max_attempts=4, base_s=0.001, cap_s=0.002)


class Scripted:
    """Raises the scripted errors in turn, then answers; records what it was asked."""

    spec = "scripted:model"

    def __init__(self, *outcomes: Exception | str, delay_s: float = 0.0):
        self.outcomes = list(outcomes)
        self.calls: list[dict] = []
        self.delay_s = delay_s
        self.in_flight = 0
        self.peak = 0
        self.closed = False

    async def chat(self, messages, tools=None, *, temperature=0.7, seed=None, max_tokens=1024):
        self.calls.append({"messages": messages, "temperature": temperature, "seed": seed, "max_tokens": max_tokens})
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            outcome = self.outcomes.pop(0) if self.outcomes else "ok"
            if isinstance(outcome, Exception):
                raise outcome
            return ChatResponse(outcome)
        finally:
            self.in_flight -= 1

    async def aclose(self):
        self.closed = True


def ask(model, **options):
    return asyncio.run(model.chat([{"role": "user", "content": "hi"}], **options))


def test_a_resilient_model_is_a_chat_model_with_the_inner_spec():
    model = ResilientModel(Scripted())
    assert isinstance(model, ChatModel) and model.spec == "scripted:model"


@pytest.mark.parametrize("error", [RateLimitError("429"), ProviderServerError("503"), ProviderTimeoutError("slow"),
                                   MalformedResponseError("cut-off body")])
def test_retryable_errors_are_retried_until_an_answer(error):
    inner = Scripted(error, error, "answer")
    model = ResilientModel(inner, FAST)
    assert ask(model, temperature=0.2, seed=5, max_tokens=9).text == "answer"
    assert model.retries == 2 and len(inner.calls) == 3
    assert all(c == {**inner.calls[0]} for c in inner.calls)  # the same request every time
    assert inner.calls[0]["seed"] == 5 and inner.calls[0]["max_tokens"] == 9


@pytest.mark.parametrize("error", [ProviderRequestError("400"), ReplayMissError("no recorded response")])
def test_errors_a_retry_cannot_fix_are_raised_at_once(error):
    inner = Scripted(error, "never reached")
    model = ResilientModel(inner, FAST)
    with pytest.raises(type(error)):
        ask(model)
    assert model.retries == 0 and len(inner.calls) == 1


def test_retries_stop_after_max_attempts_with_the_provider_exhausted():
    last = ProviderServerError("503 again")
    inner = Scripted(*[ProviderServerError("503")] * (FAST.max_attempts - 1), last, "never reached")
    model = ResilientModel(inner, FAST)
    with pytest.raises(ProviderExhaustedError) as caught:
        ask(model)
    assert len(inner.calls) == FAST.max_attempts and model.retries == FAST.max_attempts - 1
    # the last fault is carried, so the branch's reason says what the provider kept doing
    assert caught.value.last_error is last and caught.value.attempts == FAST.max_attempts
    assert caught.value.__cause__ is last
    assert str(caught.value) == "scripted:model: gave up after 4 attempts; last: ProviderServerError: 503 again"


def test_rate_limits_are_counted_and_halve_the_limiter():
    limiter = AdaptiveLimiter(8)
    model = ResilientModel(Scripted(RateLimitError("429"), RateLimitError("429"), "ok"), FAST, limiter)
    assert ask(model).text == "ok"
    assert model.rate_limited == 2 and limiter.limit == 2


def test_close_closes_the_inner_model():
    inner = Scripted()
    asyncio.run(ResilientModel(inner).aclose())
    assert inner.closed


# ------------------------------------------------------------------ RetryPolicy


def test_delays_double_up_to_the_cap_without_jitter():
    policy = RetryPolicy(base_s=0.5, cap_s=3.0, jitter=False)
    rng = random.Random(0)
    assert [policy.delay(attempt, rng) for attempt in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_stays_between_half_and_the_computed_delay():
    policy = RetryPolicy(base_s=1.0, cap_s=100.0, jitter=True)
    rng = random.Random(1)
    delays = [policy.delay(4, rng) for _ in range(200)]
    assert all(4.0 <= d <= 8.0 for d in delays) and len(set(delays)) > 100


def test_a_server_asked_wait_is_honoured_up_to_the_cap():
    policy = RetryPolicy(base_s=0.1, cap_s=5.0, jitter=False)
    rng = random.Random(0)
    assert policy.delay(1, rng, retry_after=2.0) == 2.0
    assert policy.delay(1, rng, retry_after=60.0) == 5.0
    assert policy.delay(3, rng, retry_after=0.01) == 0.4  # never shorter than the backoff


# ------------------------------------------------------------------ AdaptiveLimiter


def test_the_limiter_halves_to_its_floor_and_grows_back_one_at_a_time():
    async def main():
        limiter = AdaptiveLimiter(8, floor=2, grow_after=3)
        seen = []
        for _ in range(3):
            await limiter.on_rate_limit()
            seen.append(limiter.limit)
        for _ in range(7):
            await limiter.on_success()
        seen.append(limiter.limit)
        for _ in range(100):
            await limiter.on_success()
        seen.append(limiter.limit)
        return seen

    assert asyncio.run(main()) == [4, 2, 2, 4, 8]


def test_a_rate_limit_resets_the_success_streak():
    async def main():
        limiter = AdaptiveLimiter(4, grow_after=3)
        await limiter.on_rate_limit()
        await limiter.on_success()
        await limiter.on_success()
        await limiter.on_rate_limit()
        await limiter.on_success()
        await limiter.on_success()
        return limiter.limit

    assert asyncio.run(main()) == 1


def test_limits_are_sane_for_odd_arguments():
    limiter = AdaptiveLimiter(0, floor=10)
    assert (limiter.max_limit, limiter.limit, limiter.floor) == (1, 1, 1)


def test_calls_in_flight_never_exceed_the_limit():
    inner = Scripted(delay_s=0.01)
    model = ResilientModel(inner, FAST, AdaptiveLimiter(3))

    async def main():
        await asyncio.gather(*(model.chat([{"role": "user", "content": str(i)}]) for i in range(12)))

    asyncio.run(main())
    assert inner.peak == 3 and len(inner.calls) == 12
