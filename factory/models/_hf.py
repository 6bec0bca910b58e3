"""``hf:PATH``: a transformers causal-LM checkpoint run in this process.

``hf:DIR`` takes any local Hugging Face model folder, such as the merged
output of ``factory train``; anything else is passed to ``from_pretrained``
as a hub id (which needs network and the hub cache). The tokenizer must carry
a chat template (one without is refused: the prompt format would be a
guess). Prompts are rendered with that template, tools included, and
``<tool_call>`` blocks in the output become tool calls, as for the other
in-process engines. One model serves every branch, so calls are serialized;
``threads`` (or ``FACTORY_THREADS``) sets torch's CPU threads. Needs the
``train`` extra (torch and transformers); uses the GPU when there is one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from factory.errors import ModelConfigError, ModelError
from factory.models._base import ChatResponse, Message, ModelOptions, ToolSpec, Usage, register_model
from factory.models._text_tools import parse_text_tool_calls
from factory.outputs import unfinished_training

__all__ = ["HFChatModel"]


def _looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a folder here rather than a hub id."""
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


class HFChatModel:
    """A transformers ``AutoModelForCausalLM`` checkpoint generating in this process.

    Args:
        path: A local checkpoint folder, or a hub id.
        options: ``threads`` sets torch's CPU threads; the rest is unused.

    Attributes:
        spec: ``hf:`` followed by ``path``.
        path: The folder or hub id, as given.
        device: ``"cuda"`` or ``"cpu"``.

    Raises:
        ModelConfigError: transformers is not installed, the folder is not a
            checkpoint, the model cannot be loaded, or its tokenizer has no
            chat template.
    """

    def __init__(self, path: str, options: ModelOptions):
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise ModelConfigError("transformers is not installed: pip install 'factory-rlaif[train]'") from exc
        if not path:
            raise ModelConfigError("hf: needs a model folder or hub id, e.g. hf:./runs/sft/merged")
        source = path
        if _looks_local(path):
            folder = Path(path).expanduser()
            _check_folder(path)
            source = str(folder)
        threads = options.threads or int(os.environ.get("FACTORY_THREADS", "0"))
        if threads:
            torch.set_num_threads(threads)

        self._torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda":
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        else:
            dtype = torch.float32
        # The fork draws its own progress bar; transformers' loading bars would interleave with it.
        progress_bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()
        try:
            # The tokenizer first: it is cheap, and without a chat template the weights are not worth loading.
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(source)
            if not self._tokenizer.chat_template:
                raise ModelConfigError(f"hf: the tokenizer of {source} has no chat template; "
                                       "use a checkpoint saved with its chat template")
            self._model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        except (OSError, ValueError) as exc:  # missing files, no network, an unknown architecture
            raise ModelConfigError(f"hf: cannot load {source}: {exc}") from exc
        finally:
            if progress_bars:
                transformers.utils.logging.enable_progress_bar()
        self._model.to(self.device)
        self._model.eval()

        eos = self._model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self._tokenizer.eos_token_id is not None:
            eos_ids.add(self._tokenizer.eos_token_id)
        self._eos_ids = sorted(eos_ids)
        pad = self._tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else (self._eos_ids[0] if self._eos_ids else None)
        self._max_positions: int | None = getattr(self._model.config.get_text_config(), "max_position_embeddings",
                                                  None)
        self._lock = asyncio.Lock()
        self.path = path
        self.spec = f"hf:{path}"

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None) -> str:
        """The prompt text the model sees.

        Raises:
            ModelError: The chat template refused the conversation.
        """
        from jinja2 import TemplateError  # comes with transformers

        try:
            return self._tokenizer.apply_chat_template(
                list(messages), tools=[t.openai_schema() for t in tools] if tools else None,
                add_generation_prompt=True, tokenize=False,
            )
        except TemplateError as exc:
            raise ModelError(f"hf: the chat template of {self.path} failed: {exc}") from exc

    def _generate(self, input_ids: Any, temperature: float, seed: int | None, max_new_tokens: int) -> list[int]:
        torch = self._torch
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 0.95}
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            output = self._model.generate(
                input_ids=input_ids.to(self.device), attention_mask=torch.ones_like(input_ids).to(self.device),
                max_new_tokens=max_new_tokens, eos_token_id=self._eos_ids or None, pad_token_id=self._pad_id,
                **sampling,
            )
        return output[0, input_ids.shape[1]:].tolist()

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        *,
        temperature: float = 0.7,
        seed: int | None = None,
        max_tokens: int = 1024,
    ) -> ChatResponse:
        if self._model is None:
            raise ModelError(f"hf: {self.path} was closed")
        prompt = self.render(messages, tools)
        # The template writes any BOS itself; letting the tokenizer add one would double it.
        input_ids = self._tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        prompt_tokens = int(input_ids.shape[1])
        budget = max_tokens
        if self._max_positions is not None:
            if prompt_tokens >= self._max_positions:
                raise ModelError(f"hf: the prompt is {prompt_tokens} tokens, but {self.path} takes at most "
                                 f"{self._max_positions} positions")
            budget = min(max_tokens, self._max_positions - prompt_tokens)
        # Under the lock, so that seeding the global RNG and sampling happen together for each branch.
        async with self._lock:
            try:
                new_tokens = await asyncio.to_thread(self._generate, input_ids, temperature, seed, budget)
            except (RuntimeError, ValueError) as exc:  # e.g. CUDA out of memory
                raise ModelError(f"hf: generation failed: {exc}") from exc
        stopped = bool(new_tokens) and new_tokens[-1] in self._eos_ids
        finish_reason = "length" if len(new_tokens) >= budget and not stopped else "stop"
        raw = self._tokenizer.decode(new_tokens, skip_special_tokens=True)
        if tools:
            text, calls = parse_text_tool_calls(raw, known_tools=frozenset(t.name for t in tools))
        else:
            text, calls = raw.strip(), ()
        return ChatResponse(text=text, tool_calls=calls, usage=Usage(prompt_tokens, len(new_tokens), 0.0),
                            finish_reason=finish_reason)

    async def aclose(self) -> None:
        async with self._lock:  # never free the weights under a running generation
            self._model = None
        if self.device == "cuda":
            self._torch.cuda.empty_cache()


@register_model("hf", child_process=True)
def _create(name: str, options: ModelOptions) -> HFChatModel:
    return HFChatModel(name, options)


def _precheck(name: str) -> None:
    """In the fork's process, before the engine's child starts: a local folder is a checkpoint."""
    if not name:
        raise ModelConfigError("hf: needs a model folder or hub id, e.g. hf:./runs/sft/merged")
    if _looks_local(name):
        _check_folder(name)


def _check_folder(name: str) -> None:
    """A local folder is a checkpoint, and not one ``factory train`` never finished writing."""
    if not (Path(name).expanduser() / "config.json").is_file():
        raise ModelConfigError(f"hf: {name} is not a transformers checkpoint (no config.json in it)")
    unfinished = unfinished_training(name)
    if unfinished is not None:
        raise ModelConfigError(f"hf: {unfinished}")


_create.precheck = _precheck  # type: ignore[attr-defined]
