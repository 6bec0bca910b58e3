"""Retries with capped exponential backoff and jitter, and a concurrency limit that shrinks on 429.

:class:`ResilientModel` wraps any :class:`ChatModel`. Providers only translate
their SDK's errors into ours (``retryable`` says whether to try again) and
abandon a call past their request timeout (a retryable
:class:`~factory.errors.ProviderTimeoutError`); the policy lives here once,
for every provider. When the retries run out it raises
:class:`~factory.errors.ProviderExhaustedError`, so a caller can tell "the
provider gave up" from an answer or a request the provider refused.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

from factory.errors import ModelError, ProviderExhaustedError, RateLimitError
from factory.models._base import ChatModel, ChatResponse, Message, ToolSpec

__all__ = ["AdaptiveLimiter", "ResilientModel", "RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How retries back off.

    Attributes:
        max_attempts: Total attempts per call (first try included).
        base_s: Delay before the first retry.
        cap_s: Largest delay.
        jitter: Full jitter: the delay is uniform in [0, computed] when true.
    """

    max_attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 30.0
    jitter: bool = True

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        computed = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        if self.jitter:
            computed = rng.uniform(computed / 2, computed)
        if retry_after is not None:
            computed = max(computed, min(retry_after, self.cap_s))
        return computed


class AdaptiveLimiter:
    """An AIMD concurrency limit: halves on a 429, grows by one after a run of successes.

    Args:
        limit: Starting (and largest) number of calls in flight.
        floor: Smallest limit.
        grow_after: Successes in a row before the limit grows by one.
    """

    def __init__(self, limit: int, floor: int = 1, grow_after: int = 10):
        self.max_limit = max(1, limit)
        self.limit = self.max_limit
        self.floor = max(1, min(floor, self.max_limit))
        self.grow_after = grow_after
        self.in_flight = 0
        self._streak = 0
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> AdaptiveLimiter:
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        async with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    async def on_rate_limit(self) -> None:
        """Halve the limit (not below the floor)."""
        async with self._changed:
            self.limit = max(self.floor, self.limit // 2)
            self._streak = 0

    async def on_success(self) -> None:
        """Count a success; grow the limit after ``grow_after`` in a row."""
        async with self._changed:
            self._streak += 1
            if self._streak >= self.grow_after and self.limit < self.max_limit:
                self.limit += 1
                self._streak = 0
                self._changed.notify_all()


class ResilientModel:
    """A model wrapper adding retries and adaptive concurrency.

    A retryable fault (429, 5xx, a timeout, a malformed body) is retried with
    backoff; one that is still there after ``policy.max_attempts`` attempts
    raises :class:`~factory.errors.ProviderExhaustedError` carrying it. Other
    model errors (a refused request, a replay miss) are raised at once.

    Attributes:
        spec: The wrapped model's spec.
        retries: Retries made so far (for summaries and tests).
        rate_limited: 429 answers seen so far.
    """

    def __init__(
        self,
        inner: ChatModel,
        policy: RetryPolicy | None = None,
        limiter: AdaptiveLimiter | None = None,
        seed: int = 0,
    ):
        self.inner = inner
        self.spec = inner.spec
        self.policy = policy or RetryPolicy()
        self.limiter = limiter
        self.retries = 0
        self.rate_limited = 0
        self._rng = random.Random(seed)

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        attempt = 0
        while True:
            attempt += 1
            try:
                if self.limiter is None:
                    response = await self.inner.chat(
                        messages, tools, temperature=temperature, seed=seed, max_tokens=max_tokens)
                else:
                    async with self.limiter:
                        response = await self.inner.chat(
                            messages, tools, temperature=temperature, seed=seed, max_tokens=max_tokens)
            except ModelError as exc:
                if isinstance(exc, RateLimitError):
                    self.rate_limited += 1
                    if self.limiter is not None:
                        await self.limiter.on_rate_limit()
                if not exc.retryable:
                    raise
                if attempt >= self.policy.max_attempts:
                    raise ProviderExhaustedError(
                        f"{self.spec}: gave up after {attempt} attempt{'s' if attempt != 1 else ''}; "
                        f"last: {type(exc).__name__}: {exc}", last_error=exc, attempts=attempt) from exc
                self.retries += 1
                await asyncio.sleep(self.policy.delay(attempt, self._rng, exc.retry_after))
                continue
            if self.limiter is not None:
                await self.limiter.on_success()
            return response

    async def aclose(self) -> None:
        await self.inner.aclose()
