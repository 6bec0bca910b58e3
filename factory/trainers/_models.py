"""The policy a trainer starts from: where it comes from, how it loads, how LoRA wraps it, how it is saved.

A policy spec names one of four sources (:func:`resolve_policy`):

- ``tiny``: the tiny offline model the tests use (a two-layer Llama with a ChatML template), built once into the
  cache under ``FACTORY_HOME``, so that every trainer can be tried in seconds on a laptop (a folder named
  ``tiny`` is written ``./tiny``);
- ``local`` (also ``local:`` and ``gguf:default``): the embedded Qwen2.5-Coder-0.5B-Instruct GGUF that
  ``factory fork --model local`` runs, joined from its packages on first use;
- a ``.gguf`` file (also as ``local:FILE`` or ``gguf:FILE``, the spellings the rollout side takes);
- a Hugging Face checkpoint: a folder holding ``config.json``, or a hub id ``owner/name``, optionally written
  ``hf:DIR`` as ``factory fork --model hf:DIR`` takes it.

:func:`load_policy` loads any of them with transformers. A GGUF file is read through transformers' GGUF support
and dequantized into an ordinary dense model; the quantizer state transformers attaches to a GGUF-loaded model
(``hf_quantizer``, ``is_quantized``, ``quantization_method``, ``config.quantization_config``) is then removed,
because with it ``Trainer`` refuses to train the model ("purely quantized" without adapters, "GGUF does not
support training" with them) and ``save_pretrained`` refuses to write it ("not serializable"), although every
weight is plain float by then. :func:`save_policy` writes what training produced: the LoRA adapter, and a merged
full checkpoint that ``AutoModelForCausalLM.from_pretrained`` (and ``factory fork --model hf:DIR``) loads.

torch, transformers and peft are imported inside the functions that use them.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.outputs import unfinished_training
from factory.provenance import file_sha256
from factory.trainers._tiny import TINY_SPEC, ensure_tiny_model

__all__ = ["PolicySource", "apply_lora", "is_peft_model", "load_policy", "resolve_policy", "save_policy"]

TRAIN_INSTALL = "pip install 'factory-rlaif[train]'"

# Spellings of the embedded default, as `factory fork --model` takes them (plus one that names the format).
_DEFAULT_SPECS = ("local", "local:", "gguf:default")
# Prefixes that name a GGUF file, as the rollout side spells them.
_GGUF_PREFIXES = ("local:", "gguf:")
_HF_PREFIX = "hf:"
# A Hugging Face hub repo id: owner/name, each part starting with a letter or digit.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}


@dataclass(frozen=True)
class PolicySource:
    """Where a policy's weights come from, resolved from what the user wrote.

    Attributes:
        spec: The spec as the user gave it (``local``, ``hf:./runs/sft/model``, ``Qwen/Qwen2.5-0.5B-Instruct``).
        kind: ``"folder"`` (a local checkpoint), ``"hub"`` (a hub id, fetched by transformers) or ``"gguf"``.
        path: The absolute folder path, the hub id, or the absolute GGUF file path.
        sha256: Digest of the GGUF file; ``None`` for folders and hub ids.
    """

    spec: str
    kind: str
    path: str
    sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The source as JSON-ready provenance."""
        return asdict(self)


def _gguf_source(spec: str, name: str) -> PolicySource:
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"policy {spec!r}: no GGUF file at {path}")
    return PolicySource(spec=spec, kind="gguf", path=str(path.resolve()), sha256=file_sha256(path))


def resolve_policy(spec: str) -> PolicySource:
    """Work out what a policy spec names, checking that it exists; nothing is loaded.

    Args:
        spec: ``tiny`` for the tiny offline model (built once into the cache, see :func:`ensure_tiny_model`);
            ``local`` / ``local:`` / ``gguf:default`` for the embedded default GGUF; a path ending ``.gguf``
            (optionally prefixed ``local:`` or ``gguf:``); a checkpoint folder holding ``config.json``; or a hub
            id ``owner/name``. Folders and hub ids may be prefixed ``hf:``, as ``factory fork --model`` takes them.
            An existing folder wins over a hub id of the same spelling.

    Returns:
        The resolved source. A GGUF file's sha256 is computed (the embedded default's is the pinned one, already
        checked when it was joined).

    Raises:
        ConfigError: The file or folder does not exist, the folder is not a checkpoint, or the spec is neither
            a path nor a hub id.
        ModelConfigError: ``local``, but the embedded weights' packages are not installed (exit code 2 too).
    """
    text = spec.strip()
    if text == TINY_SPEC:  # the tiny offline model the tests use, built once into the cache
        return PolicySource(spec=spec, kind="folder", path=str(ensure_tiny_model().resolve()))
    if text in _DEFAULT_SPECS:
        from factory.models import DEFAULT_WEIGHTS, ensure_weights

        return PolicySource(spec=spec, kind="gguf", path=str(ensure_weights()), sha256=DEFAULT_WEIGHTS.sha256)
    for prefix in _GGUF_PREFIXES:
        if text.startswith(prefix):
            return _gguf_source(spec, text[len(prefix):])
    name = text[len(_HF_PREFIX):] if text.startswith(_HF_PREFIX) else text
    if not name:
        raise ConfigError(f"policy {spec!r}: give a model folder, a .gguf file, 'local', or a hub id owner/name")
    if name.endswith(".gguf"):
        return _gguf_source(spec, name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"policy {spec!r}: {path} is not a model folder (it has no config.json)")
        unfinished = unfinished_training(path)
        if unfinished is not None:
            raise ConfigError(f"policy {spec!r}: {unfinished}")
        return PolicySource(spec=spec, kind="folder", path=str(path.resolve()))
    if path.exists():
        raise ConfigError(f"policy {spec!r}: {path} is neither a model folder nor a .gguf file")
    if _HUB_ID.fullmatch(name):
        return PolicySource(spec=spec, kind="hub", path=name)
    raise ConfigError(f"policy {spec!r}: no such folder or file {path} (and not a hub id of the form owner/name)")


def _torch_dtype(dtype: Any):
    """The dtype to load in: the one asked for, else bfloat16 on a CUDA device that has it, else float32."""
    import torch

    if dtype is None:
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    name = _DTYPE_NAMES.get(str(dtype).lower().removeprefix("torch."))
    if name is None:
        raise ConfigError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return getattr(torch, name)


def _dtype_keyword() -> str:
    """``from_pretrained``'s dtype argument: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    major, minor = (int(part) for part in re.findall(r"\d+", metadata.version("transformers"))[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _dequantize_config() -> Any:
    """A ``GgufConfig`` asking for dense weights, on transformers versions that have one (else ``None``).

    Without it, transformers may keep GGUF blocks packed in ``GgufLinear`` modules (when the ``kernels`` package
    serves the file's architecture), which cannot be trained or saved.
    """
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        return None
    try:
        return GgufConfig(dequantize=True)
    except TypeError:  # an older GgufConfig without the option; those versions always dequantize
        return None


def _drop_quantization_state(model: Any) -> None:
    """Forget the GGUF quantizer on a model whose weights are all dense floats.

    Mirrors ``HfQuantizer.remove_quantization_config`` (what transformers itself does for ``dequantize=True``),
    for the versions and paths that leave the state behind.
    """
    from transformers import PreTrainedModel

    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    model.is_quantized = False
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            for attr in ("quantization_config", "_is_quantized"):
                if hasattr(module.config, attr):
                    delattr(module.config, attr)


def _load_errors() -> tuple[type[BaseException], ...]:
    """What ``from_pretrained`` raises for a checkpoint that is missing, unreachable or damaged."""
    errors: tuple[type[BaseException], ...] = (OSError, ValueError)
    try:
        from safetensors import SafetensorError
    except ImportError:
        return errors
    return (*errors, SafetensorError)


def _gguf_chat_template(path: Path) -> str | None:
    from factory.models import read_gguf_metadata

    template = read_gguf_metadata(path).get("tokenizer.chat_template")
    return template if isinstance(template, str) and template.strip() else None


def load_policy(source: PolicySource, *, dtype: Any = None, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """Load a policy and its tokenizer with transformers, ready to train.

    A GGUF file is dequantized into a dense model and its quantizer state is removed (see the module docstring),
    so ``Trainer`` trains it and ``save_pretrained`` writes it. Its chat template comes from the file. The model
    stays on the CPU; the trainer moves it.

    Args:
        source: What :func:`resolve_policy` returned.
        dtype: A ``torch.dtype`` or its name (``float32``, ``bfloat16``/``bf16``, ``float16``/``fp16``).
            Default: bfloat16 on a CUDA device that supports it, else float32.
        trust_remote_code: Let transformers run model code shipped with a folder or hub checkpoint.

    Returns:
        ``(model, tokenizer)``: an ``AutoModelForCausalLM`` and an ``AutoTokenizer`` that has a chat template and a
        pad token (the EOS token when the checkpoint names none).

    Raises:
        ConfigError: The ``train`` extra (or ``gguf``, for a GGUF file) is not installed, the checkpoint cannot
            be loaded, or its tokenizer has no chat template.
    """
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ConfigError(f"training needs torch and transformers: {TRAIN_INSTALL}") from exc
    torch_dtype = _torch_dtype(dtype)
    kwargs: dict[str, Any] = {_dtype_keyword(): torch_dtype, "trust_remote_code": trust_remote_code}
    tokenizer_kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if source.kind == "gguf":
        try:
            import gguf  # noqa: F401  (transformers reads the file through it)
        except ImportError as exc:
            raise ConfigError(f"reading a GGUF policy needs the gguf package: {TRAIN_INSTALL}") from exc
        file = Path(source.path)
        location, gguf_kwargs = str(file.parent), {"gguf_file": file.name}
        if (quantization := _dequantize_config()) is not None:
            kwargs["quantization_config"] = quantization
        kwargs.update(gguf_kwargs)
        tokenizer_kwargs.update(gguf_kwargs)
    else:
        location = source.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **tokenizer_kwargs)
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except _load_errors() as exc:
        raise ConfigError(f"cannot load policy {source.spec!r} ({source.path}): {exc}") from exc

    if source.kind == "gguf":
        packed = sorted({str(p.dtype) for p in model.parameters() if not p.dtype.is_floating_point})
        if packed:
            raise ConfigError(f"policy {source.spec!r}: transformers left weights packed ({', '.join(packed)}); "
                              "they cannot be trained")
        _drop_quantization_state(model)
        if not tokenizer.chat_template:
            tokenizer.chat_template = _gguf_chat_template(Path(source.path))
    if not tokenizer.chat_template:
        raise ConfigError(f"policy {source.spec!r}: the tokenizer has no chat template, so chat data cannot be "
                          "rendered for it; use an instruct/chat checkpoint")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def apply_lora(model: Any, *, r: int = 16, alpha: int = 32, dropout: float = 0.05,
               target_modules: list[str] | str | None = None, task_type: str = "CAUSAL_LM") -> Any:
    """Wrap a model in a LoRA adapter; only the adapter's weights (and a new task head) train.

    Args:
        model: A transformers causal LM, or a scoring model with ``task_type="SEQ_CLS"`` (not already a
            ``PeftModel``).
        r: Rank of the update matrices.
        alpha: Scaling numerator (the update is scaled by ``alpha / r``).
        dropout: Dropout on the adapter's input.
        target_modules: Module names to adapt (a list of names, or one peft regex); default ``"all-linear"``,
            every linear layer except the output head.
        task_type: peft's task type: ``CAUSAL_LM``, or ``SEQ_CLS`` for a reward model, whose freshly
            initialised ``score`` head then trains in full (peft's ``modules_to_save``).

    Returns:
        The ``peft.PeftModel``.

    Raises:
        ConfigError: peft is not installed, a value is out of range, the model already has an adapter, or
            ``target_modules`` matches nothing in the model.
    """
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError as exc:
        raise ConfigError(f"LoRA needs peft: {TRAIN_INSTALL}") from exc
    if r < 1:
        raise ConfigError(f"LoRA rank r must be at least 1, got {r}")
    if alpha <= 0:
        raise ConfigError(f"LoRA alpha must be positive, got {alpha}")
    if not 0 <= dropout < 1:
        raise ConfigError(f"LoRA dropout must be in [0, 1), got {dropout}")
    if isinstance(model, PeftModel):
        raise ConfigError("the model already carries a LoRA adapter")
    config = LoraConfig(task_type=task_type, r=r, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=target_modules or "all-linear")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft's "Target modules {...} not found in the base model"
        raise ConfigError(f"LoRA target_modules {target_modules!r}: {exc}") from exc


def is_peft_model(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _save_checkpoint(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write a full checkpoint (safetensors, config, generation config, tokenizer with its chat template)."""
    config = model.config
    # Training turns the KV cache off (gradient checkpointing); whoever loads the checkpoint generates with it.
    use_cache = getattr(config, "use_cache", None)
    config.use_cache = True
    try:
        model.save_pretrained(folder)
    finally:
        config.use_cache = use_cache
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def save_policy(model: Any, tokenizer: Any, output_dir: Path, *, merge: bool = True) -> dict[str, str]:
    """Save a trained policy under ``output_dir``.

    A ``PeftModel`` is saved as its adapter in ``output_dir/adapter`` (``adapter_config.json``,
    ``adapter_model.safetensors`` and the tokenizer); then, with ``merge``, the adapter is merged into the base
    weights **in place** (``merge_and_unload``: the object passed in is no longer a usable ``PeftModel``, so call
    this last) and the merged model is saved as a full checkpoint in ``output_dir/model``. Any other model is
    saved as a full checkpoint in ``output_dir/model``. A full checkpoint holds safetensors weights, the config,
    the generation config and the tokenizer with its chat template; it loads with
    ``AutoModelForCausalLM.from_pretrained`` (or the matching auto class) and ``factory fork --model hf:DIR``.

    Args:
        model: The trained model (a ``PeftModel`` or a plain transformers model).
        tokenizer: Its tokenizer, saved beside the weights (``None`` to skip).
        output_dir: The run's output folder; created if missing.
        merge: Whether to merge a LoRA adapter and save the full model too (ignored for a plain model).

    Returns:
        ``{"model": folder}`` for a full checkpoint and ``{"adapter": folder}`` for an adapter, as strings; a
        ``PeftModel`` saved with ``merge=False`` has only ``"adapter"``.
    """
    output_dir = Path(output_dir)
    paths: dict[str, str] = {}
    if is_peft_model(model):
        adapter_dir = output_dir / "adapter"
        model.save_pretrained(adapter_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(adapter_dir)
        paths["adapter"] = str(adapter_dir)
        if not merge:
            return paths
        model = model.merge_and_unload()
    model_dir = output_dir / "model"
    _save_checkpoint(model, tokenizer, model_dir)
    paths["model"] = str(model_dir)
    return dict(sorted(paths.items()))
