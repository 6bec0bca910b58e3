"""Our chat data (OpenAI shape) and its translation to each provider's wire, with no SDK installed."""

from __future__ import annotations

import json

import pytest

from factory.errors import ConfigError, ModelConfigError
from factory.models import (
    ChatResponse,
    ToolCall,
    ToolSpec,
    Usage,
    cost_usd,
    create_model,
)
from factory.models._anthropic import to_anthropic_messages
from factory.models._openai import to_openai_messages

CALL = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": {"command": "ls -a"}}}
CONVERSATION = [
    {"role": "system", "content": "You fix code."},
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Looking.", "tool_calls": [CALL, {**CALL, "id": "c2"}]},
    {"role": "tool", "tool_call_id": "c1", "name": "run", "content": "a.py"},
    {"role": "tool", "tool_call_id": "c2", "name": "run", "content": "b.py"},
    {"role": "assistant", "content": None},
    {"role": "user", "content": ""},
]


# ------------------------------------------------------------------ data classes

def test_usage_adds_tokens_and_keeps_cost_unknown_only_when_both_are():
    assert Usage(1, 2, 0.5) + Usage(10, 20, 0.25) == Usage(11, 22, 0.75)
    assert Usage(1, 2, None) + Usage(3, 4, 0.5) == Usage(4, 6, 0.5)
    assert (Usage(1, 2) + Usage(3, 4)).cost_usd is None


def test_chat_response_round_trips_through_plain_data():
    response = ChatResponse("done", (ToolCall("c1", "run", {"command": "ls"}), ToolCall("c2", "", {}, "bad JSON")),
                            Usage(7, 3, 0.001), "tool_calls")
    data = response.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert ChatResponse.from_dict(data) == response


def test_chat_response_from_sparse_data_takes_defaults():
    response = ChatResponse.from_dict({"tool_calls": [{"name": "submit", "arguments": None}]})
    assert response == ChatResponse("", (ToolCall("call_0", "submit", {}),), Usage(0, 0, None), None)


def test_tool_call_and_tool_spec_in_openai_form():
    assert ToolCall("c1", "run", {"command": "ls -a"}).as_message_part() == CALL
    spec = ToolSpec("run", "Run a command.", {"type": "object"})
    assert spec.openai_schema() == {"type": "function", "function": {
        "name": "run", "description": "Run a command.", "parameters": {"type": "object"}}}


# ------------------------------------------------------------------ OpenAI wire

def test_openai_wire_encodes_arguments_as_json_text_and_never_sends_null_content():
    wire = to_openai_messages(CONVERSATION)
    assert [m["role"] for m in wire] == [m["role"] for m in CONVERSATION]
    assistant = wire[3]
    assert assistant["content"] == "Looking."
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [{"command": "ls -a"}] * 2
    assert wire[4] == {"role": "tool", "tool_call_id": "c1", "name": "run", "content": "a.py"}
    assert wire[6] == {"role": "assistant", "content": ""}


def test_openai_wire_drops_keys_the_api_does_not_know():
    wire = to_openai_messages([{"role": "user", "content": "hi", "branch": 3, "meta": {"x": 1}}])
    assert wire == [{"role": "user", "content": "hi"}]


def test_openai_wire_does_not_change_the_input():
    before = json.dumps(CONVERSATION)
    to_openai_messages(CONVERSATION)
    assert json.dumps(CONVERSATION) == before


# ------------------------------------------------------------------ Anthropic wire

def test_anthropic_wire_moves_system_text_out_and_joins_it():
    system, wire = to_anthropic_messages(CONVERSATION)
    assert system == "You fix code.\n\nBe brief."
    assert all(m["role"] in ("user", "assistant") for m in wire)


def test_anthropic_wire_turns_tool_calls_into_blocks_and_merges_consecutive_results():
    _, wire = to_anthropic_messages(CONVERSATION)
    assert wire[0] == {"role": "user", "content": [{"type": "text", "text": "Fix it."}]}
    assert wire[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "c1", "name": "run", "input": {"command": "ls -a"}},
        {"type": "tool_use", "id": "c2", "name": "run", "input": {"command": "ls -a"}},
    ]}
    assert wire[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "c1", "content": "a.py"},
        {"type": "tool_result", "tool_use_id": "c2", "content": "b.py"},
    ]}


def test_anthropic_wire_never_sends_an_empty_text_block():
    _, wire = to_anthropic_messages(CONVERSATION)
    assert wire[3] == {"role": "assistant", "content": [{"type": "text", "text": "(no reply)"}]}
    assert wire[4] == {"role": "user", "content": [{"type": "text", "text": "(empty)"}]}


def test_anthropic_tool_result_after_a_user_text_starts_a_new_turn():
    _, wire = to_anthropic_messages([
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "c9", "content": "out"},
    ])
    assert [len(m["content"]) for m in wire] == [1, 1]


# ------------------------------------------------------------------ prices and specs

def test_cost_is_computed_from_the_price_table_per_million_tokens():
    assert cost_usd("openai", "gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.15 + 0.60)
    assert cost_usd("anthropic", "claude-opus-4-0", 2000, 1000) == pytest.approx((2000 * 15 + 1000 * 75) / 1e6)


def test_local_engines_are_free_and_unknown_models_unknown():
    assert cost_usd("local", "anything", 10**6, 10**6) == 0.0
    assert cost_usd("replay", "x.jsonl", 5, 5) == 0.0
    assert cost_usd("openai", "no-such-model", 10, 10) is None


def test_factory_prices_overrides_and_extends_the_table(monkeypatch):
    monkeypatch.setenv("FACTORY_PRICES", json.dumps({"openai:gpt-4o-mini": [1, 2], "openai:mine": [10, 0]}))
    assert cost_usd("openai", "gpt-4o-mini", 10**6, 10**6) == pytest.approx(3.0)
    assert cost_usd("openai", "mine", 500_000, 999) == pytest.approx(5.0)
    assert cost_usd("openai", "gpt-4o", 10**6, 0) == pytest.approx(2.50)  # untouched entries stay


@pytest.mark.parametrize("value", ["not json", '{"openai:x": 3}', '{"openai:x": ["a", 1]}', "[1, 2]"])
def test_malformed_factory_prices_is_a_config_error(monkeypatch, value):
    monkeypatch.setenv("FACTORY_PRICES", value)
    with pytest.raises(ConfigError, match="FACTORY_PRICES must be JSON"):
        cost_usd("openai", "gpt-4o", 1, 1)


def test_unknown_provider_prefix_names_the_ones_there_are():
    with pytest.raises(ModelConfigError, match=r"unknown model provider 'nope' in 'nope:model'.*replay:"):
        create_model("nope:model")
