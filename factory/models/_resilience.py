"""Retries with capped exponential backoff and jitter, and a concurrency limit that shrinks on 429.

:class:`ResilientModel` wraps any :class:`ChatModel`. Providers only translate
their SDK's errors into ours (``retryable`` says whether to try again) and
abandon a call past their request timeout (a retryable
:class:`~factory.errors.ProviderTimeoutError`); the policy lives here once,
for every provider. When the retries run out it raises
:class:`~factory.errors.ProviderExhaustedError`, so a caller can tell "the
provider gave up" from an answer or a request the provider refused.

Per-call retries suit a provider that answers some calls and fails others.
A provider that answers none is different: at 80,000 branches, per-call
backoff would spend hours learning that the server is down. A
:class:`CircuitBreaker` shared by the whole run watches connection
failures; when calls keep failing to connect and none has succeeded for a
whole window, it trips, every call then raises
:class:`~factory.errors.EndpointDownError` at once, and the runner stops the
run (branches not started stay pending for ``--resume``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from factory.errors import (
    EndpointDownError,
    ModelError,
    ProviderConnectionError,
    ProviderExhaustedError,
    ProviderUnavailableError,
    RateLimitError,
)
from factory.models._base import ChatModel, ChatResponse, Message, ToolSpec

__all__ = ["AdaptiveLimiter", "CircuitBreaker", "ResilientModel", "RetryPolicy"]

#: Seconds of nothing but connection failures after which a run stops (``CircuitBreaker``).
DEFAULT_BREAKER_WINDOW_S = 20.0


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


class CircuitBreaker:
    """Trips when calls keep failing to connect and none has succeeded for ``window_s`` seconds.

    Only connection failures arm it (nothing listens, refused, unreachable):
    a 429, a 5xx or a slow answer proves the server is there. Any success
    disarms it. Once tripped it stays tripped: the run stops and a resume
    starts a fresh breaker.

    Args:
        window_s: Seconds from the first connection failure (with no success since) to the trip.
        endpoint: What the error names: the server URL or the model spec.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(self, window_s: float = DEFAULT_BREAKER_WINDOW_S, endpoint: str = "the provider",
                 clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.endpoint = endpoint
        self.clock = clock
        self.failures = 0
        self.tripped: EndpointDownError | None = None
        self._first_failure: float | None = None

    def success(self) -> None:
        """A call got an answer: the endpoint is up."""
        self._first_failure = None
        self.failures = 0

    def connect_failed(self, error: ModelError) -> None:
        """Count a connection failure.

        Raises:
            EndpointDownError: The window has passed with nothing but connection failures.
        """
        now = self.clock()
        self.failures += 1
        if self._first_failure is None:
            self._first_failure = now
        elif self.tripped is None and now - self._first_failure >= self.window_s:
            self.tripped = EndpointDownError(
                f"{self.endpoint} does not answer: {self.failures} calls failed to connect and none succeeded in "
                f"{now - self._first_failure:.0f} s (last: {error}); start the server, then resume the run",
                endpoint=self.endpoint)
        if self.tripped is not None:
            raise self.tripped

    def check(self) -> None:
        """Raise the trip's error if the breaker has tripped."""
        if self.tripped is not None:
            raise self.tripped

    def until_trip(self) -> float | None:
        """Seconds until the window closes (None while no connection failure is pending)."""
        if self._first_failure is None:
            return None
        return max(0.0, self._first_failure + self.window_s - self.clock())


class ResilientModel:
    """A model wrapper adding retries and adaptive concurrency.

    A retryable fault (429, 5xx, a timeout, a malformed body) is retried with
    backoff; one that is still there after ``policy.max_attempts`` attempts
    raises :class:`~factory.errors.ProviderExhaustedError` carrying it. Other
    model errors (a refused request, a replay miss) are raised at once.
    Connection failures also feed ``breaker``, shared by every call of the
    run; once it trips, and once the wrapped model says it is gone for good
    (:class:`~factory.errors.ProviderUnavailableError`: a crashed engine),
    :attr:`unavailable` holds the error and every call raises it at once.

    Attributes:
        spec: The wrapped model's spec.
        retries: Retries made so far (for summaries and tests).
        rate_limited: 429 answers seen so far.
        breaker: The run's circuit breaker.
        unavailable: Why the provider is gone for the rest of the run (None while it is not).
    """

    def __init__(
        self,
        inner: ChatModel,
        policy: RetryPolicy | None = None,
        limiter: AdaptiveLimiter | None = None,
        seed: int = 0,
        breaker: CircuitBreaker | None = None,
    ):
        self.inner = inner
        self.spec = inner.spec
        self.policy = policy or RetryPolicy()
        self.limiter = limiter
        self.breaker = breaker or CircuitBreaker(endpoint=inner.spec)
        self.retries = 0
        self.rate_limited = 0
        self.unavailable: ProviderUnavailableError | None = None
        self._rng = random.Random(seed)

    async def preflight(self) -> None:
        """Let the wrapped model prove it can answer before a run is written (a no-op for most)."""
        check = getattr(self.inner, "preflight", None)
        if check is not None:
            await check()

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
            if self.unavailable is not None:
                raise self.unavailable
            try:
                if self.limiter is None:
                    response = await self.inner.chat(
                        messages, tools, temperature=temperature, seed=seed, max_tokens=max_tokens)
                else:
                    async with self.limiter:
                        response = await self.inner.chat(
                            messages, tools, temperature=temperature, seed=seed, max_tokens=max_tokens)
            except ProviderUnavailableError as exc:
                self.unavailable = exc
                raise
            except ModelError as exc:
                if isinstance(exc, ProviderConnectionError):
                    try:
                        self.breaker.connect_failed(exc)
                    except EndpointDownError as down:
                        self.unavailable = down
                        raise down from exc
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
                delay = self.policy.delay(attempt, self._rng, exc.retry_after)
                until_trip = self.breaker.until_trip()
                if until_trip is not None:  # wake when the window closes: a down endpoint stops the run on time
                    delay = min(delay, until_trip + 0.05)
                await asyncio.sleep(delay)
                continue
            self.breaker.success()
            if self.limiter is not None:
                await self.limiter.on_success()
            return response

    async def aclose(self) -> None:
        await self.inner.aclose()
