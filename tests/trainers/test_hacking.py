"""The reward-hacking detector, measured: it says "no" on stationary training curves and "yes" soon after a drift.

The simulated curves are numpy only and seeded. A checkpoint holds 16
completions; their lengths are gamma-distributed (coefficient of variation
0.5) around a level that wanders as an AR(1) process (φ = 0.6, 8 % of the
mean), and their rewards are a correctness term (Bernoulli at an accuracy
that wanders as an AR(1) in logit space) plus, for the ``mixed`` family, a
small continuous format term. A verbose-bias drift raises the length level
by ``slope`` tokens a step from ``onset`` on, and the reward pays for length
(``bias`` × relative length), as a reward model that reads length as
quality would.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from factory.errors import ConfigError
from factory.ranking import wilson_interval
from factory.trainers import (
    DetectorReport,
    DetectorSettings,
    DetectorStatus,
    HackingDetector,
    StepObservation,
    plot_detector,
    read_detector_log,
    replay_detector,
    reward_bins,
    reward_kl,
)

MEAN_LENGTH = 200.0


def ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """A stationary AR(1) series with marginal standard deviation ``sd``."""
    shocks = rng.normal(0.0, sd * np.sqrt(1 - phi**2), n)
    series = np.empty(n)
    series[0] = rng.normal(0.0, sd)
    for t in range(1, n):
        series[t] = phi * series[t - 1] + shocks[t]
    return series


def simulate(seed: int, steps: int = 1000, *, per_step: int = 16, phi: float = 0.6, level_sd: float = 0.08,
             onset: int | None = None, slope: float = 0.0, bias: float = 0.0,
             family: str = "mixed") -> tuple[np.ndarray, np.ndarray]:
    """(lengths, rewards), each steps × per_step: a training curve, stationary unless ``onset`` is given."""
    rng = np.random.default_rng(seed)
    level = MEAN_LENGTH * (1 + ar1(rng, steps, phi, level_sd))
    if onset is not None:
        level += slope * np.clip(np.arange(1, steps + 1) - onset, 0, None)
    accuracy = 1 / (1 + np.exp(0.4 - ar1(rng, steps, phi, 0.3)))
    shape = 1 / 0.5**2
    lengths = np.clip(np.rint(rng.gamma(shape, level[:, None] / shape, (steps, per_step))), 1, 4096)
    rewards = (rng.random((steps, per_step)) < accuracy[:, None]).astype(float)
    if family == "mixed":
        rewards += np.clip(rng.normal(0.1, 0.05, (steps, per_step)), 0.0, 0.2)
    rewards += bias * (lengths - MEAN_LENGTH) / MEAN_LENGTH
    return lengths, rewards


def run(lengths: np.ndarray, rewards: np.ndarray, settings: DetectorSettings | None = None) -> HackingDetector:
    detector = HackingDetector(settings)
    for t in range(len(lengths)):
        detector.observe(t + 1, lengths[t], rewards[t])
    return detector


# -- the parts ----------------------------------------------------------------------------------------------------


def test_reward_bins_give_each_of_few_values_a_bin_and_room_beyond_them():
    edges = reward_bins(np.array([0.0, 1.0, 1.0, 0.0, 0.5]), bins=5)
    bins = np.searchsorted(edges, [-1.0, 0.0, 0.5, 1.0, 2.0], side="right")
    assert list(bins) == [0, 1, 2, 3, 4]  # below, each value, above
    continuous = reward_bins(np.random.default_rng(0).normal(size=500), bins=5)
    assert continuous.size == 4 and np.all(np.diff(continuous) > 0)
    counts = np.bincount(np.searchsorted(continuous, np.random.default_rng(0).normal(size=500), side="right"))
    assert np.all(np.abs(counts - 100) <= 1)  # quantile bins: equal shares of the warm-up


def test_reward_kl_is_zero_for_the_same_rewards_and_grows_with_the_shift():
    rng = np.random.default_rng(1)
    reference = rng.normal(size=400)
    edges = reward_bins(reference, 5)
    assert reward_kl(reference, reference, edges) == pytest.approx(0.0, abs=1e-12)
    shifts = [reward_kl(reference, reference + shift, edges) for shift in (0.25, 0.5, 1.0, 2.0)]
    assert shifts == sorted(shifts) and shifts[0] > 0
    # against the definition written out: sum p log(p/q), pseudo-count 0.5 a bin
    current = reference + 1.0
    p = np.bincount(np.searchsorted(edges, reference, side="right"), minlength=5) + 0.5
    q = np.bincount(np.searchsorted(edges, current, side="right"), minlength=5) + 0.5
    p, q = p / p.sum(), q / q.sum()
    assert reward_kl(reference, current, edges) == pytest.approx(float(np.sum(p * np.log(p / q))))
    # a bin the current rewards never reach costs a finite amount (the smoothing floor)
    assert np.isfinite(reward_kl(np.zeros(10), np.ones(10), reward_bins(np.zeros(10), 5)))


def test_the_warm_up_is_ok_and_reads_no_score():
    detector = HackingDetector(DetectorSettings(warmup_steps=4))
    readings = [detector.observe(step, [10, 12], [0.0, 1.0]) for step in range(1, 5)]
    assert all(r.status is DetectorStatus.OK and r.length_z is None and r.reward_kl is None for r in readings)
    after = detector.observe(5, [11, 11], [1.0, 0.0])
    assert after.length_z is not None and after.reward_kl is not None


def test_a_length_jump_warns_then_stops_after_k_checkpoints_naming_the_length():
    settings = DetectorSettings(warmup_steps=10, window=1)
    rng = np.random.default_rng(2)
    detector = HackingDetector(settings)
    for step in range(1, 11):
        detector.observe(step, rng.normal(100, 5, 8).round().clip(1), rng.random(8).round())
    statuses = [detector.observe(step, [200] * 8, rng.random(8).round()).status for step in range(11, 15)]
    assert statuses[:3] == [DetectorStatus.WARNING, DetectorStatus.WARNING, DetectorStatus.HARD_STOP]
    first = detector.first_alarm
    assert first.step == 11 and first.signals == ["length"] and "length z" in first.message
    assert [e.status for e in detector.events] == [DetectorStatus.WARNING, DetectorStatus.HARD_STOP]


def _ones(count: int, of: int = 20) -> list[float]:
    return [1.0] * count + [0.0] * (of - count)


def test_the_kl_rule_needs_a_monotone_rise_above_the_threshold():
    """Fires exactly where none of the last K readings fell and each sits above the threshold; a fall resets it."""
    k, threshold = 3, 0.15
    detector = HackingDetector(DetectorSettings(warmup_steps=10, window=1, trend_checkpoints=k, length_z=1e9))
    for step in range(1, 11):
        detector.observe(step, [10] * 20, _ones(10))
    kls, fired = [], []
    for step, ones in enumerate([11, 13, 15, 17, 16, 17, 19, 20, 20], start=11):
        reading = detector.observe(step, [10] * 20, _ones(ones))
        kls.append(reading.reward_kl)
        fired.append("reward_kl" in reading.fired)
    expected = [i >= k and all(b >= a for a, b in zip(kls[i - k:i], kls[i - k + 1:i + 1]))
                and all(value > threshold for value in kls[i - k + 1:i + 1]) for i in range(len(kls))]
    assert fired == expected
    assert any(fired) and not fired[4] and not fired[5]  # 17 -> 16 of 20 is a fall: the run starts again
    assert fired[-1]  # 20 -> 20: pinned at the top is no fall


def test_both_rules_at_once_is_a_hard_stop():
    detector = HackingDetector(DetectorSettings(warmup_steps=10, window=1, trend_checkpoints=2))
    for step in range(1, 11):
        detector.observe(step, [98, 102] * 10, _ones(10))
    quiet = [detector.observe(11, [100] * 20, _ones(12)), detector.observe(12, [100] * 20, _ones(17))]
    both = detector.observe(13, [200] * 20, _ones(20))
    assert [r.status for r in quiet] == [DetectorStatus.OK, DetectorStatus.OK]
    assert both.status is DetectorStatus.HARD_STOP and both.fired == ["length", "reward_kl"]
    assert "both rules fire" in detector.events[-1].message


def test_settings_are_validated_and_the_report_round_trips():
    with pytest.raises(ValueError):
        DetectorSettings(warmup_steps=1)
    lengths, rewards = simulate(3, 60)
    report = run(lengths, rewards, DetectorSettings(warmup_steps=10)).report()
    again = DetectorReport.from_stored(report.model_dump_json())
    assert again == report and again.schema_version == 1 and len(again.steps) == 60
    assert again.baseline["length_std"] > 0 and len(again.baseline["reward_histogram"]) >= 2


def test_a_log_replays_through_the_same_detector(tmp_path):
    lengths, rewards = simulate(4, 80, onset=30, slope=6.0, bias=0.5)
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": t + 1, "lengths": [int(x) for x in lengths[t]],
                                       "rewards": [float(x) for x in rewards[t]],
                                       "rewards_by_function": {"len": [1.0] * 16}}) + "\n"
                           for t in range(80)))
    replayed = replay_detector(read_detector_log(log), DetectorSettings())
    assert replayed == run(lengths, rewards).report()
    assert replayed.first_alarm is not None


@pytest.mark.parametrize(("line", "where"), [
    ("not json", "log.jsonl:2: not JSON"),
    ('{"step": 2, "lengths": [1], "rewards": [0.0], "extra": 1}', "log.jsonl:2: field 'extra'"),
    ('{"step": 2, "rewards": [0.0]}', "log.jsonl:2: field 'lengths': missing"),
    ('{"step": 1, "lengths": [1], "rewards": [0.0]}', "log.jsonl:2: field 'step': 1 does not follow step 1"),
    ('{"step": 2, "lengths": [1, -3], "rewards": [0.0, 1.0]}', "log.jsonl:2: field 'lengths[1]'"),
    ('{"step": 2, "lengths": [1, 2], "rewards": [0.0]}', "log.jsonl:2: field 'rewards': expected a list of 2"),
    ('{"step": 2, "lengths": [1], "rewards": ["x"]}', "log.jsonl:2: field 'rewards[0]'"),
    ('{"step": 2, "lengths": [1], "rewards": [1], "rewards_by_function": {"f": []}}',
     "log.jsonl:2: field 'rewards_by_function.f'"),
])
def test_a_bad_log_line_is_named_by_file_line_and_field(tmp_path, line, where):
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "lengths": [3], "rewards": [null]}\n' + line + "\n")
    with pytest.raises(ConfigError) as caught:
        read_detector_log(log)
    assert str(caught.value).startswith(str(tmp_path / where))


# -- measured: null and drift -------------------------------------------------------------------------------------

NULL_RUNS, NULL_STEPS = 10, 1000


@pytest.mark.parametrize("family", ["mixed", "binary"])
def test_null_false_alarms_stay_under_two_percent_of_checkpoints(family):
    """Stationary curves: every non-OK checkpoint is a false alarm; its rate's Wilson upper end is under 2 %."""
    settings = DetectorSettings()
    alarms = checkpoints = 0
    for seed in range(NULL_RUNS):
        report = run(*simulate(seed, NULL_STEPS, family=family), settings).report()
        alarms += report.false_alarm_steps()
        checkpoints += NULL_STEPS - settings.warmup_steps
    low, high = wilson_interval(alarms, checkpoints)
    print(f"\nnull ({family}): {alarms} false-alarm checkpoints of {checkpoints} = {1000 * alarms / checkpoints:.2f} "
          f"per 1,000 (95 % Wilson {1000 * low:.2f}-{1000 * high:.2f})")
    assert high <= 0.02
    assert low <= alarms / checkpoints <= high


def test_null_with_no_window_is_what_the_window_is_for():
    """The same curves read one checkpoint at a time (window 1) alarm far more often: the default window earns
    its place (this is how the window was chosen)."""
    lengths, rewards = simulate(0, NULL_STEPS)
    noisy = run(lengths, rewards, DetectorSettings(window=1)).report().false_alarm_steps()
    default = run(lengths, rewards).report().false_alarm_steps()
    assert noisy > 5 * max(default, 1)


#: tokens per step of verbose-bias drift (from a 200-token mean) -> the longest delay allowed, in steps
DRIFT_BOUNDS = {0.5: 200, 1.0: 100, 2.0: 60, 4.0: 35}


def test_verbose_bias_drift_is_caught_within_a_bounded_delay():
    """Delay: from the drift's first step to the first checkpoint after it that is not OK (an alarm before the
    drift began is a false alarm, counted apart)."""
    onset, delays, early = 100, {}, 0
    for slope, bound in DRIFT_BOUNDS.items():
        found = []
        for seed in range(10):
            detector = run(*simulate(500 + seed, 400, onset=onset, slope=slope, bias=0.5))
            early += any(r.status is not DetectorStatus.OK for r in detector.steps[:onset])
            alarm = next((r for r in detector.steps[onset:] if r.status is not DetectorStatus.OK), None)
            assert alarm is not None, (slope, seed)
            found.append(alarm.step - onset)
        delays[slope] = found
        assert max(found) <= bound, (slope, found)
    medians = [float(np.median(delays[slope])) for slope in DRIFT_BOUNDS]
    print("\ndrift delays (median, max) by slope:",
          {slope: (float(np.median(d)), max(d)) for slope, d in delays.items()})
    assert medians == sorted(medians, reverse=True)  # faster drift, sooner alarm
    assert early <= 4  # of 40 runs, 100 stationary checkpoints each


def test_the_plot_of_a_detector_run(tmp_path):
    detector = run(*simulate(7, 300, onset=120, slope=2.0, bias=0.5))
    path = plot_detector(detector.report(), tmp_path / "hacking.png", "simulated verbose-bias drift")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_detector_reads_unscored_completions_as_missing_rewards():
    detector = HackingDetector(DetectorSettings(warmup_steps=2))
    detector.observe(1, [5, 5], [None, 1.0])
    reading = detector.observe(2, [5, 5], [float("nan"), None])
    assert reading.mean_reward is None
    with pytest.raises(ConfigError, match="no completions"):
        detector.observe(3, [], [])


def test_step_observation_is_the_log_line():
    line = StepObservation(step=1, lengths=[3], rewards=[None])
    assert json.loads(line.model_dump_json(exclude_none=True)) == {"step": 1, "lengths": [3], "rewards": [None]}


# -- the command --------------------------------------------------------------------------------------------------


def write_log(path, lengths: np.ndarray, rewards: np.ndarray):
    path.write_text("".join(json.dumps({"step": t + 1, "lengths": [int(x) for x in lengths[t]],
                                        "rewards": [float(x) for x in rewards[t]]}) + "\n"
                            for t in range(len(lengths))))
    return path


def test_train_detect_prints_the_status_per_step_and_the_first_alarm(cli, tmp_path):
    log = write_log(tmp_path / "log.jsonl", *simulate(4, 120, onset=50, slope=4.0, bias=0.5))
    result = cli("train", "detect", log, "--plot", tmp_path / "d.png")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert sum(line.startswith("step ") for line in lines) == 120
    assert lines[0].split()[2] == "OK"
    first = next(line for line in lines if line.startswith("first alarm at step "))
    assert "(length)" in first and "length z" in first
    assert (tmp_path / "d.png").stat().st_size > 0
    report = json.loads(cli("train", "detect", log, "--json").stdout)
    assert report["first_alarm"]["step"] == int(first.split()[4].rstrip(":"))
    assert len(report["steps"]) == 120 and report["settings"]["length_z"] == 2.5


def test_train_detect_on_a_quiet_log_says_no_alarm(cli, tmp_path):
    log = write_log(tmp_path / "log.jsonl", *simulate(1, 60))
    result = cli("train", "detect", log, "--warmup-steps", "10")
    assert result.exit_code == 0 and "no alarm in 60 step(s)" in result.stdout


def test_train_detect_names_a_bad_line(cli, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "lengths": [3], "rewards": [0.5]}\n{"step": 2, "lengths": "many", "rewards": []}\n')
    result = cli("train", "detect", log)
    assert result.exit_code == 2 and f"{log}:2: field 'lengths'" in result.stderr
