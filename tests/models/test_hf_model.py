"""The ``hf:`` provider: a real transformers checkpoint (the tiny offline model) generating in process."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from factory.errors import ModelConfigError, ModelError
from factory.models import ChatModel, ChatResponse, ModelOptions, create_model
from factory.rollouts import AGENT_TOOLS
from factory.store import Store

pytest.importorskip("transformers", reason="transformers (the 'train' extra) is not installed")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUESTION = [{"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "What is 17 + 25? Final: <number>"}]


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    model = create_model("hf:" + tiny_model, ModelOptions(threads=1, in_process=True))
    yield model
    asyncio.run(model.aclose())


def chat(model, messages, tools=None, **kwargs) -> ChatResponse:
    return asyncio.run(model.chat(messages, tools, **kwargs))


def test_spec_creates_a_model_that_generates_within_the_token_budget(hf_model, tiny_model):
    import torch

    assert isinstance(hf_model, ChatModel) and type(hf_model).__name__ == "HFChatModel"
    assert hf_model.spec == f"hf:{tiny_model}" and hf_model.path == tiny_model
    assert hf_model.device == ("cuda" if torch.cuda.is_available() else "cpu")
    response = chat(hf_model, QUESTION, temperature=0.7, seed=1, max_tokens=6)
    assert isinstance(response, ChatResponse)
    assert 0 < response.usage.output_tokens <= 6
    assert response.usage.input_tokens > 10 and response.usage.cost_usd == 0.0
    # A random model rarely hits <|im_end|> within 6 tokens; when it does not, the budget is why it stopped.
    assert response.finish_reason == ("length" if response.usage.output_tokens == 6 else "stop")


def test_same_seed_same_text_and_greedy_is_deterministic(hf_model):
    first = chat(hf_model, QUESTION, temperature=1.0, seed=7, max_tokens=12)
    again = chat(hf_model, QUESTION, temperature=1.0, seed=7, max_tokens=12)
    assert first.text == again.text and first.usage == again.usage
    others = {chat(hf_model, QUESTION, temperature=1.0, seed=seed, max_tokens=12).text for seed in range(8, 12)}
    assert others - {first.text}, "different seeds never changed the sample"
    greedy = [chat(hf_model, QUESTION, temperature=0.0, seed=seed, max_tokens=12).text for seed in (1, 2)]
    assert greedy[0] == greedy[1]


def test_concurrent_seeded_branches_reproduce_their_serial_outputs(hf_model):
    serial = [chat(hf_model, QUESTION, temperature=1.0, seed=seed, max_tokens=8).text for seed in range(4)]

    async def together():
        return await asyncio.gather(*(hf_model.chat(QUESTION, temperature=1.0, seed=seed, max_tokens=8)
                                      for seed in range(4)))

    assert [r.text for r in asyncio.run(together())] == serial


def test_tools_and_tool_turns_reach_the_prompt(hf_model):
    conversation = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "run", "arguments": {"command": "pytest -q"}}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "run", "content": "1 passed in 0.01s"},
    ]
    prompt = hf_model.render(conversation, AGENT_TOOLS)
    for tool in AGENT_TOOLS:
        assert f'"name": "{tool.name}"' in prompt
    assert '{"name": "run", "arguments": {"command": "pytest -q"}}' in prompt
    assert "1 passed in 0.01s" in prompt and prompt.endswith("<|im_start|>assistant\n")
    response = chat(hf_model, conversation, AGENT_TOOLS, temperature=0.7, seed=3, max_tokens=8)
    assert 0 < response.usage.output_tokens <= 8
    assert response.usage.input_tokens > chat(hf_model, QUESTION, temperature=0.0, max_tokens=1).usage.input_tokens


def test_missing_folder_is_a_config_error():
    with pytest.raises(ModelConfigError, match="/nonexistent/dir"):
        create_model("hf:/nonexistent/dir")


def test_folder_without_config_json_is_a_config_error(tmp_path):
    with pytest.raises(ModelConfigError, match="no config.json"):
        create_model(f"hf:{tmp_path}")


def test_tokenizer_without_chat_template_is_refused(tiny_model, tmp_path):
    folder = Path(shutil.copytree(tiny_model, tmp_path / "no-template"))
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="no chat template"):
        create_model(f"hf:{folder}")


def test_fork_with_an_hf_checkpoint_stores_its_branches(cli, tiny_model, write_jsonl, tmp_path):
    tasks = write_jsonl([{"id": "add", "prompt": "What is 17 + 25? Reply as `Final: <number>`.", "answer": "42"}])
    db = tmp_path / "hf.duckdb"
    result = cli("fork", tasks, "--model", f"hf:{tiny_model}", "--branches", 2, "--max-turns", 1,
                 "--max-tokens", 8, "--threads", 1, "--db", db, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["branches"] == 2 and summary["errors"] == 0
    with Store.open(db, read_only=True) as store:
        assert store.run(summary["run_id"])["model"] == f"hf:{tiny_model}"
        branches = store.branches(summary["run_id"])
        assert branches.height == 2
        assert all(0 < tokens <= 8 for tokens in branches["output_tokens"].to_list())


def test_prompt_past_the_context_is_a_model_error(hf_model):
    too_long = [{"role": "user", "content": "Final: 42\n" * 2000}]  # about 8,000 tokens; the tiny model takes 2,048
    with pytest.raises(ModelError, match="takes at most 2048 positions"):
        chat(hf_model, too_long, max_tokens=4)
