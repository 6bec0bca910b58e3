"""A reward-model ensemble: K LoRA members on one frozen base, and a GRPO reward of their mean minus λ·std.

``factory train reward --ensemble K`` trains K reward models that differ in
two ways, so that their disagreement says where the data did not pin the
reward down: member ``k`` trains with seed ``seed + k`` (its LoRA matrices
and its scoring head start differently) on a bootstrap resample of the rows
(``len(rows)`` draws with replacement, from a generator seeded alike). Each
member is a LoRA adapter with its own scoring head (peft's
``modules_to_save``) over the same frozen backbone, so the ensemble costs one
base in memory and K small adapters on disk::

    OUTPUT/ensemble.json          the manifest (members, seeds, bootstrap hashes, base, check scores)
    OUTPUT/member-0/adapter/      member 0's adapter and head (and member-0/train_result.json, loss.png)
    ...

:class:`RewardEnsemble` loads that folder (or a plain ``factory train
reward`` output, as an ensemble of one) as one object: the base once, each
member as a named adapter, scored one after another. At load it scores the
manifest's check texts and compares them with the scores the members gave
right after training, so a base that changed under the adapters is refused
instead of silently scoring differently.

:class:`EnsembleReward` is a TRL reward function: each completion's reward is
``mean - λ·std`` of the members' scores (``std`` over members, ``ddof=0``),
so completions the members disagree on, those far from the pairs they learned
from, pay for the disagreement. It logs the mean std of each batch
(``ensemble/std`` in TRL's log history) and keeps the per-completion std
for the reward-hacking detector's log.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.outputs import refuse_protected, write_output
from factory.trainers._data import TrainingData
from factory.trainers._run import RESULT_FILE, TrainResult, run_training

__all__ = ["ENSEMBLE_MANIFEST", "EnsembleReward", "RewardEnsemble", "bootstrap_indices", "train_reward_ensemble"]

#: The ensemble folder's manifest.
ENSEMBLE_MANIFEST = "ensemble.json"
_MANIFEST_VERSION = 1
#: Training rows whose scores the manifest keeps, to check a reloaded ensemble against.
_CHECK_ROWS = 4
#: Largest difference between a reloaded member's score and its score at save time, in float32 (another device or
#: kernel differs in the last bits; a different base differs by far more) and, relative to the score, in half
#: precision (bf16 keeps 8 bits of mantissa).
_CHECK_TOLERANCE = 1e-3
_HALF_TOLERANCE = 0.05


def bootstrap_indices(rows: int, seed: int) -> list[int]:
    """``rows`` row numbers drawn with replacement from ``range(rows)`` by a generator seeded with ``seed``."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, rows, size=rows).tolist()


def _bootstrap_hash(indices: Sequence[int]) -> str:
    return "sha256:" + hashlib.sha256(",".join(map(str, indices)).encode()).hexdigest()


def reward_text(tokenizer: Any, prompt: Any, completion: Any) -> str:
    """The text a reward model scores: a conversation through the chat template (as TRL's GRPO renders it for a
    reward model), or plain prompt + completion."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(list(prompt) + list(completion), tokenize=False)
    return f"{prompt}{completion}"


def _check_pairs(data: TrainingData) -> list[tuple[Any, Any]]:
    """(prompt, completion) of the first rows: the chosen side of a pair, or the scalar file's completion."""
    rows = data.dataset.select(range(min(_CHECK_ROWS, len(data.dataset))))
    column = "chosen" if "chosen" in rows.column_names else "completion"
    return [(row.get("prompt", ""), row[column]) for row in rows]


def _score_texts(model: Any, tokenizer: Any, texts: Sequence[str], max_length: int | None,
                 batch_size: int = 16) -> list[float]:
    import torch

    device = next(model.parameters()).device
    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(list(texts[start:start + batch_size]), return_tensors="pt", padding=True,
                          padding_side="right", add_special_tokens=False, truncation=max_length is not None,
                          max_length=max_length).to(device)
        with torch.inference_mode():
            scores.extend(model(**batch).logits[:, 0].float().tolist())
    return scores


@dataclass
class _Member:
    name: str
    seed: int
    bootstrap_hash: str
    unique_rows: int
    adapter: str
    check_scores: list[float]
    metrics: dict[str, Any]


def _train_member(config: Any, data: TrainingData, build: Any, objective: str) -> tuple[TrainResult, Any, Any]:
    """One member: a LoRA reward model trained with ``config.seed``; its result, and the trained model (eval mode)
    and tokenizer, still in memory, to take the check scores from."""
    from transformers import set_seed

    from factory.trainers._reward import load_reward_model

    built: dict[str, Any] = {}

    def build_member(cfg: Any, model: Any, tokenizer: Any, rows: TrainingData) -> Any:
        built["trainer"] = trainer = build(cfg, model, tokenizer, rows)
        built["tokenizer"] = tokenizer
        return trainer

    set_seed(int(config.seed))  # the fresh head and the LoRA matrices are drawn when the model is built
    result = run_training("reward", config, ("reward", "reward-scalar"), build_member, load_model=load_reward_model,
                          lora_task_type="SEQ_CLS", data=data,
                          extra_metrics={"objective": objective, "bootstrap_seed": config.seed})
    model = built["trainer"].model
    model.eval()
    return result, model, built["tokenizer"]


def train_reward_ensemble(config: Any, data: TrainingData, build: Any, objective: str) -> TrainResult:
    """Train ``config.ensemble`` LoRA reward models on bootstrap resamples of ``data`` and save them as one ensemble.

    Args:
        config: The :class:`~factory.trainers._reward.RewardConfig` (``ensemble`` >= 2).
        data: The loaded pairs or scalar rows.
        build: The trainer builder for ``objective`` (pairwise or regression).
        objective: ``pairwise`` or ``regression``, for the result.

    Returns:
        A result for the whole ensemble (``model_dir`` and ``adapter_dir`` None: the members' adapters are listed in
        ``metrics.ensemble``); ``OUTPUT/ensemble.json`` and ``OUTPUT/train_result.json`` are written.
    """
    count = int(config.ensemble)
    output_dir = Path(config.output_dir)
    inputs = {"the training data (--data)": data.path}
    for target in (output_dir / ENSEMBLE_MANIFEST, output_dir / RESULT_FILE):
        refuse_protected(target, inputs)
    pairs = _check_pairs(data)
    members: list[_Member] = []
    results: list[TrainResult] = []
    started = time.perf_counter()
    for k in range(count):
        seed = int(config.seed) + k
        indices = bootstrap_indices(len(data.dataset), seed)
        member_data = copy.copy(data)
        member_data.dataset = data.dataset.select(indices)  # shares data.warnings: each is reported once
        member_config = copy.deepcopy(config)
        member_config.output_dir = str(output_dir / f"member-{k}")
        member_config.seed = seed
        member_config.data_seed = seed
        member_config.use_lora = True  # K adapters and heads on one frozen base
        member_config.merge_adapter = False
        member_config.ensemble = 1
        result, model, tokenizer = _train_member(member_config, member_data, build, objective)
        check = _score_texts(model, tokenizer, [reward_text(tokenizer, p, c) for p, c in pairs],
                             config.max_length)
        members.append(_Member(f"member-{k}", seed, _bootstrap_hash(indices), len(set(indices)),
                               str(Path(f"member-{k}") / "adapter"), check,
                               {key: result.metrics.get(key) for key in ("steps", "train_loss", "first_loss",
                                                                         "last_loss", "train_seconds")}))
        results.append(result)
        del model
    seconds = time.perf_counter() - started
    first = results[0]
    manifest = {
        "version": _MANIFEST_VERSION,
        "kind": "reward-ensemble",
        "objective": objective,
        "base": first.provenance["policy"],
        "max_length": config.max_length,
        "members": [member.__dict__ for member in members],
        "check_inputs": [{"prompt": p, "completion": c} for p, c in pairs],
        "data": first.provenance["data"] | {"rows": len(data.dataset)},
        "lora": {"r": config.lora_r, "alpha": config.lora_alpha, "dropout": config.lora_dropout,
                 "target_modules": config.lora_target_modules},
        "versions": first.provenance["versions"],
    }
    text = json.dumps(manifest, indent=2, default=str) + "\n"
    write_output(output_dir / ENSEMBLE_MANIFEST, lambda staged: staged.write_text(text, encoding="utf-8"), inputs)
    steps = sum(int(r.metrics.get("steps") or 0) for r in results)
    losses = [r.metrics.get("train_loss") for r in results if r.metrics.get("train_loss") is not None]
    metrics = {
        "steps": steps,
        "train_loss": sum(losses) / len(losses) if losses else None,
        "first_loss": first.metrics.get("first_loss"),
        "last_loss": results[-1].metrics.get("last_loss"),
        "train_seconds": round(seconds, 3),
        "steps_per_second": round(steps / seconds, 4) if seconds > 0 else None,
        "objective": objective,
        "ensemble": {"members": len(members), "manifest": str(output_dir / ENSEMBLE_MANIFEST),
                     "seeds": [m.seed for m in members], "bootstrap_hashes": [m.bootstrap_hash for m in members],
                     "member_metrics": [m.metrics for m in members]},
    }
    provenance = {**first.provenance, "seed": config.seed, "data": manifest["data"],
                  "ensemble_members": [{"seed": m.seed, "bootstrap_hash": m.bootstrap_hash} for m in members]}
    result = TrainResult("reward", output_dir, None, None, metrics, [], provenance, list(data.warnings))
    report = json.dumps(result.to_dict(), indent=2, default=str) + "\n"
    write_output(output_dir / RESULT_FILE, lambda staged: staged.write_text(report, encoding="utf-8"), inputs)
    return result


class RewardEnsemble:
    """Reward models loaded as one object: a frozen base with one named LoRA adapter (and head) per member.

    Use :meth:`load`. :meth:`member_scores` scores completions with each member in turn.

    Attributes:
        path: The folder it was loaded from.
        names: The members' adapter names (one ``model`` for a single reward model).
        manifest: The ensemble's manifest (None for a single reward model).
        max_length: Tokens a text is cut to (the reward training's ``max_length``).
    """

    def __init__(self, path: Path, model: Any, tokenizer: Any, names: list[str], manifest: dict[str, Any] | None,
                 max_length: int | None):
        self.path = path
        self.model = model
        self.tokenizer = tokenizer
        self.names = names
        self.manifest = manifest
        self.max_length = max_length

    @classmethod
    def load(cls, path: str | Path, *, dtype: Any = None, check: bool = True) -> RewardEnsemble:
        """Load an ensemble folder (``ensemble.json``) or a single reward model's output (``model/``) or folder.

        Args:
            path: The folder ``factory train reward`` wrote.
            dtype: The backbone's dtype (default: the device's default; float32 on a CPU).
            check: Score the manifest's check texts and refuse an ensemble that no longer gives the saved scores.

        Raises:
            ConfigError: No reward model there, a bad manifest, a missing adapter, or scores that differ from the
                saved ones (the base changed under the adapters).
        """
        path = Path(path)
        manifest_path = path / ENSEMBLE_MANIFEST
        if not manifest_path.is_file():
            return cls._load_single(path, dtype)
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{manifest_path}: cannot read the ensemble manifest: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("kind") != "reward-ensemble":
            raise ConfigError(f"{manifest_path}: field 'kind': expected 'reward-ensemble'")
        if manifest.get("version") != _MANIFEST_VERSION:
            raise ConfigError(f"{manifest_path}: field 'version': {manifest.get('version')!r} is not "
                              f"{_MANIFEST_VERSION} (written by another version of factory)")
        members = manifest.get("members")
        if not isinstance(members, list) or not members:
            raise ConfigError(f"{manifest_path}: field 'members': expected a non-empty list")
        from peft import PeftModel

        from factory.trainers._models import PolicySource
        from factory.trainers._reward import load_reward_model

        base = manifest.get("base") or {}
        try:
            source = PolicySource(**base)
        except TypeError as exc:
            raise ConfigError(f"{manifest_path}: field 'base': {exc}") from exc
        backbone, tokenizer = load_reward_model(source, dtype=dtype)
        model = None
        names: list[str] = []
        for index, member in enumerate(members):
            adapter = path / str(member.get("adapter", ""))
            if not (adapter / "adapter_config.json").is_file():
                raise ConfigError(f"{manifest_path}: members[{index}].adapter: no adapter at {adapter}")
            name = str(member["name"])
            if model is None:
                model = PeftModel.from_pretrained(backbone, str(adapter), adapter_name=name)
            else:
                model.load_adapter(str(adapter), adapter_name=name)
            names.append(name)
        model.eval()
        ensemble = cls(path, model, tokenizer, names, manifest, manifest.get("max_length"))
        if check:
            ensemble._check(manifest_path)
        return ensemble

    @classmethod
    def _load_single(cls, path: Path, dtype: Any) -> RewardEnsemble:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = path / "model" if (path / "model" / "config.json").is_file() else path
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{path}: not a reward model (no {ENSEMBLE_MANIFEST}, model/config.json or config.json;"
                              " train one with `factory train reward`)")
        model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=dtype or "auto")
        if model.config.num_labels != 1:
            raise ConfigError(f"{folder}: a classifier with {model.config.num_labels} labels, not a reward model")
        model.eval()
        return cls(path, model, AutoTokenizer.from_pretrained(str(folder)), ["model"], None, None)

    def _check(self, manifest_path: Path) -> None:
        inputs = self.manifest.get("check_inputs") or []
        if not inputs:
            return
        import torch

        found = self.member_scores([row["prompt"] for row in inputs], [row["completion"] for row in inputs])
        full = next(self.model.parameters()).dtype == torch.float32
        for member, scores in zip(self.manifest["members"], found):
            saved = member.get("check_scores") or []
            worst = max((abs(a - b) / (1.0 if full else max(1.0, abs(b))) for a, b in zip(scores, saved)),
                        default=0.0)
            if len(saved) != len(scores) or worst > (_CHECK_TOLERANCE if full else _HALF_TOLERANCE):
                raise ConfigError(f"{manifest_path}: {member['name']} scores its check texts {worst:.3g} away from "
                                  f"the scores saved after training: the base model "
                                  f"({self.manifest['base'].get('spec')}) is not the one it was trained on")

    @property
    def size(self) -> int:
        """The number of members."""
        return len(self.names)

    def to(self, device: Any) -> RewardEnsemble:
        """Move the ensemble to ``device``; returns itself."""
        self.model.to(device)
        return self

    def member_scores(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[list[float]]:
        """Each member's score of each (prompt, completion): ``scores[member][completion]``."""
        if len(prompts) != len(completions):
            raise ConfigError(f"{len(completions)} completions for {len(prompts)} prompts")
        texts = [reward_text(self.tokenizer, p, c) for p, c in zip(prompts, completions)]
        if self.manifest is None:
            return [_score_texts(self.model, self.tokenizer, texts, self.max_length)]
        scores = []
        for name in self.names:
            self.model.set_adapter(name)
            scores.append(_score_texts(self.model, self.tokenizer, texts, self.max_length))
        return scores


class EnsembleReward:
    """A TRL reward function: the ensemble's mean score minus ``penalty`` times the members' standard deviation.

    Args:
        ensemble: The reward models.
        penalty: λ, the weight of the disagreement (``--uncertainty-penalty``); 0 rewards the plain mean.

    Attributes:
        last_std: The members' std of each completion of the last call (read by the reward-hacking detector's
            recorder into ``hacking_log.jsonl``).
        stds: The mean std of every call so far, for the training result.
    """

    __name__ = "reward_model"  # TRL logs rewards/reward_model/mean

    def __init__(self, ensemble: RewardEnsemble, penalty: float = 0.0):
        import math

        if not math.isfinite(penalty) or penalty < 0:
            raise ConfigError(f"--uncertainty-penalty must be a finite number >= 0, got {penalty}")
        if penalty > 0 and ensemble.size < 2:
            raise ConfigError(f"--uncertainty-penalty {penalty}: {ensemble.path} is one reward model, whose std is 0; "
                              "train an ensemble with `factory train reward --ensemble K`")
        self.ensemble = ensemble
        self.penalty = float(penalty)
        self.last_std: list[float] = []
        self.stds: list[float] = []

    def __call__(self, prompts: list[Any], completions: list[Any], log_metric: Any = None,
                 **kwargs: Any) -> list[float]:
        """Score each completion: mean − λ·std over the members."""
        import numpy as np

        scores = np.asarray(self.ensemble.member_scores(prompts, completions), dtype=np.float64)
        mean, std = scores.mean(axis=0), scores.std(axis=0)
        self.last_std = std.tolist()
        self.stds.append(float(std.mean()))
        if log_metric is not None:  # TRL averages these over the logging step into its log history
            log_metric("ensemble/std", float(std.mean()))
            log_metric("ensemble/mean", float(mean.mean()))
        return (mean - self.penalty * std).tolist()

    def summary(self) -> dict[str, Any]:
        """What the training result records of the reward model."""
        return {"path": str(self.ensemble.path), "members": self.ensemble.size, "uncertainty_penalty": self.penalty,
                "seeds": [m.get("seed") for m in (self.ensemble.manifest or {}).get("members", [])],
                "mean_std": sum(self.stds) / len(self.stds) if self.stds else None,
                "last_std": self.stds[-1] if self.stds else None}
