"""Mapping HTTP outcomes of provider APIs to the `factory` error tree."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator, Mapping
from types import ModuleType
from typing import TypeVar

from factory.errors import (
    MalformedResponseError,
    ModelError,
    ProviderConnectionError,
    ProviderRequestError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)

__all__ = ["error_for_status", "retry_after_seconds", "sdk_errors", "within_timeout"]

T = TypeVar("T")


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from a ``retry-after`` / ``retry-after-ms`` header, if present and numeric."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    for key, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = lowered.get(key)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                return None
    return None


def error_for_status(provider: str, status: int, message: str, headers: Mapping[str, str] | None = None) -> ModelError:
    """The error a provider's HTTP status means: 429 and 5xx (and 408/409) retry, other 4xx do not."""
    text = f"{provider}: HTTP {status}: {' '.join(message.split())[:300]}"
    retry_after = retry_after_seconds(headers)
    if status == 429:
        return RateLimitError(text, retry_after=retry_after)
    if status >= 500 or status in (408, 409):
        return ProviderServerError(text, retry_after=retry_after)
    return ProviderRequestError(text)


@contextlib.contextmanager
def sdk_errors(sdk: ModuleType, provider: str) -> Iterator[None]:
    """Translate the errors of an official SDK (``openai``, ``anthropic``: same shape) into ours.

    Statuses go through :func:`error_for_status`; timeouts and connection
    failures are retryable; a body that breaks the protocol is malformed.
    """
    try:
        yield
    except sdk.APIStatusError as exc:
        raise error_for_status(provider, exc.status_code, str(exc.message), dict(exc.response.headers)) from exc
    except sdk.APITimeoutError as exc:
        raise ProviderTimeoutError(f"{provider}: request timed out: {exc}") from exc
    except sdk.APIConnectionError as exc:
        raise ProviderConnectionError(f"{provider}: connection failed: {exc}") from exc
    except (sdk.APIResponseValidationError, ValueError, TypeError) as exc:
        raise MalformedResponseError(f"{provider}: malformed response: {exc}") from exc


async def within_timeout(call: Awaitable[T], timeout_s: float, provider: str) -> T:
    """Await one call to a provider, abandoning it once it has taken ``timeout_s`` seconds in all.

    The SDKs' own timeouts bound each network read, so a server that trickles
    bytes (or a proxy that holds the connection open) can keep a call going
    far longer; this bounds the whole call.

    Raises:
        ProviderTimeoutError: The call took longer (retryable: a retry may find the server answering).
    """
    try:
        return await asyncio.wait_for(call, timeout_s)
    except asyncio.TimeoutError:
        raise ProviderTimeoutError(f"{provider}: request timed out after {timeout_s:g} s (--request-timeout); "
                                   "the call was abandoned") from None
