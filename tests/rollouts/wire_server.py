"""A scripted fake of the OpenAI Chat Completions and Anthropic Messages HTTP APIs.

The real ``openai`` and ``anthropic`` SDKs talk to it over a local socket, so
tests exercise their request encoding, status handling and response parsing:

    with WireServer() as server:
        server.push(Reply.error(429, headers={"retry-after": "0"}), Reply.ok("hello"))
        ...
        server.requests  # every request body received, parsed

``POST /v1/chat/completions`` answers in the OpenAI shape, as
llama-cpp-python's server sends it (``tests/models/test_openai_real_server.py``
compares the two: a single tool call repeated in the legacy ``function_call``,
500s typed ``internal_server_error``, no ``Retry-After``), and ``POST
/v1/messages`` in the Anthropic shape. Planned replies are served in order
from one queue (whichever endpoint is called); once the queue is empty the
server answers with its ``default`` reply. :meth:`WireServer.flaky` makes it
fail a fraction of calls with 429 or 500 from a seeded RNG instead. A reply
can also be held back (``delay_s``), trickled a byte at a time
(``trickle_s``) or cut off mid-body (``cut_at``), as a hung or failing
provider would.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ANTHROPIC_PATH", "OPENAI_PATH", "RecordedRequest", "Reply", "WireServer"]

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"


@dataclass(frozen=True)
class Reply:
    """One planned answer.

    Attributes:
        status: HTTP status.
        text: Assistant text (normal replies).
        tool_calls: ``(name, arguments)`` pairs (normal replies); ``arguments``
            is a dict, or a raw string to send verbatim as OpenAI's arguments.
        body: Raw body to send instead of a well-formed reply: a dict or list is
            sent as JSON, a str verbatim (with ``content_type``).
        headers: Extra response headers (``retry-after``, say).
        usage: ``(input_tokens, output_tokens)``.
        finish_reason: OpenAI ``finish_reason`` / Anthropic ``stop_reason``;
            by default ``stop``/``end_turn``, or ``tool_calls``/``tool_use``
            when the reply calls tools.
        content_type: Content type of a raw ``body``.
        delay_s: Seconds to hold this reply before sending anything (a hung server).
        trickle_s: Send the body one byte at a time, this many seconds apart (a
            server that never stalls long enough for a read timeout, yet never finishes).
        cut_at: Send only this many bytes of the body (its full length announced),
            then close the connection: a body cut off in transit.
    """

    status: int = 200
    text: str = ""
    tool_calls: tuple[tuple[str, Any], ...] = ()
    body: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    usage: tuple[int, int] = (11, 7)
    finish_reason: str | None = None
    content_type: str = "application/json"
    delay_s: float = 0.0
    trickle_s: float = 0.0
    cut_at: int | None = None

    @classmethod
    def ok(cls, text: str = "", tool_calls: list[tuple[str, Any]] | None = None,
           usage: tuple[int, int] = (11, 7), finish_reason: str | None = None) -> Reply:
        """A well-formed reply with text and/or tool calls."""
        return cls(text=text, tool_calls=tuple(tool_calls or ()), usage=usage, finish_reason=finish_reason)

    @classmethod
    def error(cls, status: int, message: str = "planned failure", headers: dict[str, str] | None = None,
              code: str | None = None, param: str | None = None) -> Reply:
        """An error status with each API's error body (OpenAI's carries ``code`` and ``param``)."""
        return cls(status=status, body={"__error__": message, "code": code, "param": param},
                   headers=tuple((headers or {}).items()))

    @classmethod
    def raw(cls, body: Any, status: int = 200, content_type: str = "application/json") -> Reply:
        """A body sent as is (malformed replies)."""
        return cls(status=status, body=body, content_type=content_type)


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received, and the status it was answered with."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
# llama-cpp-python's server names its 500s so (and answers a request body it cannot validate with one)
_OPENAI_ERROR_TYPES = {**_ERROR_TYPES, 500: "internal_server_error"}


@dataclass
class _State:
    planned: deque[Reply] = field(default_factory=deque)
    default: Reply = field(default_factory=lambda: Reply.ok("default reply"))
    requests: list[RecordedRequest] = field(default_factory=list)
    flaky_rate: float = 0.0
    flaky_statuses: tuple[int, ...] = (429, 500)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    delay_s: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: itertools.count = field(default_factory=itertools.count)


def _openai_body(reply: Reply, model: str, serial: int) -> dict[str, Any]:
    calls = []
    for i, (name, arguments) in enumerate(reply.tool_calls):
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append({"id": f"call_{serial}_{i}", "type": "function", "function": {"name": name, "arguments": raw}})
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if calls:
        message["tool_calls"] = calls
    if len(calls) == 1:  # llama-cpp-python's server repeats a single call in the legacy field
        message["function_call"] = calls[0]["function"]
    tokens_in, tokens_out = reply.usage
    return {
        "id": f"chatcmpl-{serial}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop")}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out},
    }


def _anthropic_body(reply: Reply, model: str, serial: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    for i, (name, arguments) in enumerate(reply.tool_calls):
        content.append({"type": "tool_use", "id": f"toolu_{serial}_{i}", "name": name, "input": arguments})
    tokens_in, tokens_out = reply.usage
    return {
        "id": f"msg_{serial}", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reply.finish_reason or ("tool_use" if reply.tool_calls else "end_turn"),
        "stop_sequence": None, "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
    }


def _error_body(path: str, status: int, message: str, code: str | None = None,
                param: str | None = None) -> dict[str, Any]:
    if path == ANTHROPIC_PATH:
        return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}
    kind = _OPENAI_ERROR_TYPES.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' connection pools expect
    # One write per answer and no Nagle: otherwise delayed ACKs add ~40 ms to every call.
    disable_nagle_algorithm = True
    wbufsize = -1
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None  # keep test output clean

    def _send(self, status: int, payload: bytes, content_type: str, headers: tuple[tuple[str, str], ...] = (),
              trickle_s: float = 0.0, cut_at: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if cut_at is not None:
            self.wfile.write(payload[:cut_at])
            self.close_connection = True
            return
        if not trickle_s:
            self.wfile.write(payload)
            return
        self.wfile.flush()
        for byte in payload:
            time.sleep(trickle_s)
            self.wfile.write(bytes([byte]))
            self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        if path not in (OPENAI_PATH, ANTHROPIC_PATH):
            with state.lock:
                state.requests.append(RecordedRequest(path, headers, body, 404))
            self._send(404, json.dumps(_error_body(path, 404, f"no route for POST {path}")).encode(),
                       "application/json")
            return
        with state.lock:
            serial = next(state.ids)
            if state.planned:
                reply = state.planned.popleft()
            elif state.flaky_rate and state.rng.random() < state.flaky_rate:
                reply = Reply.error(state.rng.choice(state.flaky_statuses), "flaky failure")
            else:
                reply = state.default
            state.requests.append(RecordedRequest(path, headers, body, reply.status))
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            if state.delay_s or reply.delay_s:
                time.sleep(state.delay_s + reply.delay_s)
            model = body.get("model", "unknown") if isinstance(body, dict) else "unknown"
            if reply.body is not None:
                payload = reply.body
                if isinstance(payload, dict) and "__error__" in payload:
                    payload = _error_body(path, reply.status, payload["__error__"], payload.get("code"),
                                          payload.get("param"))
            elif path == OPENAI_PATH:
                payload = _openai_body(reply, model, serial)
            else:
                payload = _anthropic_body(reply, model, serial)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self._send(reply.status, data, reply.content_type, reply.headers, reply.trickle_s, reply.cut_at)
        finally:
            with state.lock:
                state.in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many SDK connections may open at once
    state: _State

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client gave up (a timeout test, say): nothing to report
        super().handle_error(request, client_address)


class WireServer:
    """The fake API on ``127.0.0.1`` (a free port), served from a background thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (no trailing slash) once started.
    """

    def __init__(self, default: Reply | None = None):
        self._state = _State()
        if default is not None:
            self._state.default = default
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # lifecycle

    def start(self) -> WireServer:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.state = self._state
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                                        name="wire-server", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # scripting

    def push(self, *replies: Reply) -> WireServer:
        """Queue replies, served in order before the default/flaky behaviour."""
        with self._state.lock:
            self._state.planned.extend(replies)
        return self

    def set_default(self, reply: Reply) -> WireServer:
        """The reply once the queue is empty (and a flaky call does not fail)."""
        with self._state.lock:
            self._state.default = reply
        return self

    def flaky(self, rate: float, statuses: tuple[int, ...] = (429, 500), seed: int = 0,
              default: Reply | None = None) -> WireServer:
        """Fail ``rate`` of the unplanned calls with a status drawn from ``statuses`` (seeded)."""
        with self._state.lock:
            self._state.flaky_rate = rate
            self._state.flaky_statuses = tuple(statuses)
            self._state.rng = random.Random(seed)
            if default is not None:
                self._state.default = default
        return self

    def set_delay(self, seconds: float) -> WireServer:
        """Hold every answer this long (to make calls overlap)."""
        self._state.delay_s = seconds
        return self

    # inspection

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received, in arrival order."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def bodies(self) -> list[Any]:
        """The parsed JSON body of every request, in arrival order."""
        return [r.body for r in self.requests]

    @property
    def pending(self) -> int:
        """Planned replies not yet served."""
        with self._state.lock:
            return len(self._state.planned)

    @property
    def max_in_flight(self) -> int:
        """Most requests the server was answering at once."""
        with self._state.lock:
            return self._state.max_in_flight
