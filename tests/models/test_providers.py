"""The openai and anthropic providers, through the real SDKs, against a local server speaking each wire protocol."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from factory.errors import (
    MalformedResponseError,
    ModelConfigError,
    ProviderExhaustedError,
    ProviderRequestError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    ReplayMissError,
)
from factory.models import (
    AdaptiveLimiter,
    ChatModel,
    ChatResponse,
    ModelOptions,
    RecordingModel,
    ResilientModel,
    RetryPolicy,
    ToolSpec,
    create_model,
)
from tests.rollouts.wire_server import ANTHROPIC_PATH, OPENAI_PATH, Reply, WireServer

pytest.importorskip("openai")
pytest.importorskip("anthropic")

PROVIDERS = ["openai", "anthropic"]
PATHS = {"openai": OPENAI_PATH, "anthropic": ANTHROPIC_PATH}
FINISH = {"openai": ("stop", "tool_calls"), "anthropic": ("end_turn", "tool_use")}
FAST = RetryPolicy(base_s=0.01, cap_s=0.05)

READ_FILE = ToolSpec("read_file", "Read a file from the workspace.", {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
RUN = ToolSpec("run", "Run a shell command.", {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
    "required": ["command"]})

HELLO = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]

# A conversation after one round of two tool calls, in our (OpenAI-shaped) message format.
AFTER_TOOLS = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "Fix factorial in solution.py."},
    {"role": "assistant", "content": "Reading it first.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": {"path": "solution.py"}}},
        {"id": "call_b", "type": "function", "function": {
            "name": "run", "arguments": {"command": "pytest -q", "timeout_s": 30}}},
    ]},
    {"role": "tool", "tool_call_id": "call_a", "name": "read_file", "content": "def factorial(n): return 0"},
    {"role": "tool", "tool_call_id": "call_b", "name": "run", "content": "1 failed"},
]


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as running:
        yield running


def make_model(provider: str, server: WireServer, **options: Any) -> ChatModel:
    """The provider pointed at the fake server, as a user would configure it."""
    base_url = server.url + "/v1" if provider == "openai" else server.url
    return create_model(f"{provider}:test-model", ModelOptions(base_url=base_url, api_key="test", **options))


def chat(model: ChatModel, messages: list[dict[str, Any]] = HELLO, tools: list[ToolSpec] | None = None,
         **kwargs: Any) -> ChatResponse:
    """One call, closing the model (and its SDK client) afterwards."""

    async def go() -> ChatResponse:
        try:
            return await model.chat(messages, tools, **kwargs)
        finally:
            await model.aclose()

    return asyncio.run(go())


# --- replies ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_plain_text_reply_gives_text_usage_and_finish_reason(provider: str, server: WireServer) -> None:
    server.push(Reply.ok("Hello there.", usage=(23, 5)))

    response = chat(make_model(provider, server), temperature=0.25, seed=7, max_tokens=64)

    assert response.text == "Hello there."
    assert response.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens) == (23, 5)
    assert response.usage.cost_usd is None  # no price known for test-model
    assert response.finish_reason == FINISH[provider][0]
    [request] = server.requests
    assert request.path == PATHS[provider]
    assert request.body["model"] == "test-model"
    assert request.body["max_tokens"] == 64
    assert request.body["temperature"] == 0.25


def test_openai_sends_key_seed_and_messages(server: WireServer) -> None:
    server.push(Reply.ok("hi"))
    chat(make_model("openai", server), seed=7)

    [request] = server.requests
    assert request.headers["authorization"] == "Bearer test"
    assert request.body["seed"] == 7
    assert request.body["messages"] == HELLO


def test_anthropic_sends_key_and_moves_system_out_of_messages(server: WireServer) -> None:
    server.push(Reply.ok("hi"))
    chat(make_model("anthropic", server), seed=7)

    [request] = server.requests
    # older SDKs send x-api-key, newer ones a bearer token
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    assert "test" in (request.headers.get("x-api-key"), bearer)
    assert "anthropic-version" in request.headers
    assert "seed" not in request.body  # the Messages API has none
    assert request.body["system"] == "You are terse."
    assert request.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_tool_calls_are_parsed(provider: str, server: WireServer) -> None:
    server.push(Reply.ok("Let me look.", tool_calls=[
        ("read_file", {"path": "solution.py"}),
        ("run", {"command": "pytest -q", "timeout_s": 30}),
    ]))

    response = chat(make_model(provider, server), tools=[READ_FILE, RUN])

    assert response.text == "Let me look."
    assert [(c.name, c.arguments, c.error) for c in response.tool_calls] == [
        ("read_file", {"path": "solution.py"}, None),
        ("run", {"command": "pytest -q", "timeout_s": 30}, None),
    ]
    ids = [c.id for c in response.tool_calls]
    assert all(ids) and len(set(ids)) == 2
    assert response.finish_reason == FINISH[provider][1]


@pytest.mark.parametrize(("provider", "bad_arguments"), [
    ("openai", '{"path": "solution.py"'),  # truncated JSON text
    ("openai", '["solution.py"]'),  # JSON, but not an object
    ("anthropic", ["solution.py"]),  # input that is not an object
])
def test_unusable_tool_arguments_are_reported_on_the_call(provider: str, bad_arguments: Any,
                                                          server: WireServer) -> None:
    server.push(Reply.ok("", tool_calls=[("read_file", bad_arguments), ("run", {"command": "ls"})]))

    response = chat(make_model(provider, server), tools=[READ_FILE, RUN])

    bad, good = response.tool_calls
    assert (bad.name, bad.arguments) == ("read_file", {})
    assert bad.error  # says why, for the agent to show the model
    assert (good.arguments, good.error) == ({"command": "ls"}, None)


# --- what goes on the wire -------------------------------------------------------------------------------------


def test_openai_wire_messages_after_tool_calls(server: WireServer) -> None:
    server.push(Reply.ok("Found it."))

    chat(make_model("openai", server), AFTER_TOOLS, tools=[READ_FILE, RUN])

    messages = server.bodies[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "tool", "tool"]
    assistant = messages[3]
    assert assistant["content"] == "Reading it first."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_a", "call_b"]
    for call, original in zip(assistant["tool_calls"], AFTER_TOOLS[3]["tool_calls"]):
        assert call["type"] == "function"
        assert call["function"]["name"] == original["function"]["name"]
        assert isinstance(call["function"]["arguments"], str)  # JSON text on this wire, not an object
        assert json.loads(call["function"]["arguments"]) == original["function"]["arguments"]
    assert messages[4]["tool_call_id"] == "call_a"
    assert messages[4]["content"] == "def factorial(n): return 0"
    assert messages[5]["tool_call_id"] == "call_b"
    assert messages[5]["content"] == "1 failed"


def test_openai_assistant_turn_without_text_sends_empty_content(server: WireServer) -> None:
    server.push(Reply.ok("ok"))
    conversation = [AFTER_TOOLS[2], {**AFTER_TOOLS[3], "content": None}, AFTER_TOOLS[4], AFTER_TOOLS[5]]

    chat(make_model("openai", server), conversation)

    assert server.bodies[0]["messages"][1]["content"] == ""


def test_anthropic_wire_messages_after_tool_calls(server: WireServer) -> None:
    server.push(Reply.ok("Found it."))

    chat(make_model("anthropic", server), AFTER_TOOLS, tools=[READ_FILE, RUN])

    body = server.bodies[0]
    assert body["system"] == "You fix bugs.\n\nUse the tools."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Fix factorial in solution.py."}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading it first."},
            {"type": "tool_use", "id": "call_a", "name": "read_file", "input": {"path": "solution.py"}},
            {"type": "tool_use", "id": "call_b", "name": "run", "input": {"command": "pytest -q", "timeout_s": 30}},
        ]},
        # both results in one user turn, as the API requires
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_a", "content": "def factorial(n): return 0"},
            {"type": "tool_result", "tool_use_id": "call_b", "content": "1 failed"},
        ]},
    ]


def test_openai_tools_offered_in_function_schema(server: WireServer) -> None:
    server.push(Reply.ok("ok"))

    chat(make_model("openai", server), tools=[READ_FILE, RUN])

    assert server.bodies[0]["tools"] == [
        {"type": "function", "function": {"name": t.name, "description": t.description,
                                          "parameters": dict(t.parameters)}}
        for t in (READ_FILE, RUN)
    ]


def test_anthropic_tools_offered_with_input_schema(server: WireServer) -> None:
    server.push(Reply.ok("ok"))

    chat(make_model("anthropic", server), tools=[READ_FILE, RUN])

    assert server.bodies[0]["tools"] == [
        {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)} for t in (READ_FILE, RUN)
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_no_tools_key_when_no_tools_offered(provider: str, server: WireServer) -> None:
    server.push(Reply.ok("ok"))
    chat(make_model(provider, server), tools=[])
    assert "tools" not in server.bodies[0]


# --- failures and retries --------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("header", "value", "seconds"), [("retry-after", "7", 7.0), ("retry-after-ms", "250", 0.25)])
def test_429_is_a_rate_limit_error_carrying_retry_after(provider: str, header: str, value: str, seconds: float,
                                                        server: WireServer) -> None:
    server.push(Reply.error(429, "slow down", headers={header: value}))

    with pytest.raises(RateLimitError) as caught:
        chat(make_model(provider, server))

    assert caught.value.retryable
    assert caught.value.retry_after == pytest.approx(seconds)
    assert "429" in str(caught.value) and "slow down" in str(caught.value)
    assert len(server.requests) == 1  # the SDK's own retries are off


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limited_then_success_retries_once_and_halves_concurrency(provider: str, server: WireServer) -> None:
    server.push(Reply.error(429, headers={"retry-after": "0"}), Reply.ok("made it"))
    limiter = AdaptiveLimiter(8)
    model = ResilientModel(make_model(provider, server), FAST, limiter)

    response = chat(model)

    assert response.text == "made it"
    assert (model.rate_limited, model.retries) == (1, 1)
    assert limiter.limit == 4
    assert [r.status for r in server.requests] == [429, 200]
    assert server.bodies[0] == server.bodies[1]  # the same request, sent again


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [500, 503])
def test_server_error_then_success_retries_without_shrinking(provider: str, status: int, server: WireServer) -> None:
    server.push(Reply.error(status, "upstream exploded"), Reply.ok("made it"))
    limiter = AdaptiveLimiter(8)
    model = ResilientModel(make_model(provider, server), FAST, limiter)

    response = chat(model)

    assert response.text == "made it"
    assert (model.rate_limited, model.retries) == (0, 1)
    assert limiter.limit == 8
    assert [r.status for r in server.requests] == [status, 200]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_server_errors_give_up_after_max_attempts(provider: str, server: WireServer) -> None:
    server.push(*[Reply.error(500)] * 3, Reply.ok("too late"))
    model = ResilientModel(make_model(provider, server), RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.05))

    with pytest.raises(ProviderExhaustedError) as caught:
        chat(model)

    assert isinstance(caught.value.last_error, ProviderServerError) and caught.value.attempts == 3
    assert "gave up after 3 attempts" in str(caught.value) and "HTTP 500" in str(caught.value)
    assert model.retries == 2
    assert len(server.requests) == 3


MALFORMED = [
    pytest.param("openai", Reply.raw({"choices": "oops"}), id="openai-choices-not-a-list"),
    pytest.param("openai", Reply.raw({"id": "x", "object": "chat.completion", "choices": []}), id="openai-no-choices"),
    pytest.param("openai", Reply.raw('{"choices": [', ), id="openai-truncated-json"),
    pytest.param("openai", Reply.raw("<html>gateway</html>", content_type="text/html"), id="openai-html"),
    pytest.param("anthropic", Reply.raw({"content": "oops"}), id="anthropic-content-not-a-list"),
    pytest.param("anthropic", Reply.raw({"type": "message", "content": []}), id="anthropic-no-usage"),
    pytest.param("anthropic", Reply.raw('{"content": [', ), id="anthropic-truncated-json"),
    pytest.param("anthropic", Reply.raw("<html>gateway</html>", content_type="text/html"), id="anthropic-html"),
    # Regressions: a reply text that is not a string was once let through (openai) or escaped as TypeError.
    pytest.param("openai", Reply.raw({
        "id": "x", "object": "chat.completion", "created": 0, "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ["part"]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        id="openai-content-not-a-string"),
    pytest.param("anthropic", Reply.raw({
        "id": "m", "type": "message", "role": "assistant", "model": "test-model", "content": [{"type": "text"}],
        "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}),
        id="anthropic-text-block-without-text"),
]


@pytest.mark.parametrize(("provider", "reply"), MALFORMED)
def test_malformed_body_is_a_retryable_malformed_response_error(provider: str, reply: Reply,
                                                                server: WireServer) -> None:
    server.push(reply)

    with pytest.raises(MalformedResponseError) as caught:
        chat(make_model(provider, server))

    assert caught.value.retryable  # a transient fault of the provider's side, like a 5xx
    assert caught.value.args[0].startswith(f"{provider}:")
    assert len(server.requests) == 1


@pytest.mark.parametrize(("provider", "reply"), MALFORMED)
def test_malformed_body_then_a_good_one_recovers_on_retry(provider: str, reply: Reply, server: WireServer) -> None:
    server.push(reply, Reply.ok("made it"))
    model = ResilientModel(make_model(provider, server), FAST)

    assert chat(model).text == "made it"
    assert model.retries == 1
    assert len(server.requests) == 2
    assert server.bodies[0] == server.bodies[1]  # the same request, sent again


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_200_cut_off_in_transit_recovers_on_retry(provider: str, server: WireServer) -> None:
    # The status line and headers arrive, then the connection closes 20 bytes into the JSON body.
    server.push(replace(Reply.ok("lost"), cut_at=20), Reply.ok("made it"))
    model = ResilientModel(make_model(provider, server), FAST)

    assert chat(model).text == "made it"
    assert model.retries == 1
    assert [r.status for r in server.requests] == [200, 200]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_body_that_stays_malformed_gives_up_as_provider_exhausted(provider: str, server: WireServer) -> None:
    server.set_default(Reply.raw('{"choices": ['))
    model = ResilientModel(make_model(provider, server), RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.05))

    with pytest.raises(ProviderExhaustedError) as caught:
        chat(model)

    assert isinstance(caught.value.last_error, MalformedResponseError)
    assert not caught.value.retryable
    assert len(server.requests) == 3


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_error_is_a_request_error_and_not_retried(provider: str, status: int, server: WireServer) -> None:
    server.push(Reply.error(status, "max_tokens: too large"), Reply.ok("should not be fetched"))
    model = ResilientModel(make_model(provider, server), FAST, AdaptiveLimiter(8))

    with pytest.raises(ProviderRequestError) as caught:
        chat(model)

    assert not caught.value.retryable
    assert f"HTTP {status}" in str(caught.value)
    assert "max_tokens: too large" in str(caught.value)
    assert model.retries == 0
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unreachable_server_is_a_retryable_timeout_error(provider: str) -> None:
    with WireServer() as gone:
        pass  # started for a free port, then stopped: nothing listens there now
    model = make_model(provider, gone, timeout_s=2.0)

    with pytest.raises(ProviderTimeoutError) as caught:
        chat(model)

    assert caught.value.retryable


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "localhost:8000", "ftp://127.0.0.1/v1", "http://", "/v1"])
def test_a_base_url_that_is_not_an_http_url_is_refused_before_any_call(url: str) -> None:
    # Without a scheme the SDK reads it as a path: every call would fail as a "connection error", retried for minutes.
    with pytest.raises(ModelConfigError, match="not an http"):
        ModelOptions(base_url=url)


@pytest.mark.parametrize("timeout_s", [0, -5, float("nan"), float("inf")])
def test_a_request_timeout_that_is_not_a_positive_number_is_refused(timeout_s: float) -> None:
    with pytest.raises(ModelConfigError, match="request timeout"):
        ModelOptions(timeout_s=timeout_s)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_slow_server_is_a_retryable_timeout_error(provider: str, server: WireServer) -> None:
    server.set_delay(1.0)
    model = make_model(provider, server, timeout_s=0.2)

    with pytest.raises(ProviderTimeoutError) as caught:
        chat(model)

    assert caught.value.retryable
    assert "timed out" in str(caught.value)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stall", [
    pytest.param({"delay_s": 5.0}, id="hung"),
    # a byte every 0.25 s: no read ever waits long enough for the SDK's own timeout, yet the body never ends
    pytest.param({"trickle_s": 0.25}, id="trickling"),
])
def test_a_call_past_the_request_timeout_is_abandoned_and_retried(provider: str, stall: dict[str, float],
                                                                  server: WireServer) -> None:
    server.push(replace(Reply.ok("stuck"), **stall), Reply.ok("made it"))
    model = ResilientModel(make_model(provider, server, timeout_s=1.0), FAST)

    started = time.monotonic()
    response = chat(model)
    elapsed = time.monotonic() - started

    assert response.text == "made it"
    assert model.retries == 1 and len(server.requests) == 2
    assert 0.9 < elapsed < 4.0  # one request timeout, then a prompt answer; never the stalled reply's time


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_server_that_stays_hung_gives_up_within_the_timeouts(provider: str, server: WireServer) -> None:
    server.set_default(replace(Reply.ok("stuck"), trickle_s=0.25))
    model = ResilientModel(make_model(provider, server, timeout_s=0.5),
                           RetryPolicy(max_attempts=2, base_s=0.01, cap_s=0.05))

    started = time.monotonic()
    with pytest.raises(ProviderExhaustedError) as caught:
        chat(model)

    assert time.monotonic() - started < 3.0  # two abandoned calls of 0.5 s, not the minutes the body would take
    assert isinstance(caught.value.last_error, ProviderTimeoutError)
    assert "--request-timeout" in str(caught.value)
    assert len(server.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_flaky_server_all_concurrent_calls_succeed(provider: str, server: WireServer) -> None:
    server.flaky(0.3, statuses=(429, 500), seed=1234, default=Reply.ok("steady", usage=(3, 2)))
    server.set_delay(0.002)  # make calls overlap
    limiter = AdaptiveLimiter(8)
    # 12 attempts: a call failing 12 times in a row at a 30% rate is out of reach (0.3**12 * 40 < 1e-5).
    model = ResilientModel(make_model(provider, server), RetryPolicy(max_attempts=12, base_s=0.01, cap_s=0.05),
                           limiter)

    async def go() -> list[ChatResponse]:
        try:
            return await asyncio.gather(*[
                model.chat([{"role": "user", "content": f"task {i}"}], seed=i) for i in range(40)])
        finally:
            await model.aclose()

    responses = asyncio.run(go())

    assert [r.text for r in responses] == ["steady"] * 40
    statuses = [r.status for r in server.requests]
    assert statuses.count(200) == 40
    assert model.rate_limited == statuses.count(429) > 0
    assert model.retries == statuses.count(429) + statuses.count(500) > 0
    assert server.max_in_flight <= 8
    assert limiter.floor <= limiter.limit <= 8
    # every task's prompt reached the server and got its answer
    prompts = {json.dumps(b["messages"][-1]) for b, s in zip(server.bodies, statuses) if s == 200}
    assert len(prompts) == 40


# --- record and replay -----------------------------------------------------------------------------------------


def test_recorded_openai_responses_replay_identically(server: WireServer, tmp_path: Path) -> None:
    path = tmp_path / "recorded.jsonl"
    server.push(
        Reply.ok("Reading it.", tool_calls=[("read_file", {"path": "solution.py"})], usage=(40, 9)),
        Reply.ok("Fixed.", usage=(60, 3)),
    )
    turn_two = AFTER_TOOLS  # the same conversation, after the tool results came back

    async def record() -> list[ChatResponse]:
        model = RecordingModel(make_model("openai", server), path)
        try:
            return [await model.chat(AFTER_TOOLS[:3], [READ_FILE, RUN], temperature=0.3, seed=5),
                    await model.chat(turn_two, [READ_FILE, RUN], temperature=0.3, seed=5)]
        finally:
            await model.aclose()

    recorded = asyncio.run(record())
    assert recorded[0].tool_calls[0].arguments == {"path": "solution.py"}
    assert len(path.read_text().splitlines()) == 2

    async def replay() -> list[ChatResponse]:
        model = create_model(f"replay:{path}")
        try:
            return [await model.chat(AFTER_TOOLS[:3], [READ_FILE, RUN], temperature=0.3, seed=5),
                    await model.chat(turn_two, [READ_FILE, RUN], temperature=0.3, seed=5)]
        finally:
            await model.aclose()

    assert asyncio.run(replay()) == recorded
    assert len(server.requests) == 2  # replay never called out

    async def other_seed() -> ChatResponse:
        return await create_model(f"replay:{path}").chat(AFTER_TOOLS[:3], temperature=0.3, seed=6)

    with pytest.raises(ReplayMissError):
        asyncio.run(other_seed())


def test_openai_tool_arguments_sent_as_an_object_are_accepted(server: WireServer) -> None:
    server.push(Reply.raw({
        "id": "x", "object": "chat.completion", "created": 0, "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "run", "arguments": {"command": "ls"}}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}))
    model = make_model("openai", server)
    response = asyncio.run(model.chat([{"role": "user", "content": "go"}]))
    assert [(c.name, c.arguments, c.error) for c in response.tool_calls] == [("run", {"command": "ls"}, None)]


# --- what real OpenAI-compatible servers do differently (see tests/models/test_openai_real_server.py) ------------


def test_openai_asks_for_tool_choice_auto_whenever_tools_are_offered(server: WireServer) -> None:
    """llama-cpp-python's function-calling format reads a missing tool_choice as "none" and hides the tools."""
    server.push(Reply.ok("a"), Reply.ok("b"))
    chat(make_model("openai", server), tools=[READ_FILE, RUN])
    chat(make_model("openai", server))
    assert server.bodies[0]["tool_choice"] == "auto"
    assert "tool_choice" not in server.bodies[1] and "tools" not in server.bodies[1]


@pytest.mark.parametrize(("text", "prose"), [
    ('Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "solution.py"}}\n</tool_call>',
     "Let me look."),
    ('I will read it.\n```json\n{"name": "read_file", "arguments": {"path": "solution.py"}}\n```', "I will read it."),
    ('{"name": "read_file", "arguments": {"path": "solution.py"}}', ""),
    ('First I read the file.\n{"name": "read_file", "arguments": {"path": "solution.py"}}', "First I read the file."),
])
def test_openai_calls_written_in_the_text_are_read_when_the_server_parsed_none(text: str, prose: str,
                                                                              server: WireServer) -> None:
    server.push(Reply.ok(text, usage=(30, 12)))

    response = chat(make_model("openai", server), tools=[READ_FILE, RUN])

    assert [(c.name, c.arguments, c.error, c.origin) for c in response.tool_calls] == [
        ("read_file", {"path": "solution.py"}, None, "text")]
    assert response.text == prose
    assert response.tool_calls[0].id  # echoed back in the tool turn
    assert response.finish_reason == "stop"  # as the server said: it saw no call
    assert (response.usage.input_tokens, response.usage.output_tokens) == (30, 12)


def test_openai_json_in_the_text_is_an_answer_when_no_tools_are_offered_or_it_names_none(server: WireServer) -> None:
    call = '{"name": "read_file", "arguments": {"path": "solution.py"}}'
    other = '```json\n{"name": "factorial", "arguments": {"n": 0}}\n```'
    server.push(Reply.ok(call), Reply.ok(other))
    assert chat(make_model("openai", server)).text == call  # single-turn: no tools, so no calls
    response = chat(make_model("openai", server), tools=[READ_FILE, RUN])
    assert response.text == other and response.tool_calls == ()


def test_openai_native_calls_are_marked_native_and_their_text_is_not_read_again(server: WireServer) -> None:
    text = '<tool_call>{"name": "run", "arguments": {"command": "rm -rf /"}}</tool_call>'
    server.push(Reply.ok(text, tool_calls=[("read_file", {"path": "a.py"})]))
    response = chat(make_model("openai", server), tools=[READ_FILE, RUN])
    assert [(c.name, c.origin) for c in response.tool_calls] == [("read_file", "native")]
    assert response.text == text


def test_openai_legacy_function_call_missing_ids_and_absent_usage_are_read(server: WireServer) -> None:
    """What llama-cpp-python sends beside tool_calls, and what other compatible servers leave out."""
    server.push(
        Reply.raw({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
                   "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                       "role": "assistant", "content": None,
                       "function_call": {"name": "run", "arguments": '{"command": "ls"}'}}}]}),
        Reply.raw({"id": "chatcmpl-2", "object": "chat.completion", "created": 0, "model": "m",
                   "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                       "role": "assistant", "content": None, "tool_calls": [
                           {"id": None, "type": "function", "function": {"name": "run", "arguments": "{}"}},
                           {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "x"}'}}]}}],
                   "usage": None}),
    )
    legacy = chat(make_model("openai", server), tools=[READ_FILE, RUN])
    assert [(c.name, c.arguments, c.origin) for c in legacy.tool_calls] == [("run", {"command": "ls"}, "native")]
    assert legacy.usage.input_tokens == legacy.usage.output_tokens == 0
    unnamed = chat(make_model("openai", server), tools=[READ_FILE, RUN])
    ids = [c.id for c in unnamed.tool_calls]
    assert [c.name for c in unnamed.tool_calls] == ["run", "read_file"] and all(ids) and len(set(ids)) == 2


def test_the_context_window_error_of_llama_cpp_server_is_a_request_error(server: WireServer) -> None:
    """llama-cpp-python answers an over-long prompt with 400 context_length_exceeded: retrying cannot help."""
    server.push(Reply.error(400, "This model's maximum context length is 4096 tokens.",
                            code="context_length_exceeded", param="messages"))
    with pytest.raises(ProviderRequestError, match="maximum context length"):
        chat(make_model("openai", server), tools=[READ_FILE, RUN])
    assert len(server.requests) == 1


def test_the_agent_records_how_each_tool_call_arrived(server: WireServer, tmp_path: Path) -> None:
    """A call read from the text and a native one, through the agent into its stored events and a replay file."""
    from factory.rollouts import BranchStatus, ToolCallingAgent
    from factory.sandbox import SandboxSpec, create_sandbox
    from factory.store import ToolCallEvent, parse_event
    from factory.tasks import Task

    server.push(Reply.ok('```json\n{"name": "run", "arguments": {"command": "echo hi"}}\n```'),
                Reply.ok("", tool_calls=[("submit", {"answer": "done"})]))
    task = Task(id="t", prompt="Say hi with the shell, then submit.", files={"a.txt": "x"})
    record = tmp_path / "recorded.jsonl"

    async def go():
        model = RecordingModel(make_model("openai", server), record)
        try:
            async with create_sandbox("bwrap", SandboxSpec(files=task.files)) as sandbox:
                return await ToolCallingAgent(model).run(task, sandbox, temperature=0.0, seed=0)
        finally:
            await model.aclose()

    result = asyncio.run(go())
    assert result.status == BranchStatus.OK and result.final_answer == "done"
    calls = [e for e in result.events if isinstance(e, ToolCallEvent)]
    assert [(c.name, c.origin) for c in calls] == [("run", "text"), ("submit", "native")]
    stored = [parse_event({"kind": "tool_call", "seq": c.seq, "ts": c.ts, "payload": c.payload()}) for c in calls]
    assert [e.origin for e in stored] == ["text", "native"]
    assert parse_event({"kind": "tool_call", "seq": 0, "ts": calls[0].ts, "payload": {
        "id": "old", "name": "run", "arguments": {}, "error": None}}).origin is None  # stored before origins
    replayed = [ChatResponse.from_dict(json.loads(line)["response"]) for line in record.read_text().splitlines()]
    assert [c.origin for r in replayed for c in r.tool_calls] == ["text", "native"]


def test_a_500_saying_the_request_body_did_not_validate_is_not_retried(server: WireServer) -> None:
    """llama-cpp-python answers a body it cannot validate with 500: retrying would fail the same way each time."""
    server.push(Reply.raw({"error": {
        "message": "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages'), "
                   "'msg': 'Input should be a valid list', 'input': 'oops'}\n",
        "type": "internal_server_error", "param": None, "code": None}}, status=500))
    model = ResilientModel(make_model("openai", server), FAST)
    with pytest.raises(ProviderRequestError, match="validation error"):
        chat(model, tools=[READ_FILE])
    assert len(server.requests) == 1
    server.push(Reply.error(500, "llama_decode returned -3"), Reply.ok("recovered"))  # a real crash: retried
    assert chat(ResilientModel(make_model("openai", server), FAST)).text == "recovered"


def test_a_single_tool_call_in_both_fields_is_read_once(server: WireServer) -> None:
    """llama-cpp-python repeats a single call in the legacy ``function_call``: one call, not two."""
    server.push(Reply.ok(tool_calls=[("run", {"command": "ls"})]))
    response = chat(make_model("openai", server), tools=[RUN])
    assert [(c.name, c.arguments, c.origin) for c in response.tool_calls] == [("run", {"command": "ls"}, "native")]
