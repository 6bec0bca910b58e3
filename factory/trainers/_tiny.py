"""A tiny causal language model built offline, for exercising the training stack without a model hub.

:func:`build_tiny_model` trains a byte-level BPE tokenizer on a small built-in corpus, attaches a ChatML chat
template that renders tools, tool calls and tool results, and saves a randomly initialised two-layer Llama or
Qwen2 model beside it. The folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any checkpoint, so
tests and dry runs go through exactly the code paths a real model would, in a few seconds on a CPU.

:func:`ensure_tiny_model` is what ``factory train NAME --model tiny`` loads: the same model, built once into the
cache under ``FACTORY_HOME`` (``models/tiny-<digest>``, the digest of everything that shapes it) and reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from factory.errors import ConfigError

__all__ = ["CHAT_TEMPLATE", "TINY_SPEC", "build_tiny_model", "ensure_tiny_model", "tiny_model_dir"]

#: The policy spec that names the cached tiny model (``factory train dpo --model tiny``).
TINY_SPEC = "tiny"

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"

# ChatML, as Qwen2.5 renders it, with three changes that training needs:
# - every assistant turn, its closing <|im_end|> included, sits inside {% generation %} so that
#   `return_assistant_tokens_mask=True` marks it, and SFT's assistant-only loss teaches the model to stop;
# - the assistant header ends with "\n" outside the generation block, so a prompt rendered with
#   `add_generation_prompt=True` is an exact string prefix of the prompt followed by its completion (DPO, KTO and
#   SFT's prompt-completion format cut the completion where the two tokenizations diverge);
# - None-valued fields are treated as absent: when `datasets` loads a message column as structs (always in older
#   releases; in datasets 5 when every message has the same keys), each message carries the union of all keys,
#   the missing ones None. transformers drops None only at the top level of a message, not inside a tool call.
# Tool-call ids are not rendered: they are arbitrary, and the model should not learn to invent them.
CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' and part.text is not none -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_tool_call(tool_call) -%}
    {%- if tool_call.function is defined and tool_call.function is not none -%}
        {%- set call = tool_call.function -%}
    {%- else -%}
        {%- set call = tool_call -%}
    {%- endif -%}
    {{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' -}}
    {%- if call.arguments is string -%}
        {{- call.arguments -}}
    {%- elif call.arguments is mapping -%}
        {{- call.arguments | tojson -}}
    {%- else -%}
        {{- '{}' -}}
    {%- endif -%}
    {{- '}\n</tool_call>' -}}
{%- endmacro -%}
{%- set ns = namespace(first=0) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = render_content(messages[0].content) -%}
    {%- set ns.first = 1 -%}
{%- else -%}
    {%- set system_text = none -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system_text -%}
        {{- system_text + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more of these functions:\n<tools>' -}}
    {%- for tool in tools -%}
        {%- if tool is string -%}
            {{- '\n' + tool -}}
        {%- else -%}
            {{- '\n' + (tool | tojson) -}}
        {%- endif -%}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call a function, reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.' -}}
    {{- '<|im_end|>\n' -}}
{%- elif system_text is not none -%}
    {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- if message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- generation -%}
            {{- render_content(message.content) -}}
            {%- if message.tool_calls -%}
                {%- for tool_call in message.tool_calls -%}
                    {%- if message.content or not loop.first -%}
                        {{- '\n' -}}
                    {%- endif -%}
                    {{- render_tool_call(tool_call) -}}
                {%- endfor -%}
            {%- endif -%}
            {{- '<|im_end|>' -}}
        {%- endgeneration -%}
        {{- '\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>tool' -}}
        {%- if message.name -%}
            {{- ' name=' + message.name -}}
        {%- endif -%}
        {{- '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()

# Enough text of each kind the factory's data carries (prose, Python, arithmetic with a "Final:" line, JSON tool
# calls) for the BPE merges to cover it; the model is random, so only the tokenizer learns from this.
_CORPUS = r"""
You are a careful assistant. Answer the question, then give the result on a line that starts with Final:.
The quick brown fox jumps over the lazy dog. A verifier checks every branch of the run before it is ranked.
Please fix the failing test in the repository and explain what you changed.
The tests pass now. I changed the loop bound so the last element is included.
What is 17 + 25? Final: 42
What is 9 * 8? Final: 72
What is 144 / 12? Final: 12
What is 100 - 37? Final: 63
What is 3 + 4 * 5? Multiply first: 4 * 5 = 20, then 3 + 20 = 23. Final: 23
Compute 2 ** 10. Final: 1024
def add(a: int, b: int) -> int:
    return a + b


def fibonacci(n: int) -> list[int]:
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


class Stack:
    def __init__(self) -> None:
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()


import json
from pathlib import Path

for i in range(10):
    print(f"{i}: {i * i}")
assert add(2, 3) == 5
<tool_call>
{"name": "run", "arguments": {"command": "pytest -q"}}
</tool_call>
<tool_call>
{"name": "read_file", "arguments": {"path": "src/app.py"}}
</tool_call>
<tool_call>
{"name": "write_file", "arguments": {"path": "src/app.py", "content": "print('hello')"}}
</tool_call>
{"type": "function", "function": {"name": "run", "description": "Run a shell command.", "parameters": {"type": "object",
"properties": {"command": {"type": "string"}}, "required": ["command"]}}}
{"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{\"command\": \"ls\"}"}}
1 passed in 0.01s
2 failed, 3 passed in 0.12s
FAILED tests/test_app.py::test_add - AssertionError: assert 4 == 5
Traceback (most recent call last):
  File "main.py", line 3, in <module>
ValueError: invalid literal for int() with base 10: 'abc'
# Tools
You may call one or more of these functions:
<tools>
</tools>
system user assistant tool name=run
"""


# The pre-tokenizer split of Qwen2 (and GPT-4): digits stand alone, so arithmetic tokenizes digit by digit.
# transformers 5 rebuilds a qwen2 checkpoint's tokenizer with exactly this pipeline (NFC, this split, byte-level
# without its own regex), whatever tokenizer.json says; training every arch's tokenizer with it means the saved
# tokenizer encodes the same way however it is loaded.
_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on the built-in corpus, wrapped for transformers."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special_tokens = [END_OF_TEXT, IM_START, IM_END]
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        # The full byte alphabet, so that any text (not only the corpus's characters) encodes without unknowns.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in _CORPUS.splitlines() if line.strip()]
    backend.train_from_iterator(lines, trainer=trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=2048,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _model_config(arch: str, *, vocab_size: int, hidden_size: int, layers: int, eos_id: int, pad_id: int):
    """A tiny config of the requested architecture (``"llama"`` or ``"qwen2"``)."""
    from transformers import LlamaConfig, Qwen2Config

    heads = max(1, hidden_size // 16)
    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        # Grouped-query attention whenever the head count allows it, as in the models this one stands in for.
        "num_key_value_heads": heads // 2 if heads % 2 == 0 else heads,
        "max_position_embeddings": 2048,
        # Like Qwen2.5, there is no BOS token: <|endoftext|> stands in for it in the config only.
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "tie_word_embeddings": True,
    }
    if arch == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common, use_sliding_window=False)


def build_tiny_model(
    out_dir: str | Path,
    *,
    arch: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a tiny, randomly initialised causal LM with a trained tokenizer and a ChatML chat template.

    The folder holds everything ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``
    need: config, float32 weights, generation config, tokenizer files and the chat template. Building takes a few
    seconds on a CPU, and the same arguments always give the same tokenizer and weights. The global torch RNG of
    the caller is left as it was.

    Args:
        out_dir: Folder to write (created if missing; existing model files in it are overwritten).
        arch: ``"llama"`` (``LlamaForCausalLM``) or ``"qwen2"`` (``Qwen2ForCausalLM``).
        vocab_size: Upper bound on the tokenizer's vocabulary, special tokens included; the built-in corpus
            supports about 770 before BPE runs out of merges. The model's embedding matches the trained size.
        hidden_size: Model width; a multiple of 16 (one attention head per 16 dimensions).
        layers: Number of transformer layers.
        seed: Seed for the weight initialisation.

    Returns:
        The folder, as a ``Path``.

    Raises:
        ConfigError: ``arch`` is not supported, or a size cannot make a model.
    """
    if hidden_size < 16 or hidden_size % 16:
        raise ConfigError(f"hidden_size must be a positive multiple of 16, got {hidden_size}")
    if layers < 1:
        raise ConfigError(f"layers must be at least 1, got {layers}")
    if vocab_size < 260:
        raise ConfigError(f"vocab_size must cover the 256 bytes and the special tokens (>= 260), got {vocab_size}")
    if arch not in ("llama", "qwen2"):
        raise ConfigError(f"unknown arch {arch!r}: expected 'llama' or 'qwen2'")

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config = _model_config(
        arch, vocab_size=len(tokenizer), hidden_size=hidden_size, layers=layers, eos_id=eos_id, pad_id=pad_id
    )

    # A private RNG stream: seeding the global one would change what the caller draws next.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_model_dir(**options: object) -> Path:
    """Where :func:`ensure_tiny_model` keeps the tiny model built with ``options`` (not created here).

    The folder's name carries a digest of the chat template, the corpus, the options and the transformers and torch
    versions, so a change to any of them builds a fresh model instead of reusing a stale one.
    """
    from importlib import metadata

    from factory.settings import factory_home

    versions = {}
    for package in ("transformers", "torch", "tokenizers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    shape = json.dumps({"template": CHAT_TEMPLATE, "corpus": _CORPUS, "regex": _PRETOKENIZE_REGEX,
                        "options": options, "versions": versions}, sort_keys=True)
    return factory_home() / "models" / f"tiny-{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


def ensure_tiny_model(**options: object) -> Path:
    """The tiny model (see :func:`build_tiny_model`), built on first use into the cache and reused after.

    The model is built in a temporary folder beside its place and renamed into it once complete, so an interrupted
    build leaves nothing that looks finished, and two processes building at once both end with the same model.

    Args:
        **options: :func:`build_tiny_model`'s keyword arguments (default: its defaults).

    Returns:
        The folder, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``.

    Raises:
        ConfigError: An option cannot make a model, or the cache cannot be written.
    """
    target = tiny_model_dir(**options)
    if (target / "config.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(f"cannot write the tiny model's cache in {target.parent}: {exc}") from exc
    try:
        build_tiny_model(staging, **options)  # type: ignore[arg-type]
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent build that finished first
                raise
    except OSError as exc:
        raise ConfigError(f"cannot write the tiny model's cache in {target.parent}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
