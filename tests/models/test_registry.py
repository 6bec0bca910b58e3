"""The model extension point: a provider registered by prefix is created like the built-in ones."""

from __future__ import annotations

import asyncio

import pytest

from factory.errors import ModelConfigError
from factory.models import MODELS, ChatModel, ChatResponse, ModelOptions, create_model, model_prefixes, register_model


class Echo:
    """A provider of our own: answers with the last user message."""

    def __init__(self, name: str, options: ModelOptions):
        self.spec = f"echo:{name}"
        self.options = options

    async def chat(self, messages, tools=None, *, temperature=0.7, seed=None, max_tokens=1024):
        return ChatResponse(messages[-1]["content"])

    async def aclose(self):
        return None


@pytest.fixture
def echo_provider(monkeypatch):
    monkeypatch.setattr(MODELS, "_entries", dict(MODELS._entries))  # registered for this test only
    assert register_model("echo")(Echo) is Echo


def test_the_built_in_providers_are_registered():
    assert {"openai", "anthropic", "vllm", "hf", "local", "replay"} <= set(model_prefixes())
    assert model_prefixes() == MODELS.names()


def test_a_registered_provider_is_created_by_its_prefix(echo_provider):
    assert "echo" in model_prefixes() and "echo" in MODELS
    model = create_model("echo:parrot", ModelOptions(timeout_s=5))
    assert isinstance(model, ChatModel) and model.spec == "echo:parrot" and model.options.timeout_s == 5
    assert asyncio.run(model.chat([{"role": "user", "content": "hello"}])).text == "hello"


def test_options_default_when_not_given(echo_provider):
    assert create_model("echo:x").options == ModelOptions()


def test_an_unregistered_prefix_lists_the_ones_there_are():
    with pytest.raises(ModelConfigError, match=r"unknown model provider 'echo' in 'echo:x' \(use one of: .*replay:"):
        create_model("echo:x")
