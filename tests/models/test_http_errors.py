"""HTTP outcomes of provider APIs become the `factory` error tree: what retries, what does not, and how long to wait.

``sdk_errors`` is exercised here against a stand-in module with the SDKs' exception
shape (``APIStatusError`` ...), so the mapping is checked without openai or anthropic
installed; tests/models/test_providers.py checks it through the real SDKs.
"""

from __future__ import annotations

import types

import pytest

from factory.errors import (
    MalformedResponseError,
    ModelError,
    ProviderRequestError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)
from factory.models import error_for_status, retry_after_seconds, sdk_errors


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"Retry-After": "7"}, 7.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # the precise one wins
    ({"retry-after": "-3"}, 0.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # an HTTP date is not a number of seconds
    ({"x-other": "1"}, None),
    ({}, None),
    (None, None),
])
def test_retry_after_headers(headers, seconds):
    assert retry_after_seconds(headers) == seconds


def test_429_is_a_rate_limit_carrying_the_wait():
    error = error_for_status("openai", 429, "slow down", {"retry-after": "3"})
    assert isinstance(error, RateLimitError) and error.retry_after == 3.0 and error.retryable
    assert str(error) == "openai: HTTP 429: slow down"


@pytest.mark.parametrize("status", [500, 502, 503, 529, 408, 409])
def test_server_side_statuses_are_retryable_server_errors(status):
    error = error_for_status("anthropic", status, "overloaded", {"retry-after": "2"})
    assert isinstance(error, ProviderServerError) and error.retry_after == 2.0 and error.retryable


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_client_errors_are_request_errors(status):
    error = error_for_status("openai", status, "bad request")
    assert type(error) is ProviderRequestError and not error.retryable
    assert not isinstance(error, (RateLimitError, ProviderServerError))


def test_the_message_is_one_line_and_capped():
    error = error_for_status("openai", 400, "line one\n\n  line   two " + "x" * 1000)
    text = str(error)
    assert "\n" not in text and text.startswith("openai: HTTP 400: line one line two x")
    assert len(text) <= len("openai: HTTP 400: ") + 300


# ------------------------------------------------------------------ sdk_errors


class _APIError(Exception):
    pass


class _StatusError(_APIError):
    def __init__(self, status_code, message, headers):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.response = types.SimpleNamespace(headers=headers)


class _ConnectionError(_APIError):
    pass


class _TimeoutError(_ConnectionError):  # as in the SDKs: a timeout is a kind of connection error
    pass


class _ValidationError(_APIError):
    pass


SDK = types.SimpleNamespace(APIStatusError=_StatusError, APITimeoutError=_TimeoutError,
                            APIConnectionError=_ConnectionError, APIResponseValidationError=_ValidationError)


@pytest.mark.parametrize(("raised", "expected", "text"), [
    (_StatusError(429, "rate limited", {"retry-after": "4"}), RateLimitError, "sdk: HTTP 429: rate limited"),
    (_StatusError(503, "down", {}), ProviderServerError, "sdk: HTTP 503: down"),
    (_StatusError(401, "bad key", {}), ProviderRequestError, "sdk: HTTP 401: bad key"),
    (_TimeoutError("read timeout"), ProviderTimeoutError, "sdk: request timed out: read timeout"),
    (_ConnectionError("refused"), ProviderTimeoutError, "sdk: connection failed: refused"),
    (_ValidationError("no choices"), MalformedResponseError, "sdk: malformed response: no choices"),
    (ValueError("bad float"), MalformedResponseError, "sdk: malformed response: bad float"),
    (TypeError("None is not a str"), MalformedResponseError, "sdk: malformed response: None is not a str"),
])
def test_sdk_errors_translate_at_the_boundary(raised, expected, text):
    with pytest.raises(expected) as caught, sdk_errors(SDK, "sdk"):
        raise raised
    assert str(caught.value) == text
    assert caught.value.__cause__ is raised


def test_sdk_errors_keep_the_retry_after_of_a_rate_limit():
    with pytest.raises(RateLimitError) as caught, sdk_errors(SDK, "sdk"):
        raise _StatusError(429, "wait", {"Retry-After-Ms": "1500"})
    assert caught.value.retry_after == 1.5


def test_sdk_errors_let_unrelated_errors_and_success_through():
    with sdk_errors(SDK, "sdk"):
        value = 42
    assert value == 42
    with pytest.raises(KeyError), sdk_errors(SDK, "sdk"):
        raise KeyError("not ours to translate")


def test_every_translated_error_is_a_model_error():
    for raised in (_StatusError(500, "x", {}), _TimeoutError("x"), _ValidationError("x")):
        with pytest.raises(ModelError), sdk_errors(SDK, "sdk"):
            raise raised
