"""Mapping HTTP outcomes of provider APIs to the `factory` error tree."""

from __future__ import annotations

from collections.abc import Mapping

from factory.errors import ModelError, ProviderRequestError, ProviderServerError, RateLimitError

__all__ = ["error_for_status", "retry_after_seconds"]


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
