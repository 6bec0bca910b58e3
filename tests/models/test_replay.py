"""``replay:FILE``: recorded and scripted responses, matched by request, never a call out."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from factory.errors import ModelConfigError, ReplayMissError
from factory.models import ChatResponse, RecordingModel, ReplayModel, ToolCall, Usage, create_model, request_key

OPENING = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 17 + 25?"}]


def write(path: Path, *lines: object) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def ask(model, messages, **options):
    return asyncio.run(model.chat(messages, **options))


# ------------------------------------------------------------------ request_key


def test_request_key_depends_on_opening_turn_temperature_and_seed():
    key = request_key(OPENING, 0.7, 1)
    assert key == request_key([dict(m) for m in OPENING], 0.7, 1)  # a value, not an identity
    assert key != request_key(OPENING, 0.7, 2)
    assert key != request_key(OPENING, 0.2, 1)
    assert key != request_key(OPENING[:1] + [{"role": "user", "content": "What is 1 + 1?"}], 0.7, 1)
    later = OPENING + [{"role": "assistant", "content": "Let me run it."}, {"role": "tool", "content": "42"}]
    assert key != request_key(later, 0.7, 1)  # turn 1, not turn 0


def test_request_key_ignores_what_follows_the_opening_within_a_turn():
    """Tool outputs (timings, say) differ between runs; the same turn of the same task still replays."""
    run_a = OPENING + [{"role": "assistant", "content": "t"}, {"role": "tool", "content": "took 0.51s"}]
    run_b = OPENING + [{"role": "assistant", "content": "t"}, {"role": "tool", "content": "took 0.73s"}]
    assert request_key(run_a, 0.7, 3) == request_key(run_b, 0.7, 3)


def test_request_key_rounds_temperature_noise():
    assert request_key(OPENING, 0.7, None) == request_key(OPENING, 0.70000000001, None)


# ------------------------------------------------------------------ scripted lines


def test_scripted_lines_filter_by_prompt_and_turn(tmp_path):
    path = write(tmp_path / "r.jsonl",
                 {"prompt_contains": "17 + 25", "turn": 0, "response": {"text": "first turn"}},
                 {"prompt_contains": "17 + 25", "turn": 1, "response": {"text": "second turn"}},
                 {"prompt_contains": "capital", "response": {"text": "Paris"}})
    model = ReplayModel(path)
    assert model.spec == f"replay:{path}"
    assert ask(model, OPENING).text == "first turn"
    assert ask(model, OPENING + [{"role": "assistant", "content": "x"}]).text == "second turn"
    assert ask(model, [{"role": "user", "content": "The capital of France?"}]).text == "Paris"


def test_the_seed_picks_among_several_matches_deterministically(tmp_path):
    path = write(tmp_path / "r.jsonl", {"response": {"text": "a"}}, {"response": {"text": "b"}},
                 {"response": {"text": "c"}})
    model = ReplayModel(path)
    assert [ask(model, OPENING, seed=s).text for s in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert ask(model, OPENING, seed=None).text == "a"


def test_a_request_nothing_matches_is_a_replay_miss(tmp_path):
    model = ReplayModel(write(tmp_path / "r.jsonl", {"prompt_contains": "capital", "response": {"text": "Paris"}}))
    with pytest.raises(ReplayMissError, match=r"no response recorded for turn 0 of prompt 'What is 17 \+ 25\?'"):
        ask(model, OPENING)


def test_responses_carry_tool_calls_and_usage(tmp_path):
    line = {"response": {"text": "", "tool_calls": [{"name": "run", "arguments": {"command": "ls"}}],
                         "usage": {"input_tokens": 12, "output_tokens": 4}, "finish_reason": "tool_calls"}}
    response = ask(ReplayModel(write(tmp_path / "r.jsonl", line)), OPENING)
    assert response == ChatResponse("", (ToolCall("call_0", "run", {"command": "ls"}),), Usage(12, 4, None),
                                    "tool_calls")


def test_delay_s_simulates_latency(tmp_path):
    model = ReplayModel(write(tmp_path / "r.jsonl", {"delay_s": 0.3, "response": {"text": "slow"}}))
    start = time.monotonic()
    assert ask(model, OPENING).text == "slow"
    assert time.monotonic() - start >= 0.3


@pytest.mark.parametrize(("line", "problem"), [
    ("not json", "r.jsonl:2: "),
    ("[1, 2]", "r.jsonl:2: expected a JSON object"),
    ({"text": "no response key"}, "r.jsonl:2: field 'response': expected an object"),
    ({"response": "text"}, "r.jsonl:2: field 'response': expected an object"),
    ({"turn": "0", "response": {"text": "x"}}, "r.jsonl:2: field 'turn': expected an integer"),
    ({"delay_s": "soon", "response": {"text": "x"}}, "r.jsonl:2: "),
])
def test_a_bad_line_is_a_config_error_naming_file_and_line(tmp_path, line, problem):
    path = write(tmp_path / "r.jsonl", {"response": {"text": "fine"}}, line)
    with pytest.raises(ModelConfigError, match=f"{tmp_path}/{problem}"):
        ReplayModel(path)


def test_an_empty_or_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ModelConfigError, match="holds no responses"):
        ReplayModel(write(tmp_path / "empty.jsonl", "", "   "))
    with pytest.raises(ModelConfigError, match="No such file"):
        ReplayModel(tmp_path / "absent.jsonl")


def test_the_replay_prefix_builds_a_replay_model(tmp_path):
    path = write(tmp_path / "r.jsonl", {"response": {"text": "hi"}})
    model = create_model(f"replay:{path}")
    assert isinstance(model, ReplayModel) and ask(model, OPENING).text == "hi"
    with pytest.raises(ModelConfigError, match="replay: needs a file"):
        create_model("replay:")


# ------------------------------------------------------------------ recording


def test_what_a_recording_model_writes_replays_identically(tmp_path):
    script = write(tmp_path / "script.jsonl", {"response": {"text": "a", "usage": {"input_tokens": 3}}},
                   {"response": {"text": "b"}})
    recording = tmp_path / "recorded.jsonl"

    async def record():
        model = RecordingModel(ReplayModel(script), recording)
        answers = [await model.chat(OPENING, seed=seed, temperature=0.5) for seed in (0, 1)]
        await model.aclose()
        return answers

    originals = asyncio.run(record())
    lines = [json.loads(line) for line in recording.read_text().splitlines()]
    assert [(line["turn"], line["model"], line["key"]) for line in lines] == [
        (0, f"replay:{script}", request_key(OPENING, 0.5, 0)), (0, f"replay:{script}", request_key(OPENING, 0.5, 1))]
    replayed = ReplayModel(recording)
    assert [ask(replayed, OPENING, seed=seed, temperature=0.5) for seed in (0, 1)] == originals
    with pytest.raises(ReplayMissError):  # recorded lines match by key only
        ask(replayed, OPENING, seed=2, temperature=0.5)


def test_recording_into_an_unwritable_place_is_a_config_error(tmp_path):
    inner = ReplayModel(write(tmp_path / "r.jsonl", {"response": {"text": "x"}}))
    with pytest.raises(ModelConfigError, match="cannot record to"):
        RecordingModel(inner, tmp_path / "no" / "such" / "dir" / "out.jsonl")
