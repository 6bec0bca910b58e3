"""``factory train grpo``: TRL's GRPOTrainer on a GRPO export, rewarded by our verifiers.

The export holds one prompt per task and the task's spec; every group of
``num_generations`` completions is scored by :class:`VerifierReward` (the
task's answer / tests / build / schema / rules verifiers, tool calls and
tests run in a sandbox), so the policy is trained online on the same checks
that made the data.

With ``multi_turn`` (the default where a task has files, tests or a build), the
policy works through the task with the fork agent's tools in a fresh sandbox
per rollout and sees every tool result while it generates; the episode is
verified after it ends: see :mod:`factory.trainers._environment`.

A reward-hacking detector watches the loop (``hacking_detector``: ``warn`` by
default, ``stop``, ``off``): see :mod:`factory.trainers._hacking_callback`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import trl

from factory.errors import ConfigError
from factory.trainers._config import TrainerSettings
from factory.trainers._data import TrainingData
from factory.trainers._hacking import DetectorSettings
from factory.trainers._models import is_peft_model
from factory.trainers._rewards import VerifierReward
from factory.trainers._run import TrainResult, run_training

__all__ = ["GRPOConfig", "train_grpo"]


@dataclass
class GRPOConfig(TrainerSettings, trl.GRPOConfig):
    """TRL's ``GRPOConfig`` with the data, the policy, LoRA, CPU-safe defaults and the verifier reward's settings.

    Attributes:
        sandbox: Sandbox backend for the completions' tool calls and the tests.
        reward_verifiers: Only these objective verifiers score (default: each task's own).
        reward_concurrency: Completions verified at once.
        reward_model: A reward model or ensemble (``factory train reward [--ensemble K]``) that scores each
            completion beside the verifiers.
        uncertainty_penalty: λ: the reward model's reward is the members' mean − λ·std.
        hacking_detector: The reward-hacking detector: ``off``, ``warn`` or ``stop``.
        hacking_warmup_steps: Checkpoints in the detector's warm-up baseline.
        hacking_window: Checkpoints pooled for the current length level and reward histogram.
        hacking_length_z: Length z-score that fires the length rule.
        hacking_reward_kl: KL the trend rule must exceed.
        hacking_trend: Rises in a row the KL trend rule needs.
        multi_turn: Episodes with the agent's tools in a sandbox (True), one completion (False), or None: multi-turn
            where a task has files, tests or a build.
    """

    sandbox: str = field(default="bwrap", metadata={
        "help": "Sandbox backend where completions' tool calls and the task's tests run."})
    reward_verifiers: list[str] | None = field(default=None, metadata={
        "help": "Objective verifiers that score completions (default: every one the task's fields select)."})
    reward_concurrency: int = field(default=2, metadata={"help": "Completions verified at once."})
    reward_model: str | None = field(default=None, metadata={
        "help": "A reward model folder from `factory train reward` (an --ensemble of K, or one model) that also "
                "scores each completion (TRL adds the rewards; weigh them with --set reward_weights=[1,1]); its "
                "members' std per step is logged (ensemble/std, hacking_log.jsonl)."})
    uncertainty_penalty: float = field(default=0.0, metadata={
        "help": "λ: the reward model's reward is mean - λ·std over the ensemble's members (0: the plain mean)."})
    hacking_detector: str = field(default="warn", metadata={
        "help": "Reward-hacking detector: warn (status on the console, series in train_result.json, "
                "hacking_log.jsonl and hacking.png), stop (also end training at a HARD_STOP, with a checkpoint "
                "and exit status 4), or off."})
    hacking_warmup_steps: int = field(default=20, metadata={
        "help": "Logging steps in the detector's warm-up baseline (null false alarms measured at 20: "
                "tests/trainers/test_hacking.py)."})
    hacking_window: int = field(default=5, metadata={
        "help": "Logging steps pooled for the detector's current length level and reward histogram."})
    hacking_length_z: float = field(default=2.5, metadata={
        "help": "The detector's length rule fires at this z-score over the warm-up baseline."})
    hacking_reward_kl: float = field(default=0.15, metadata={
        "help": "The detector's trend rule: KL(warm-up rewards || current) above this, in nats..."})
    hacking_trend: int = field(default=3, metadata={
        "help": "... without a fall for this many logging steps in a row (also the steps in a row one rule must "
                "fire for HARD_STOP)."})

    multi_turn: bool | None = field(default=None, metadata={
        "help": "Multi-turn episodes: the policy calls the fork agent's tools (read_file, write_file, list_files, "
                "run, submit) in a fresh sandbox per rollout and sees their results; the episode is verified when "
                "it ends, and the loss skips the tool results' tokens (default: multi-turn where a task has files, "
                "tests or a build; --set multi_turn=false for one completion per prompt)."})

    def detector_settings(self) -> DetectorSettings:
        """The reward-hacking detector's thresholds from this config."""
        try:
            return DetectorSettings(warmup_steps=self.hacking_warmup_steps, window=self.hacking_window,
                                    length_z=self.hacking_length_z, reward_kl=self.hacking_reward_kl,
                                    trend_checkpoints=self.hacking_trend)
        except ValueError as exc:
            raise ConfigError(f"reward-hacking detector settings: {exc}") from exc


def _reward_model(config: GRPOConfig) -> list:
    """The reward model's reward function (mean − λ·std over its members), or none without ``reward_model``."""
    from factory.trainers._ensemble import EnsembleReward, RewardEnsemble

    if config.reward_model is None:
        if config.uncertainty_penalty:
            raise ConfigError("--uncertainty-penalty needs --reward-model DIR (an ensemble from `factory train "
                              "reward --ensemble K`)")
        return []
    if config.uncertainty_penalty < 0:  # refused before minutes of loading
        raise ConfigError(f"--uncertainty-penalty must be >= 0, got {config.uncertainty_penalty}")
    return [EnsembleReward(RewardEnsemble.load(config.reward_model).to(config.device), config.uncertainty_penalty)]


def train_grpo(config: GRPOConfig) -> TrainResult:
    """Train ``config.model_name_or_path`` with GRPO on ``config.data_file``'s prompts; see :func:`run_training`."""
    from factory.trainers._hacking_callback import DETECTOR_MODES, watch_rewards

    if config.hacking_detector not in DETECTOR_MODES:
        raise ConfigError(f"hacking_detector {config.hacking_detector!r}: use one of {', '.join(DETECTOR_MODES)}")
    from factory.trainers._data import load_training_data
    from factory.trainers._environment import Episodes, wants_multi_turn

    settings = config.detector_settings()  # refused before loading anything
    scorer = _reward_model(config)
    if not config.data_file:
        raise ConfigError("no training data: give --data FILE (an export from `factory export`)")
    data = load_training_data(config.data_file, "grpo")
    episodes = (Episodes(config.sandbox, verifiers=config.reward_verifiers, concurrency=config.reward_concurrency)
                if wants_multi_turn(data.dataset, config.multi_turn) else None)
    reward = episodes or VerifierReward(config.sandbox, verifiers=config.reward_verifiers,
                                        concurrency=config.reward_concurrency)
    watcher = None

    def build(config: GRPOConfig, model, tokenizer, data: TrainingData) -> trl.GRPOTrainer:
        nonlocal watcher
        source = Path(getattr(model.config, "_name_or_path", "") or ".")
        if config.beta != 0.0 and not is_peft_model(model) and not (source / "config.json").is_file():
            # TRL reloads the KL reference from the policy's folder, and a GGUF's folder holds no config.json
            raise ConfigError(f"GRPO with beta={config.beta} on {config.model_name_or_path}: use --lora "
                              "(the reference is the policy without its adapter) or --set beta=0")
        if episodes is not None:
            return _multi_turn_trainer(config, model, tokenizer, data, episodes, settings)
        funcs, watcher = watch_rewards([reward, *scorer], config.hacking_detector, settings,
                                       Path(config.output_dir), weights=config.reward_weights, tokenizer=tokenizer,
                                       protected={"the training data (--data)": data.path})
        return trl.GRPOTrainer(model=model, reward_funcs=funcs, args=config, train_dataset=data.dataset,
                               processing_class=tokenizer, callbacks=[watcher] if watcher else None)

    def _multi_turn_trainer(config, model, tokenizer, data, episodes, settings) -> trl.GRPOTrainer:
        nonlocal watcher
        from factory.trainers._environment import multi_turn_rows, parse_tool_calls_with, policy_token_counts

        tokenizer = parse_tool_calls_with(tokenizer)
        funcs, watcher = watch_rewards([reward, *scorer], config.hacking_detector, settings,
                                       Path(config.output_dir), weights=config.reward_weights, tokenizer=tokenizer,
                                       protected={"the training data (--data)": data.path},
                                       count_tokens=lambda c, ids: policy_token_counts(c, ids, tokenizer))
        return trl.GRPOTrainer(model=model, reward_funcs=funcs, args=config,
                               train_dataset=multi_turn_rows(data.dataset, data.path), processing_class=tokenizer,
                               callbacks=[watcher] if watcher else None, environment_factory=episodes.factories())

    def metrics() -> dict:
        found = {f"reward_{key}": value for key, value in sorted(reward.counts.items())}
        if episodes is not None:
            found["multi_turn"] = {"sandbox_seconds": {k: round(v, 3) for k, v in sorted(episodes.seconds.items())},
                                   "open_sandboxes_at_end": episodes.open_sandboxes()}
        if watcher is not None:  # the detector's series and events (metrics.hacking_detector in train_result.json)
            found["hacking_detector"] = watcher.result()
        if scorer:
            found["reward_model"] = scorer[0].summary()
        return found

    if episodes is None:
        return run_training("grpo", config, "grpo", build, data=data, extra_metrics=metrics)
    with episodes:  # every sandbox still open is closed, also when training fails
        return run_training("grpo", config, "grpo", build, data=data, extra_metrics=metrics)
