"""The reward-hacking detector in an online trainer's loop: a TRL callback fed by the trainer's reward functions.

:func:`watch_rewards` wraps the trainer's reward functions: each call records
the completions' lengths in tokens (TRL passes ``completion_ids``; without
them the tokenizer counts) and every function's rewards. At each logging
step :class:`HackingDetectorCallback` turns what was recorded since the last
one into a :class:`~factory.trainers._hacking.StepObservation` (total reward
= the functions' rewards weighted as TRL weighs them), feeds the
:class:`~factory.trainers._hacking.HackingDetector`, appends the observation
to ``hacking_log.jsonl`` beside ``train_result.json`` (so ``factory train
detect`` replays the run) and prints each change of status on stderr. In
``stop`` mode a ``HARD_STOP`` ends training after that step, with a
checkpoint, and the reason is kept for the exit status. At the end it draws
``hacking.png`` beside ``loss.png``.

Only the main process watches (under accelerate each process scores its own
share of the completions; the main one's share is the sample).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from factory.errors import ConfigError
from factory.outputs import refuse_protected
from factory.trainers._hacking import (
    DETECTOR_LOG_FILE,
    DETECTOR_PLOT_FILE,
    DetectorReport,
    DetectorSettings,
    DetectorStatus,
    HackingDetector,
    StepObservation,
    plot_detector,
)

__all__ = ["DETECTOR_MODES", "HackingDetectorCallback", "RewardRecorder", "watch_rewards"]

#: ``--hacking-detector``: not at all, print and record, or also end training at a HARD_STOP.
DETECTOR_MODES = ("off", "warn", "stop")


class RewardRecorder:
    """Records what the wrapped reward functions saw and gave, until the next checkpoint drains it.

    Args:
        names: The reward functions' names, in order.
        weights: Their weights in the total (TRL's ``reward_weights``; None: 1 each).
        tokenizer: Counts tokens where the trainer passes no ``completion_ids``.
        count_tokens: ``(completions, completion_ids) -> lengths``: the policy's own tokens where the ids hold
            others too (multi-turn GRPO: tool results; see :func:`~factory.trainers._environment.policy_token_counts`).
    """

    def __init__(self, names: Sequence[str], weights: Sequence[float] | None = None, tokenizer: Any = None,
                 count_tokens: Callable[[Sequence[Any], Sequence[Sequence[int]]], list[int]] | None = None):
        if weights is not None and len(weights) != len(names):
            raise ConfigError(f"{len(weights)} reward weight(s) for {len(names)} reward function(s)")
        self.names = list(names)
        self.weights = [float(w) for w in weights] if weights is not None else [1.0] * len(names)
        self.tokenizer = tokenizer
        self._stds: dict[str, list[list[float]]] = {}  # each call's std per completion, by ensemble reward
        self.count_tokens = count_tokens
        self._calls: dict[str, list[tuple[list[int], list[float | None]]]] = {name: [] for name in self.names}

    def _lengths(self, completions: Sequence[Any], completion_ids: Sequence[Sequence[int]] | None) -> list[int]:
        if completion_ids is not None:
            if self.count_tokens is not None:
                return self.count_tokens(completions, completion_ids)
            return [len(ids) for ids in completion_ids]
        from factory.trainers._rewards import completion_text

        texts = [completion_text(c) for c in completions]
        if self.tokenizer is None:
            return [len(text.split()) for text in texts]  # words, where nothing can count tokens
        return [len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]

    def wrap(self, func: Callable[..., list[float | None]], name: str) -> Callable[..., list[float | None]]:
        """``func`` with TRL's reward signature, recording each call; the same ``__name__`` (TRL logs by it).

        An async reward function stays async (TRL runs those concurrently).
        """

        def record(completions: list[Any], kwargs: dict[str, Any], rewards: list[float | None]) -> None:
            lengths = self._lengths(completions, kwargs.get("completion_ids"))
            self._calls[name].append((lengths, [None if r is None else float(r) for r in rewards]))
            spread = getattr(func, "last_std", None)  # a reward-model ensemble's disagreement per completion
            if spread is not None:
                self._stds.setdefault(name, []).append(list(spread))

        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
            @functools.wraps(func)
            async def recorded_async(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
                rewards = await func(prompts=prompts, completions=completions, **kwargs)
                record(completions, kwargs, rewards)
                return rewards

            recorded_async.__name__ = name
            return recorded_async

        @functools.wraps(func)
        def recorded(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
            rewards = func(prompts=prompts, completions=completions, **kwargs)
            record(completions, kwargs, rewards)
            return rewards

        recorded.__name__ = name
        return recorded

    def drain(self, step: int) -> StepObservation | None:
        """The completions recorded since the last drain, as one checkpoint (None: nothing was generated)."""
        calls = [self._calls[name] for name in self.names]
        count = min(len(c) for c in calls)
        if count == 0:
            return None
        lengths: list[int] = []
        totals: list[float | None] = []
        by_function: dict[str, list[float | None]] = {name: [] for name in self.names}
        for index in range(count):
            batch_lengths = calls[0][index][0]
            lengths.extend(batch_lengths)
            per_function = [c[index][1] for c in calls]
            for name, rewards in zip(self.names, per_function):
                by_function[name].extend(rewards)
            for column in zip(*per_function):
                scored = [w * r for w, r in zip(self.weights, column) if r is not None and math.isfinite(r)]
                totals.append(math.fsum(scored) if scored else None)
        for c in calls:
            del c[:count]
        stds = None
        for batches in self._stds.values():  # one ensemble's std per completion (the first, if there are several)
            stds = [value for batch in batches[:count] for value in batch]
            del batches[:count]
            break
        return StepObservation(step=step, lengths=lengths, rewards=totals,
                               rewards_by_function=by_function if len(self.names) > 1 else None,
                               reward_std=stds if stds is not None and len(stds) == len(lengths) else None)


class HackingDetectorCallback(TrainerCallback):
    """Feeds the detector at each logging step; prints, logs and (in ``stop`` mode) ends training at a HARD_STOP.

    Args:
        recorder: The recorder the trainer's reward functions were wrapped with.
        mode: ``warn`` (print and record) or ``stop`` (also end training at a HARD_STOP).
        settings: The detector's thresholds.
        output_dir: Where ``hacking_log.jsonl`` and ``hacking.png`` go.
        protected: Paths the detector's files must not overwrite (the training data), by what they are.

    Attributes:
        detector: The detector.
        stop_reason: Why training was stopped (None: it was not).
    """

    def __init__(self, recorder: RewardRecorder, mode: str, settings: DetectorSettings, output_dir: Path,
                 protected: Mapping[str, Path] | None = None):
        if mode not in ("warn", "stop"):
            raise ConfigError(f"hacking detector mode {mode!r}: use one of {', '.join(DETECTOR_MODES)}")
        self.recorder = recorder
        self.mode = mode
        self.detector = HackingDetector(settings)
        self.output_dir = Path(output_dir)
        self.protected = dict(protected or {})
        self.log_path = self.output_dir / DETECTOR_LOG_FILE
        self.plot_path: Path | None = None
        self.stop_reason: str | None = None
        for target in (self.log_path, self.output_dir / DETECTOR_PLOT_FILE):  # refused now, not after training
            refuse_protected(target, self.protected)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text("", encoding="utf-8")  # this run's series (a resumed run starts a new one)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        observation = self.recorder.drain(int(state.global_step))
        if observation is None or not state.is_world_process_zero:
            return
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(observation.model_dump_json(exclude_none=True) + "\n")
        before = len(self.detector.events)
        reading = self.detector.observe(observation.step, observation.lengths, observation.rewards)
        if logs is not None:  # on TRL's console line (its log history holds a copy made before callbacks run)
            logs["hacking/status"] = reading.status.value
            if reading.length_z is not None:
                logs["hacking/length_z"] = round(reading.length_z, 4)
            if reading.reward_kl is not None:
                logs["hacking/reward_kl"] = round(reading.reward_kl, 4)
        for event in self.detector.events[before:]:
            print(f"hacking detector: step {event.step}: {event.status.value}: {event.message}", file=sys.stderr)
        if reading.status is DetectorStatus.HARD_STOP and self.mode == "stop" and self.stop_reason is None:
            self.stop_reason = (f"the reward-hacking detector stopped training at step {reading.step} "
                                f"({', '.join(reading.fired)}): {self.detector.events[-1].message}")
            self.detector.stopped_at = reading.step
            control.should_save = True  # a checkpoint of the step it stopped at
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not self.detector.steps:
            return
        try:
            self.plot_path = plot_detector(self.detector.report(), self.output_dir / DETECTOR_PLOT_FILE,
                                           "reward-hacking detector", self.protected)
        except ConfigError:  # no matplotlib: the series is still in train_result.json and the log
            self.plot_path = None

    def result(self) -> dict[str, Any]:
        """What ``train_result.json`` records: mode, log and plot paths, stop reason, and the detector's report."""
        report: DetectorReport = self.detector.report()
        return {"mode": self.mode, "log": str(self.log_path), "plot": str(self.plot_path) if self.plot_path else None,
                "final_status": report.final_status.value, "stop_reason": self.stop_reason,
                "report": report.model_dump(mode="json")}


def watch_rewards(reward_funcs: Sequence[Callable[..., Any]], mode: str, settings: DetectorSettings,
                  output_dir: Path, *, weights: Sequence[float] | None = None, tokenizer: Any = None,
                  protected: Mapping[str, Path] | None = None,
                  count_tokens: Callable[[Sequence[Any], Sequence[Sequence[int]]], list[int]] | None = None
                  ) -> tuple[list[Callable[..., Any]], HackingDetectorCallback | None]:
    """The reward functions to give the trainer, and the callback that watches them (None with mode ``off``).

    Args:
        reward_funcs: The trainer's reward functions (TRL's signature).
        mode: ``off``, ``warn`` or ``stop``.
        settings: The detector's thresholds.
        output_dir: The run's output folder.
        weights: TRL's ``reward_weights``.
        tokenizer: Counts tokens where TRL passes no ``completion_ids``.
        protected: Paths the detector's files must not overwrite.
        count_tokens: Counts the policy's own tokens of each completion (see :class:`RewardRecorder`).

    Raises:
        ConfigError: An unknown mode, or weights that do not match the functions.
    """
    if mode not in DETECTOR_MODES:
        raise ConfigError(f"--hacking-detector {mode!r}: use one of {', '.join(DETECTOR_MODES)}")
    if mode == "off":
        return list(reward_funcs), None
    names = [getattr(func, "__name__", f"reward_{i}") for i, func in enumerate(reward_funcs)]
    if len(set(names)) != len(names):
        names = [f"{name}_{i}" for i, name in enumerate(names)]
    recorder = RewardRecorder(names, weights, tokenizer, count_tokens)
    wrapped = [recorder.wrap(func, name) for func, name in zip(reward_funcs, names)]
    return wrapped, HackingDetectorCallback(recorder, mode, settings, output_dir, protected)
