"""The tiny offline model: it loads and generates like a hub checkpoint, and its chat template fits TRL's needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the 'train' extra) is not installed")
transformers = pytest.importorskip("transformers", reason="transformers (the 'train' extra) is not installed")

from factory.errors import ConfigError  # noqa: E402
from factory.trainers import CHAT_TEMPLATE, build_tiny_model  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
PROMPT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Make the tests pass, then report the sum 17 + 25."},
]
# An agentic completion: a tool call (string arguments, as the exporter writes them), its result, an answer.
COMPLETION = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"command": "pytest -q"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "run", "content": "1 passed"},
    {"role": "assistant", "content": "Final: 42"},
]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here trains or runs the tiny model (see tests/conftest.py)."""


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tiny(arch, tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch=arch)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return transformers.AutoTokenizer.from_pretrained(tiny)


def test_reloads_and_generates_from_a_chat_prompt(arch, tiny, tokenizer):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny)
    assert model.config.model_type == arch
    assert model.dtype == torch.float32
    assert model.config.num_hidden_layers == 2
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id != tokenizer.eos_token_id

    inputs = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    prompt_length = inputs["input_ids"].shape[1]
    assert prompt_length < output.shape[1] <= prompt_length + 4
    assert tokenizer.decode(output[0, :prompt_length]).endswith("<|im_start|>assistant\n")


def test_tokenizer_is_byte_level_with_single_token_specials(tiny, tokenizer):
    text = 'héllo wörld 🙂\ndef f(x):\n    return {"a": x}  # Final: 42'
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer(special)["input_ids"]) == 1
    # A trained vocabulary, not a byte-per-token one: common corpus words are single tokens.
    assert tokenizer.tokenize("The tests pass. Final: 42")[:2] == ["The", "Ġtests"]
    # transformers may rebuild the pipeline from the model type (it does for qwen2); it must still match the file.
    from tokenizers import Tokenizer

    saved = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    for sample in (text, "What is 17 + 25? Final: 42", "<|im_start|>user\nhi<|im_end|>\n"):
        assert tokenizer(sample)["input_ids"] == saved.encode(sample).ids


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_prompt_with_generation_prompt_is_prefix_of_prompt_plus_completion(tokenizer, tools):
    prompt_text = tokenizer.apply_chat_template(PROMPT, tools=tools, tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(PROMPT + COMPLETION, tools=tools, tokenize=False)
    assert full_text.startswith(prompt_text)

    # TRL cuts the completion where the token sequences diverge, so the prefix must also hold for the ids.
    prompt_ids = tokenizer.apply_chat_template(PROMPT, tools=tools, add_generation_prompt=True, return_dict=True)
    full_ids = tokenizer.apply_chat_template(PROMPT + COMPLETION, tools=tools, return_dict=True)
    prompt_ids, full_ids = prompt_ids["input_ids"], full_ids["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids


def test_tools_render_into_the_system_turn(tokenizer):
    text = tokenizer.apply_chat_template(PROMPT, tools=TOOLS, tokenize=False)
    system_turn = text.split("<|im_end|>")[0]
    assert system_turn.startswith("<|im_start|>system\nYou are a coding agent.")
    assert json.dumps(TOOLS[0]) in system_turn
    # Without a system message the tools still get a system turn of their own.
    text = tokenizer.apply_chat_template(PROMPT[1:], tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools") and json.dumps(TOOLS[0]) in text


def test_string_tools_render_verbatim():
    # transformers' apply_chat_template only passes dict (or callable) tools to a template, so render directly.
    compile_template = pytest.importorskip("transformers.utils.chat_template_utils")._compile_jinja_template
    schema = json.dumps(TOOLS[0])
    text = compile_template(CHAT_TEMPLATE).render(messages=PROMPT, tools=[schema], add_generation_prompt=False)
    assert f"<tools>\n{schema}\n</tools>" in text


def test_assistant_mask_covers_exactly_the_assistant_turns(tokenizer):
    out = tokenizer.apply_chat_template(
        PROMPT + COMPLETION, tools=TOOLS, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [token for token, bit in zip(out["input_ids"], out["assistant_masks"]) if bit]
    assert masked
    assert tokenizer.decode(masked) == (
        '<tool_call>\n{"name": "run", "arguments": {"command": "pytest -q"}}\n</tool_call><|im_end|>Final: 42<|im_end|>'
    )


def test_template_tolerates_none_valued_keys_after_datasets_roundtrip(tokenizer, tmp_path):
    datasets = pytest.importorskip("datasets")
    keys = ("role", "content", "tool_calls", "tool_call_id", "name")

    def with_every_key(message):
        return {key: message.get(key) for key in keys}

    conversations = [
        PROMPT + COMPLETION,
        # content None, as OpenAI-style logs carry for a pure tool call; an id that is None.
        [
            PROMPT[1],
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": None, "type": "function", "function": {"name": "run", "arguments": '{"command": "ls"}'}}
                ],
            },
        ],
    ]
    # Messages written with every key (absent ones null) load as structs with None values; messages with differing
    # keys load as they were (datasets 5 keeps them as JSON). The template must render both the same.
    path = tmp_path / "rows.jsonl"
    rows = [{"messages": [with_every_key(m) for m in c]} for c in conversations]
    rows += [{"messages": c} for c in conversations]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert set(loaded[0]["messages"][0]) == set(keys) and loaded[0]["messages"][0]["tool_calls"] is None

    for row, conversation in zip(loaded, conversations + conversations):
        text = tokenizer.apply_chat_template(row["messages"], tools=TOOLS, tokenize=False)
        assert "None" not in text
        assert text == tokenizer.apply_chat_template(conversation, tools=TOOLS, tokenize=False)
    assert '{"name": "run", "arguments": {"command": "ls"}}' in text


def test_dict_and_string_arguments_render_the_same(tokenizer):
    def conversation(arguments):
        call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": arguments}}
        return [PROMPT[1], {"role": "assistant", "content": "", "tool_calls": [call]}]

    as_string = tokenizer.apply_chat_template(conversation('{"command": "pytest -q"}'), tokenize=False)
    as_dict = tokenizer.apply_chat_template(conversation({"command": "pytest -q"}), tokenize=False)
    assert as_string == as_dict


def test_same_seed_gives_identical_model_and_tokenizer(arch, tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again", arch=arch)
    other_seed = build_tiny_model(tmp_path / "other", arch=arch, seed=1)
    assert (again / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()

    def weights(path):
        return transformers.AutoModelForCausalLM.from_pretrained(path).state_dict()

    first, second, third = weights(tiny), weights(again), weights(other_seed)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not all(torch.equal(first[name], third[name]) for name in first)


def test_building_leaves_the_callers_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "tiny", layers=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("kwargs", [{"arch": "gpt2"}, {"hidden_size": 40}, {"layers": 0}, {"vocab_size": 100}], ids=str)
def test_rejects_unsupported_arguments(tmp_path, kwargs):
    with pytest.raises(ConfigError):
        build_tiny_model(tmp_path / "tiny", **kwargs)
