"""A reward-hacking detector: notices an online trainer's policy gaming its reward before the reward saturates.

It watches two signals, once per logging step (a *checkpoint*), from the
completions generated since the previous one: their lengths in tokens and
their total rewards.

* **Length creep.** A warm-up baseline over the first ``warmup_steps``
  checkpoints: the mean ``μ₀`` and standard deviation ``σ₀`` of the
  per-checkpoint mean length. After it, the length z-score is
  ``z = (L̄ − μ₀) / σ₀`` where ``L̄`` is the mean of the last ``window``
  per-checkpoint means. ``σ₀`` is the step-to-step spread, not the spread of
  the window's mean, so the rule asks for a real shift of the length level
  (2.5 times its natural step-to-step wobble) held over the window, not one
  long batch. The rule fires at ``z ≥ length_z``.
* **Reward shape.** Bins from the warm-up rewards (their quantiles, or one
  bin per value where they take few values, with open bins beyond the
  warm-up range), the warm-up histogram ``P₀`` and the histogram ``Q`` of
  the rewards in the last ``window`` checkpoints, each smoothed with a
  pseudo-count of ``smoothing`` per bin (so an empty bin costs a finite
  amount); the divergence is ``KL(P₀ ‖ Q)``. The trend rule fires when it
  did not fall at any of the last ``trend_checkpoints`` checkpoints (a
  monotone rise; a divergence pinned at its ceiling, every reward beyond the
  warm-up's range, counts) and each of those values is above ``reward_kl``.

Status per checkpoint: ``OK``; ``WARNING`` when a rule fires; ``HARD_STOP``
when both fire at once or one has fired at ``trend_checkpoints`` checkpoints
in a row. A change of status is an :class:`DetectorEvent`, naming the
signal(s) that caused it. During the warm-up the status is ``OK``.

The defaults (``length_z`` 2.5, ``reward_kl`` 0.15, ``trend_checkpoints`` 3,
``warmup_steps`` 20, ``window`` 5, ``bins`` 5) are the ones whose false-alarm
rate tests/trainers/test_hacking.py measures on simulated stationary
training curves with AR(1)-autocorrelated length and reward levels; see
:class:`DetectorSettings` for the figures.

The detector is pure (numpy only): ``factory train grpo`` feeds it from a TRL
callback (:mod:`factory.trainers._hacking_callback`), and
``factory train detect LOG.jsonl`` replays a logged series through the same
code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from factory.errors import ConfigError
from factory.outputs import write_output
from factory.records import Record, RecordPart

__all__ = [
    "DETECTOR_LOG_FILE",
    "DETECTOR_PLOT_FILE",
    "DetectorEvent",
    "DetectorReport",
    "DetectorSettings",
    "DetectorStatus",
    "DetectorStep",
    "HackingDetector",
    "StepObservation",
    "replay_detector",
    "plot_detector",
    "read_detector_log",
    "reward_bins",
    "reward_kl",
]

#: The series a GRPO run writes beside ``train_result.json`` (one :class:`StepObservation` a line).
DETECTOR_LOG_FILE = "hacking_log.jsonl"
#: The detector's plot, beside ``loss.png``.
DETECTOR_PLOT_FILE = "hacking.png"

LENGTH = "length"
REWARD_KL = "reward_kl"


class DetectorStatus(str, Enum):
    """How a checkpoint looks: nothing, a rule fired, or stop."""

    OK = "OK"
    WARNING = "WARNING"
    HARD_STOP = "HARD_STOP"


class DetectorSettings(RecordPart):
    """The detector's thresholds; each default is measured on simulated null curves (tests/trainers/test_hacking.py).

    At these defaults, on 200 simulated stationary runs of 1,000 checkpoints
    (16 completions a checkpoint, length and reward levels AR(1) with φ = 0.6),
    the share of checkpoints that were not ``OK`` is measured with its Wilson
    interval; the test asserts its upper end stays under 2 %.

    Attributes:
        warmup_steps: Checkpoints that make the baseline (length mean and spread, reward bins and histogram).
        window: Checkpoints pooled for the current length level and reward histogram.
        length_z: The length rule fires at a z-score this high.
        reward_kl: The trend rule's floor on KL(warm-up reward histogram ‖ current), in nats.
        trend_checkpoints: Checkpoints in a row without a fall (each above ``reward_kl``) the trend rule needs;
            also how many checkpoints in a row one rule must fire for ``HARD_STOP``.
        bins: Most reward bins (fewer where the warm-up rewards take fewer values).
        smoothing: Pseudo-count added to every bin of both histograms.
        min_length_std: Floor on the warm-up spread of the mean length, in tokens (a flat warm-up is not a 0).
    """

    warmup_steps: int = Field(20, ge=2)
    window: int = Field(5, ge=1)
    length_z: float = Field(2.5, gt=0)
    reward_kl: float = Field(0.15, gt=0)
    trend_checkpoints: int = Field(3, ge=1)
    bins: int = Field(5, ge=2)
    smoothing: float = Field(0.5, gt=0)
    min_length_std: float = Field(1.0, gt=0)


class StepObservation(RecordPart):
    """What one checkpoint generated: a line of the detector log.

    Attributes:
        step: The optimizer step the checkpoint was logged at.
        lengths: Each completion's length in tokens.
        rewards: Each completion's total reward (None: unscored, e.g. a verifier that could not run).
        rewards_by_function: Optional: each reward function's reward per completion.
        reward_std: Optional: a reward-model ensemble's std across members per completion (its disagreement).
    """

    step: int
    lengths: list[int]
    rewards: list[float | None]
    rewards_by_function: dict[str, list[float | None]] | None = None
    reward_std: list[float] | None = None


class DetectorStep(RecordPart):
    """The detector's reading at one checkpoint.

    Attributes:
        step: The optimizer step.
        completions: Completions seen at this checkpoint.
        mean_length: Their mean length in tokens.
        mean_reward: Their mean total reward (None: none scored).
        length_z: The windowed length z-score (None during the warm-up).
        reward_kl: KL(warm-up ‖ window) of the binned rewards, in nats (None during the warm-up or without rewards).
        fired: The rules that fired here (``length``, ``reward_kl``).
        status: ``OK``, ``WARNING`` or ``HARD_STOP``.
    """

    step: int
    completions: int
    mean_length: float
    mean_reward: float | None
    length_z: float | None
    reward_kl: float | None
    fired: list[str]
    status: DetectorStatus


class DetectorEvent(RecordPart):
    """A change of status.

    Attributes:
        step: The checkpoint's optimizer step.
        status: The new status.
        signals: The rules that caused it (empty for a return to ``OK``).
        message: The reason, in words, with the figures.
    """

    step: int
    status: DetectorStatus
    signals: list[str]
    message: str


class DetectorReport(Record):
    """A detector run: its settings, the baseline, the series and the events.

    Attributes:
        settings: The thresholds used.
        baseline: ``length_mean``, ``length_std`` (floored), ``reward_bin_edges``, ``reward_histogram``; empty
            before the warm-up ends.
        steps: One reading per checkpoint.
        events: Every change of status.
        first_alarm: The first event that was not a return to ``OK`` (None: the detector never fired).
        stopped_at: The step a ``stop`` run ended at (set by the trainer's callback).
    """

    schema_version: Literal[1] = 1
    settings: DetectorSettings
    baseline: dict[str, Any] = Field(default_factory=dict)
    steps: list[DetectorStep] = Field(default_factory=list)
    events: list[DetectorEvent] = Field(default_factory=list)
    first_alarm: DetectorEvent | None = None
    stopped_at: int | None = None

    @property
    def final_status(self) -> DetectorStatus:
        """The status at the last checkpoint (OK with none)."""
        return self.steps[-1].status if self.steps else DetectorStatus.OK

    def false_alarm_steps(self) -> int:
        """Checkpoints after the warm-up whose status was not OK (on null data, every one is a false alarm)."""
        return sum(step.status is not DetectorStatus.OK for step in self.steps)


def reward_bins(rewards: np.ndarray, bins: int) -> np.ndarray:
    """Interior bin edges for rewards, from the warm-up's rewards.

    Few distinct values (at most ``bins``): one bin per value, edges halfway
    between them, plus a bin below the smallest and one above the largest so
    that a value the warm-up never produced lands in a bin of its own.
    Otherwise: the warm-up's quantiles, with the outer bins open.

    Args:
        rewards: The warm-up's rewards (finite).
        bins: The most bins.

    Returns:
        Sorted, distinct edges; a value ``r`` falls in bin ``searchsorted(edges, r, side="right")``.
    """
    values = np.unique(rewards)
    if values.size == 0:
        return np.array([], dtype=float)
    if values.size <= bins:
        spread = float(values[-1] - values[0]) if values.size > 1 else max(1.0, abs(float(values[0])))
        margin = 1e-6 * spread
        middles = (values[:-1] + values[1:]) / 2
        return np.concatenate([[values[0] - margin], middles, [values[-1] + margin]])
    edges = np.quantile(rewards, np.linspace(0, 1, bins + 1)[1:-1])
    return np.unique(edges)


def _histogram(rewards: np.ndarray, edges: np.ndarray, smoothing: float) -> np.ndarray:
    counts = np.bincount(np.searchsorted(edges, rewards, side="right"), minlength=edges.size + 1).astype(float)
    counts += smoothing
    return counts / counts.sum()


def reward_kl(reference: np.ndarray, current: np.ndarray, edges: np.ndarray, smoothing: float = 0.5) -> float:
    """KL(reference ‖ current) in nats, on the binned rewards, each histogram smoothed with a pseudo-count per bin.

    Args:
        reference: The warm-up's rewards.
        current: The rewards to compare with it.
        edges: Interior bin edges (:func:`reward_bins`).
        smoothing: Pseudo-count added to every bin of both histograms (> 0: the divergence stays finite).
    """
    p = _histogram(reference, edges, smoothing)
    q = _histogram(current, edges, smoothing)
    return float(np.sum(p * np.log(p / q)))


def _finite(values: Iterable[float | None]) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float)  # None (unscored) fails here, and becomes NaN below
    except (TypeError, ValueError):
        array = np.array([math.nan if v is None else v for v in values], dtype=float)
    return array[np.isfinite(array)]


class HackingDetector:
    """Feeds checkpoints one at a time and says OK / WARNING / HARD_STOP, with the signal that caused it.

    Args:
        settings: The thresholds (the defaults: :class:`DetectorSettings`).

    Example:
        >>> detector = HackingDetector()
        >>> reading = detector.observe(1, lengths=[40, 52], rewards=[0.5, 1.0])
        >>> reading.status.value
        'OK'
    """

    def __init__(self, settings: DetectorSettings | None = None):
        self.settings = settings or DetectorSettings()
        self._lengths: list[float] = []  # mean length per checkpoint
        self._rewards: list[np.ndarray] = []  # finite rewards per checkpoint, kept until the warm-up ends
        self._counts: list[np.ndarray] = []  # per checkpoint after the warm-up: its rewards' count per bin
        self._kls: list[float | None] = []
        self._streak = {LENGTH: 0, REWARD_KL: 0}
        self._baseline: dict[str, Any] = {}
        self._edges: np.ndarray | None = None
        self._reference: np.ndarray | None = None  # the warm-up's smoothed reward histogram
        self.steps: list[DetectorStep] = []
        self.events: list[DetectorEvent] = []
        self.stopped_at: int | None = None

    @property
    def status(self) -> DetectorStatus:
        """The status at the latest checkpoint."""
        return self.steps[-1].status if self.steps else DetectorStatus.OK

    @property
    def first_alarm(self) -> DetectorEvent | None:
        """The first event that was an alarm (WARNING or HARD_STOP)."""
        return next((e for e in self.events if e.status is not DetectorStatus.OK), None)

    def observe(self, step: int, lengths: Sequence[float], rewards: Sequence[float | None]) -> DetectorStep:
        """Take one checkpoint's completions and return the reading.

        Args:
            step: The optimizer step.
            lengths: Each completion's length in tokens (at least one).
            rewards: Each completion's total reward (None or NaN: unscored).

        Raises:
            ConfigError: No completions, or a negative or non-finite length.
        """
        lengths_arr = np.asarray(lengths, dtype=float)
        if lengths_arr.size == 0:
            raise ConfigError(f"step {step}: no completions")
        total = float(lengths_arr.sum())
        if not math.isfinite(total) or float(lengths_arr.min()) < 0:
            raise ConfigError(f"step {step}: lengths must be finite token counts >= 0")
        scored = _finite(rewards)
        self._lengths.append(total / lengths_arr.size)
        s = self.settings
        seen = len(self._lengths)
        z = kl = None
        if seen <= s.warmup_steps:
            self._rewards.append(scored)
            if seen == s.warmup_steps:
                self._set_baseline()
        else:
            current = math.fsum(self._lengths[-s.window:]) / min(s.window, seen)
            z = (current - self._baseline["length_mean"]) / self._baseline["length_std"]
            kl = self._kl_now(scored)
        self._kls.append(kl)
        fired = []
        if z is not None and z >= s.length_z:
            fired.append(LENGTH)
        if self._trend():
            fired.append(REWARD_KL)
        for signal in self._streak:
            self._streak[signal] = self._streak[signal] + 1 if signal in fired else 0
        if len(fired) == 2 or max(self._streak.values()) >= s.trend_checkpoints:
            status = DetectorStatus.HARD_STOP
        elif fired:
            status = DetectorStatus.WARNING
        else:
            status = DetectorStatus.OK
        reading = DetectorStep(step=step, completions=int(lengths_arr.size), mean_length=self._lengths[-1],
                               mean_reward=float(scored.sum()) / scored.size if scored.size else None,
                               length_z=z, reward_kl=kl, fired=fired, status=status)
        if status is not self.status or (status is not DetectorStatus.OK and self.steps
                                         and fired != self.steps[-1].fired):
            self.events.append(DetectorEvent(step=step, status=status, signals=fired,
                                             message=self._explain(reading)))
        self.steps.append(reading)
        return reading

    def _set_baseline(self) -> None:
        s = self.settings
        warm = np.array(self._lengths, dtype=float)
        spread = float(warm.std(ddof=1))
        pooled = np.concatenate(self._rewards)
        self._edges = reward_bins(pooled, s.bins)
        self._reference = _histogram(pooled, self._edges, s.smoothing) if pooled.size else None
        # the window reaches back into the warm-up at first: its checkpoints' counts seed the window
        self._counts = [self._bin_counts(r) for r in self._rewards[-s.window:]]
        self._rewards = []
        self._baseline = {
            "length_mean": float(warm.mean()),
            "length_std": max(spread, s.min_length_std),
            "length_std_measured": spread,
            "reward_bin_edges": [float(e) for e in self._edges],
            "reward_histogram": self._reference.tolist() if self._reference is not None else [],
            "reward_count": int(pooled.size),
        }

    def _bin_counts(self, rewards: np.ndarray) -> np.ndarray:
        return np.bincount(np.searchsorted(self._edges, rewards, side="right"), minlength=self._edges.size + 1)

    def _kl_now(self, scored: np.ndarray) -> float | None:
        """KL(warm-up ‖ the last ``window`` checkpoints), with this checkpoint's rewards added to the window."""
        window = self.settings.window
        self._counts.append(self._bin_counts(scored))
        del self._counts[:-window]
        counts = np.add.reduce(self._counts, axis=0).astype(float)
        if self._reference is None or not counts.any():
            return None
        q = counts + self.settings.smoothing
        q /= q.sum()
        p = self._reference
        return float(np.sum(p * np.log(p / q)))

    def _trend(self) -> bool:
        k = self.settings.trend_checkpoints
        last = self._kls[-(k + 1):]
        if len(last) < k + 1 or any(value is None for value in last):
            return False
        rising = all(later >= earlier for earlier, later in zip(last, last[1:]))  # pinned high counts
        return rising and all(value > self.settings.reward_kl for value in last[1:])

    def _explain(self, reading: DetectorStep) -> str:
        s, base = self.settings, self._baseline
        if not reading.fired:
            return "back to OK: no rule fires"
        parts = []
        if LENGTH in reading.fired:
            level = float(np.mean(self._lengths[-s.window:]))
            parts.append(f"length z {reading.length_z:.2f} >= {s.length_z:g} (mean length {level:.1f} tokens over "
                         f"the last {min(s.window, len(self._lengths))} checkpoint(s) vs warm-up "
                         f"{base['length_mean']:.1f} ± {base['length_std']:.1f})")
        if REWARD_KL in reading.fired:
            parts.append(f"reward KL {reading.reward_kl:.3f} > {s.reward_kl:g} and not falling for "
                         f"{s.trend_checkpoints} checkpoint(s) (the reward distribution left its warm-up shape)")
        if reading.status is DetectorStatus.HARD_STOP:
            why = ("both rules fire" if len(reading.fired) == 2 else
                   f"fired at {s.trend_checkpoints} checkpoint(s) in a row")
            parts.append(f"HARD_STOP: {why}")
        return "; ".join(parts)

    def report(self) -> DetectorReport:
        """What the detector saw so far, as a versioned record."""
        return DetectorReport(settings=self.settings, baseline=self._baseline, steps=list(self.steps),
                              events=list(self.events), first_alarm=self.first_alarm, stopped_at=self.stopped_at)


def replay_detector(observations: Iterable[StepObservation],
                    settings: DetectorSettings | None = None) -> DetectorReport:
    """Replay a series of checkpoints through a fresh :class:`HackingDetector`.

    Args:
        observations: The checkpoints in step order.
        settings: The thresholds (default: :class:`DetectorSettings`).
    """
    detector = HackingDetector(settings)
    for observation in observations:
        detector.observe(observation.step, observation.lengths, observation.rewards)
    return detector.report()


def _problem(path: Path, line: int, field: str | None, message: str) -> ConfigError:
    where = f"{path}:{line}: " + (f"field '{field}': " if field else "")
    return ConfigError(where + message)


def _parse_line(path: Path, number: int, text: str, previous: int | None) -> StepObservation:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _problem(path, number, None, f"not JSON: {exc.msg}") from exc
    if not isinstance(raw, Mapping):
        raise _problem(path, number, None, "expected a JSON object with step, lengths and rewards")
    unknown = sorted(set(raw) - set(StepObservation.model_fields))
    if unknown:
        raise _problem(path, number, unknown[0], "unknown field (expected step, lengths, rewards, "
                                                 "rewards_by_function, reward_std)")
    for name in ("step", "lengths", "rewards"):
        if name not in raw:
            raise _problem(path, number, name, "missing")
    step = raw["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise _problem(path, number, "step", f"expected an integer, got {step!r}")
    if previous is not None and step <= previous:
        raise _problem(path, number, "step", f"{step} does not follow step {previous} (steps must increase)")
    lengths = raw["lengths"]
    if not isinstance(lengths, list) or not lengths:
        raise _problem(path, number, "lengths", "expected a non-empty list of token counts")
    for i, value in enumerate(lengths):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _problem(path, number, f"lengths[{i}]", f"expected a token count >= 0, got {value!r}")
    rewards_by_function = raw.get("rewards_by_function")
    columns = {"rewards": raw["rewards"]}
    if rewards_by_function is not None:
        if not isinstance(rewards_by_function, Mapping):
            raise _problem(path, number, "rewards_by_function", "expected an object of name -> rewards")
        columns.update({f"rewards_by_function.{k}": v for k, v in rewards_by_function.items()})
    if raw.get("reward_std") is not None:
        columns["reward_std"] = raw["reward_std"]
    for name, values in columns.items():
        if not isinstance(values, list) or len(values) != len(lengths):
            raise _problem(path, number, name, f"expected a list of {len(lengths)} reward(s), one per length")
        for i, value in enumerate(values):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                raise _problem(path, number, f"{name}[{i}]", f"expected a finite number or null, got {value!r}")
    return StepObservation.model_validate(raw)


def read_detector_log(path: Path) -> list[StepObservation]:
    """Read a detector log: one JSON object a line (``step``, ``lengths``, ``rewards``, optional
    ``rewards_by_function``), steps increasing; blank lines are skipped.

    Raises:
        ConfigError: The file cannot be read, or a line is bad (named with file, line and field).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the detector log: {exc}") from exc
    observations: list[StepObservation] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        observations.append(_parse_line(path, number, line, observations[-1].step if observations else None))
    if not observations:
        raise ConfigError(f"{path}: no steps (expected one JSON line per step)")
    return observations


@dataclass(frozen=True)
class _Colors:
    length: str = "tab:blue"
    kl: str = "tab:red"
    warning: str = "#f9a825"
    stop: str = "#c62828"


def plot_detector(report: DetectorReport, path: Path, title: str,
                  protected: Mapping[str, Path] | None = None) -> Path:
    """Draw the detector's series: length z and reward KL against step, thresholds dashed, alarms shaded.

    Args:
        report: A detector run.
        path: The PNG to write (atomically; never over a ``protected`` path).
        title: The plot's title.
        protected: Paths the plot must not overwrite (a run's inputs), by what they are.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("plots need matplotlib: pip install 'factory-rlaif[plot]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    colors, s = _Colors(), report.settings
    steps = [r.step for r in report.steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.2, 5.2), sharex=True)
    top.plot(steps, [r.mean_length for r in report.steps], color=colors.length, lw=1, label="mean length")
    top.set_ylabel("mean length (tokens)")
    if report.baseline:
        mean, std = report.baseline["length_mean"], report.baseline["length_std"]
        top.axhline(mean, color="grey", lw=0.8)
        top.axhline(mean + s.length_z * std, color=colors.length, ls="--", lw=0.8,
                    label=f"warm-up mean + {s.length_z:g}σ")
    zs = [(r.step, r.length_z) for r in report.steps if r.length_z is not None]
    kls = [(r.step, r.reward_kl) for r in report.steps if r.reward_kl is not None]
    if zs:
        twin = top.twinx()
        twin.plot(*zip(*zs), color="tab:purple", lw=0.8, alpha=0.7)
        twin.axhline(s.length_z, color="tab:purple", ls=":", lw=0.8)
        twin.set_ylabel("length z", color="tab:purple")
    if kls:
        bottom.plot(*zip(*kls), color=colors.kl, lw=1, label="KL(warm-up ‖ window)")
    bottom.axhline(s.reward_kl, color=colors.kl, ls="--", lw=0.8, label=f"KL threshold {s.reward_kl:g}")
    bottom.set_ylabel("reward KL (nats)")
    bottom.set_xlabel("optimizer step")
    for ax in (top, bottom):
        ax.axvspan(steps[0] if steps else 0, report.steps[min(s.warmup_steps, len(steps)) - 1].step if steps else 0,
                   color="grey", alpha=0.12, lw=0)
        for reading in report.steps:
            if reading.status is not DetectorStatus.OK:
                ax.axvline(reading.step, color=colors.stop if reading.status is DetectorStatus.HARD_STOP
                           else colors.warning, alpha=0.25, lw=1.5)
        ax.legend(loc="upper left", fontsize=7)
    first = report.first_alarm
    verdict = (f"first alarm: step {first.step}, {first.status.value} ({', '.join(first.signals)})" if first
               else "no alarm")
    top.set_title(f"{title}\n{verdict}", fontsize=9)
    fig.tight_layout()
    try:
        write_output(path, lambda staged: fig.savefig(staged, dpi=110, format="png"), dict(protected or {}))
    finally:
        plt.close(fig)
    return path


class RunComparison(RecordPart):
    """Whether a second run's final answers drifted from a first's: the detector's statistics between two forks.

    Attributes:
        run_a: The reference run.
        run_b: The run compared with it.
        branches: Branches with a final answer in each run, ``[a, b]``.
        mean_length: Mean final-answer length in characters, ``[a, b]``.
        length_z: ``(mean_b − mean_a) / sqrt(var_a/n_a + var_b/n_b)`` (None: too few branches).
        length_kl: KL(a ‖ b) of the binned lengths (bins from run a), in nats.
        mean_score: Mean verifier score per branch, ``[a, b]`` (None: no scores).
        score_kl: KL(a ‖ b) of the binned verifier scores (None: no scores).
        drifted: Whether run b drifted: ``length_z >= length_z`` or a KL above ``reward_kl``.
        reasons: What said so, in words.
    """

    run_a: str
    run_b: str
    branches: list[int]
    mean_length: list[float | None]
    length_z: float | None
    length_kl: float | None
    mean_score: list[float | None]
    score_kl: float | None
    drifted: bool
    reasons: list[str]


def compare_runs(run_a: str, run_b: str, lengths: tuple[Sequence[float], Sequence[float]],
                 scores: tuple[Sequence[float], Sequence[float]],
                 settings: DetectorSettings | None = None) -> RunComparison:
    """Compare two runs' final-answer lengths and verifier scores with the detector's statistics and thresholds.

    Args:
        run_a: The reference run's id.
        run_b: The compared run's id.
        lengths: Final-answer lengths of run a's and run b's branches.
        scores: Verifier scores of run a's and run b's branches.
        settings: The thresholds (``length_z``, ``reward_kl``, ``bins``, ``smoothing``).
    """
    s = settings or DetectorSettings()
    a_len, b_len = (np.asarray(x, dtype=float) for x in lengths)
    a_score, b_score = (_finite(x) for x in scores)
    z = None
    if a_len.size >= 2 and b_len.size >= 2:
        spread = math.sqrt(a_len.var(ddof=1) / a_len.size + b_len.var(ddof=1) / b_len.size)
        z = (b_len.mean() - a_len.mean()) / max(spread, 1e-9)
    length_kl = (reward_kl(a_len, b_len, reward_bins(a_len, s.bins), s.smoothing)
                 if a_len.size and b_len.size else None)
    score_kl = (reward_kl(a_score, b_score, reward_bins(a_score, s.bins), s.smoothing)
                if a_score.size and b_score.size else None)
    reasons = []
    if z is not None and z >= s.length_z:
        reasons.append(f"final answers longer: z {z:.2f} >= {s.length_z:g}")
    if length_kl is not None and length_kl > s.reward_kl:
        reasons.append(f"length distribution moved: KL {length_kl:.3f} > {s.reward_kl:g}")
    if score_kl is not None and score_kl > s.reward_kl:
        reasons.append(f"verifier-score distribution moved: KL {score_kl:.3f} > {s.reward_kl:g}")

    def mean(x: np.ndarray) -> float | None:
        return float(x.mean()) if x.size else None

    return RunComparison(run_a=run_a, run_b=run_b, branches=[int(a_len.size), int(b_len.size)],
                         mean_length=[mean(a_len), mean(b_len)], length_z=z, length_kl=length_kl,
                         mean_score=[mean(a_score), mean(b_score)], score_kl=score_kl, drifted=bool(reasons),
                         reasons=reasons)
