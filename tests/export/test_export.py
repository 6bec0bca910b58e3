"""Export from a real run: every format, its strategies and filters, the manifest, the card and validation."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from factory.errors import ConfigError, ExportError, ExportValidationError
from factory.export import (
    EXPORT_FORMATS,
    ExportManifest,
    ExportOptions,
    PairOptions,
    build_pairs,
    export,
    load_source,
    validate_file,
)
from factory.store import Store
from tests._runs import FIXED

#: Feedback formats (hints, spans) need accepted feedback, which this run has none of: tests/feedback.
FORMATS = [name for name in EXPORT_FORMATS.names() if name not in ("hints", "spans")]


def run_export(db: Path, fmt: str, out: Path, options: ExportOptions | None = None, runs=("r1",), **kwargs):
    with Store.open(db, read_only=True) as store:
        return export(store, fmt, list(runs), out, options, **kwargs)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_validates_loads_with_datasets_and_says_where_rows_came_from(exported_run, tmp_path, fmt,
                                                                                 suffix):
    datasets = pytest.importorskip("datasets")
    result = run_export(exported_run, fmt, tmp_path / f"{fmt}{suffix}")
    assert validate_file(result.path, fmt) == result.manifest.rows > 0
    loaded = datasets.load_dataset(suffix.lstrip(".").replace("jsonl", "json"), data_files=str(result.path),
                                   split="train")
    assert loaded.num_rows == result.manifest.rows
    assert {"run_id", "task_id"} <= set(loaded.column_names)
    if fmt != "grpo":
        assert "verifier_versions" in loaded.column_names
        assert all(v and all("@" in x for x in v) for v in loaded["verifier_versions"])
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["format"] == fmt and manifest["file"] == result.path.name
    assert manifest["dataset_hash"].startswith("sha256:") and manifest["config_hash"].startswith("sha256:")
    assert manifest["powered"] is False and "judge_objective_agreement" in manifest
    # no judge in this run: the order is the verifier's own outcome, so no evidence test applies, and it says so
    ranking = manifest["runs"][0]["ranking"]
    assert ranking["test"] is None and ranking["reason"].startswith("ordered by the verifier's own outcome")
    assert ranking["outcomes"]["verified"] > 0 and "usable_pairs" in ranking["definitions"]
    assert manifest["evidence"] is False and manifest["evidence_tests"] == [f"r1: {ranking['reason']}"]
    # the file is the typed record as written, versioned, and reads back as the same record
    assert manifest["schema_version"] == 1 and ("kto" in manifest) == (fmt == "kto")
    assert ExportManifest.from_stored(result.manifest_path.read_text()) == result.manifest
    card = result.card_path.read_text()
    assert card.startswith("---\nconfigs:") and f"path: {result.path.name}" in card


def test_dpo_best_worst_is_one_pair_per_task_and_never_chooses_a_hack(exported_run, tmp_path):
    result = run_export(exported_run, "dpo", tmp_path / "dpo.jsonl")
    pairs = rows(result.path)
    assert sorted(p["task_id"] for p in pairs) == ["add", "fix-factorial", "mul"]
    with Store.open(exported_run, read_only=True) as store:
        branches = load_source(store, ["r1"]).branches
    hacked = {(r["task_id"], r["branch_index"]) for r in branches.filter(pl.col("hack_detected")).iter_rows(named=True)}
    assert hacked, "the fixture run plants a conftest.py hack"
    for pair in pairs:
        assert (pair["task_id"], pair["chosen_branch"]) not in hacked
        assert pair["chosen_reward"] > pair["rejected_reward"] and pair["margin"] > 0
        assert pair["prompt"][0]["role"] == "system" and pair["prompt"][1]["role"] == "user"
        assert pair["chosen"][0]["role"] == "assistant" and pair["chosen"] != pair["rejected"]
    # a code task's completion keeps its tool calls (arguments as JSON text) and tool results
    code = next(p for p in pairs if p["task_id"] == "fix-factorial")
    call = code["chosen"][0]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "write_file"
    assert json.loads(call["function"]["arguments"])["path"] == "solution.py"
    assert any(m["role"] == "tool" for m in code["chosen"])
    assert [t["function"]["name"] for t in json.loads(code["tools"])] == [
        "read_file", "write_file", "list_files", "run", "submit"]
    assert next(p for p in pairs if p["task_id"] == "add")["tools"] is None  # single-turn: no tools


def test_all_pairs_pass_fail_margins_and_hacks_as_rejected(exported_run):
    with Store.open(exported_run, read_only=True) as store:
        branches = load_source(store, ["r1"]).branches
    best_worst = build_pairs(branches, PairOptions())
    every = build_pairs(branches, PairOptions(strategy="all-pairs"))
    assert every.height > best_worst.height
    assert every.group_by("task_id").len()["len"].max() > 1  # N ranked branches yield more than one pair
    pass_fail = build_pairs(branches, PairOptions(strategy="pass-fail"))
    assert pass_fail["chosen_objective_pass"].all() and not pass_fail["rejected_objective_pass"].any()
    wide = build_pairs(branches, PairOptions(strategy="all-pairs", min_margin=0.75))
    assert wide.height < every.height and (wide["margin"] >= 0.75).all()
    separated = build_pairs(branches, PairOptions(strategy="all-pairs", ci_separated=True))
    assert (separated["chosen_ci_low"] > separated["rejected_ci_high"]).all() and separated.height <= every.height
    capped = build_pairs(branches, PairOptions(strategy="all-pairs", max_pairs_per_task=1))
    assert capped.group_by("task_id").len()["len"].max() == 1
    assert not every["rejected_hack_detected"].any()
    with_hacks = build_pairs(branches, PairOptions(strategy="all-pairs", hacks_as_rejected=True))
    hacked = with_hacks.filter(pl.col("rejected_hack_detected"))
    assert hacked.height > 0 and hacked["chosen_objective_pass"].all()  # only against a clean pass
    assert not with_hacks["chosen_hack_detected"].any()
    by_strength = build_pairs(branches, PairOptions(strategy="all-pairs", margin_by="strength"))
    assert (by_strength["margin"] - (by_strength["chosen_strength"] - by_strength["rejected_strength"])).abs().max() \
        < 1e-12
    with pytest.raises(ConfigError, match="unknown pair strategy"):
        PairOptions(strategy="random")


def test_length_balance_top_confidence_and_the_reported_bias(exported_run, tmp_path):
    every = ExportOptions(pairs=PairOptions(strategy="all-pairs"))
    plain = run_export(exported_run, "dpo", tmp_path / "all.jsonl", every).manifest
    bias = plain.length_bias
    assert bias["pairs"] == plain.rows and 0 <= bias["chosen_longer_share"] <= 1 and bias["mean_length_ratio"] > 0
    balanced = run_export(exported_run, "dpo", tmp_path / "bal.jsonl",
                          ExportOptions(pairs=PairOptions(strategy="all-pairs"), length_balance=True)).manifest
    b = balanced.length_bias
    assert b["chosen_longer_share"] == b["chosen_shorter_share"]  # as often longer as shorter
    assert balanced.counts["length_bias_before_filters"] == bias
    top = run_export(exported_run, "dpo", tmp_path / "top.jsonl",
                     ExportOptions(pairs=PairOptions(strategy="all-pairs"), top_confidence=0.5))
    kept = rows(top.path)
    assert len(kept) == -(-plain.rows // 2)
    assert min(r["margin"] for r in kept) >= sorted((r["margin"] for r in rows(tmp_path / "all.jsonl")),
                                                     reverse=True)[len(kept) - 1]


def test_kto_labels_and_class_weights(exported_run, tmp_path):
    result = run_export(exported_run, "kto", tmp_path / "kto.jsonl")
    kto = result.manifest.kto
    data = rows(result.path)
    assert len(data) == 12 and kto.desirable == sum(r["label"] for r in data)
    assert kto.desirable * kto.desirable_weight == pytest.approx(kto.undesirable * kto.undesirable_weight, rel=1e-5)
    with Store.open(exported_run, read_only=True) as store:
        hacked = load_source(store, ["r1"]).branches.filter(pl.col("hack_detected"))
    for row in hacked.iter_rows(named=True):  # a hack is never desirable, even where its tests "pass"
        assert not next(r for r in data if (r["task_id"], r["branch"]) == (row["task_id"], row["branch_index"]))[
            "label"]


def test_sft_winners_reward_scalar_file_and_grpo_verifier_columns(exported_run, tmp_path):
    sft = rows(run_export(exported_run, "sft", tmp_path / "sft.jsonl").path)
    assert sorted(r["task_id"] for r in sft) == ["add", "fix-factorial", "mul"] and all(r["rank"] == 1 for r in sft)
    assert all([m["role"] for m in r["messages"][:2]] == ["system", "user"] for r in sft)
    everyone = rows(run_export(exported_run, "sft", tmp_path / "sft-all.jsonl",
                               ExportOptions(sft_all_passing=True)).path)
    assert len(everyone) > len(sft)
    reward = run_export(exported_run, "reward", tmp_path / "reward.jsonl")
    scalar = rows(reward.extra_paths["scalar"])
    assert len(scalar) == 12 and {"prompt", "completion", "reward", "components"} <= set(scalar[0])
    assert set(scalar[0]["components"]) == {"objective", "judge", "objective_pass", "hack_detected", "hack_suspected"}
    assert reward.manifest.files["scalar"].file == "reward.scalar.jsonl"
    grpo = {r["task_id"]: r for r in rows(run_export(exported_run, "grpo", tmp_path / "grpo.jsonl").path)}
    assert grpo["add"]["answer"] == "42" and grpo["add"]["verifiers"] == ["answer"]
    assert "test_solution.py" in json.loads(grpo["fix-factorial"]["tests"])
    assert grpo["fix-factorial"]["test_command"] == "python -m pytest -q"
    # the task's reference solution (its tests' answer key) is never exported, in any column
    spec = json.loads(grpo["fix-factorial"]["task_spec"])
    assert "solution" not in spec and spec["tests"] and FIXED not in json.dumps(grpo["fix-factorial"])


def test_standard_format_is_all_strings(exported_run, tmp_path):
    result = run_export(exported_run, "dpo", tmp_path / "std.jsonl", ExportOptions(conversational=False))
    data = rows(result.path)
    assert all(isinstance(r[k], str) and r[k] for r in data for k in ("prompt", "chosen", "rejected"))
    code = next(r for r in data if r["task_id"] == "fix-factorial")
    assert '<tool_call>{"name": "write_file"' in code["chosen"] and "<tool_result" in code["chosen"]
    assert validate_file(result.path, "dpo") == len(data)


def test_stored_rankings_are_read_and_rolling_keeps_the_last_runs(exported_run, tmp_path, cli):
    db = tmp_path / "copy.duckdb"
    shutil.copy(exported_run, db)
    ranked = cli("rank", "r1", "--db", str(db), "--json")
    assert ranked.exit_code == 0, ranked.output
    result = run_export(db, "dpo", tmp_path / "ranked.jsonl")
    assert result.manifest.runs[0].ranked_at_export is False
    assert result.manifest.runs[0].ranking["n_tasks"] == 3
    from tests._runs import REPLIES, fork_run

    replies = tmp_path / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    fork_run(db, replies, run_id="r2", branches=2)
    rolled = run_export(db, "dpo", tmp_path / "rolled.jsonl", runs=("r1", "r2"), rolling=1)
    assert rolled.manifest.run_ids == ["r2"] and {r["run_id"] for r in rows(rolled.path)} == {"r2"}
    both = run_export(db, "dpo", tmp_path / "both.jsonl", runs=("r1", "r2"))
    assert {r["run_id"] for r in rows(both.path)} == {"r1", "r2"} and both.manifest.config_hash is None
    assert len(both.manifest.config_hashes) == 2


def test_dedupe_removes_repeated_content(exported_run, tmp_path):
    db = tmp_path / "twice.duckdb"
    shutil.copy(exported_run, db)
    from tests._runs import REPLIES, fork_run

    replies = tmp_path / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    fork_run(db, replies, run_id="r1b")  # same tasks, same seeds: the same conversations again
    plain = run_export(db, "dpo", tmp_path / "plain.jsonl", runs=("r1", "r1b"))
    deduped = run_export(db, "dpo", tmp_path / "dedupe.jsonl", ExportOptions(dedupe=True), runs=("r1", "r1b"))
    assert plain.manifest.rows == 2 * deduped.manifest.rows
    assert deduped.manifest.counts["duplicates_removed"] == deduped.manifest.rows


def test_validate_names_the_line_and_field_of_every_problem(tmp_path):
    good = {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}]}
    lines = [
        good,
        {**good, "rejected": good["chosen"]},                                   # 2: chosen == rejected
        {**good, "chosen": "a plain string"},                                   # 3: mixed formats
        {"prompt": good["prompt"], "chosen": good["chosen"]},                   # 4: missing field
        {**good, "chosen": [{"role": "assistant", "content": "  "}]},           # 5: empty content
        {**good, "prompt": [{"role": "wizard", "content": "q"}]},               # 6: unknown role
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "{not json\n")
    with pytest.raises(ExportValidationError) as caught:
        validate_file(path, "dpo")
    problems = caught.value.problems
    expected = [(2, "field 'rejected': identical to 'chosen'"), (3, "one format per file"),
                (4, "field 'rejected': missing"), (5, "field 'chosen[0]': empty content"),
                (6, "field 'prompt[0]': role 'wizard'"), (7, "not JSON")]
    for line, text in expected:
        assert any(p.startswith(f"{path}:{line}: ") and text in p for p in problems), (line, text, problems)
    assert not any(p.startswith(f"{path}:1:") for p in problems)
    kto = tmp_path / "kto.jsonl"
    kto.write_text(json.dumps({"prompt": "q", "completion": "a", "label": "yes"}) + "\n")
    with pytest.raises(ExportValidationError, match=r"kto.jsonl:1: field 'label': expected true or false"):
        validate_file(kto, "kto")


def test_a_failed_export_leaves_the_previous_file_intact(exported_run, tmp_path):
    out = tmp_path / "dpo.jsonl"
    first = run_export(exported_run, "dpo", out)
    before = out.read_bytes()
    with pytest.raises(ExportError, match="no run nope"):
        run_export(exported_run, "dpo", out, runs=("nope",))
    with pytest.raises(ExportError, match="nothing to export"):  # no task has a pair this wide
        run_export(exported_run, "dpo", out, ExportOptions(pairs=PairOptions(min_margin=5.0)))
    assert out.read_bytes() == before and first.manifest_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "dpo.jsonl", "dpo.jsonl.manifest.json"]
    # the one most confident pair ("add": the terse right answer over a longer wrong one) is unbalanced alone
    with pytest.raises(ExportError, match="the filters dropped all 3 pairs"):
        run_export(exported_run, "dpo", out, ExportOptions(length_balance=True, top_confidence=0.01))
    assert out.read_bytes() == before
    with pytest.raises(ConfigError, match=".jsonl or .parquet"):
        run_export(exported_run, "dpo", tmp_path / "dpo.csv")


def test_export_cli(exported_run, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "factory.cli", "export", *args], capture_output=True, text=True,
                              timeout=120)

    out = tmp_path / "kto.jsonl"
    done = cli("kto", "--run", "r1", "--out", str(out), "--db", str(exported_run))
    assert done.returncode == 0, done.stderr
    assert "class balance: 5 desirable / 7 undesirable" in done.stdout
    assert "desirable_weight=1.0, undesirable_weight=0.714286" in done.stdout
    data = json.loads(cli("dpo", "--run", "r1", "--out", str(tmp_path / "d.parquet"), "--db", str(exported_run),
                          "--strategy", "all-pairs", "--min-margin", "0.4", "--json").stdout)
    assert data["manifest"]["strategy"] == "all-pairs" and data["manifest"]["filters"]["pairs"]["min_margin"] == 0.4
    valid = cli("validate", str(out), "--format", "kto")
    assert valid.returncode == 0 and "12 valid kto row(s)" in valid.stdout
    wrong = cli("validate", str(out), "--format", "dpo")
    assert wrong.returncode == 2 and f"{out}:1: field 'chosen': missing" in wrong.stderr
    missing = cli("dpo", "--run", "nope", "--out", str(tmp_path / "x.jsonl"), "--db", str(exported_run))
    assert missing.returncode == 1 and missing.stderr.startswith("error: no run nope")
    both = cli("dpo", "--run", "r1", "--runs", "r1,r2", "--out", str(tmp_path / "x.jsonl"), "--db", str(exported_run))
    assert both.returncode == 2 and "exactly one of --run" in both.stderr


def test_the_reward_scalar_file_validates_as_its_own_side_file(exported_run, tmp_path):
    run_export(exported_run, "reward", tmp_path / "reward.jsonl")
    scalar = tmp_path / "reward.scalar.jsonl"
    assert validate_file(scalar, "reward-scalar") == len(scalar.read_text().splitlines())
    record = json.loads(scalar.read_text().splitlines()[0])
    bad = tmp_path / "bad.scalar.jsonl"
    bad.write_text(json.dumps({**record, "reward": "high"}) + "\n")
    with pytest.raises(ExportValidationError, match=rf"{bad}:1: field 'reward': expected a finite number"):
        validate_file(bad, "reward-scalar")
