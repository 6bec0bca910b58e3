"""``factory tasks import``: real rows of each format (tests/data/imports) as tasks, and every problem named.

The fixtures are real rows under their licences (see tests/data/imports/README.md): HumanEval's first 12,
MBPP's tasks 1-11, GSM8K and MATH rows, and a SWE-bench-style instance with its repository snapshot.
Verification of what is imported (reference solutions pass, stubs fail) runs in real bwrap sandboxes in
``test_tasks_import_check.py``; here the conversion itself is checked, without sandboxes.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory.errors import TaskFileError
from factory.tasks import (
    MAP_KEYS,
    TASK_IMPORTERS,
    Importer,
    ImportReport,
    SkippedRow,
    apply_patch,
    import_tasks,
    load_tasks,
    write_tasks,
)

DATA = Path(__file__).parent / "data" / "imports"
FIXTURES = {"humaneval": DATA / "humaneval" / "HumanEval.jsonl", "mbpp": DATA / "mbpp" / "mbpp.jsonl",
            "gsm8k": DATA / "gsm8k" / "gsm8k.jsonl", "math": DATA / "math" / "math.jsonl",
            "swe": DATA / "swe" / "instances.jsonl"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "factory.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_every_format_is_registered_as_an_importer():
    assert {"humaneval", "mbpp", "gsm8k", "math", "swe", "mapped"} <= set(TASK_IMPORTERS.names())
    assert all(issubclass(TASK_IMPORTERS.get(name), Importer) for name in TASK_IMPORTERS.names())


@pytest.mark.parametrize("fmt", sorted(FIXTURES))
def test_each_fixture_imports_every_row_and_records_format_and_source_hash(fmt):
    report = import_tasks(fmt, FIXTURES[fmt])
    assert isinstance(report, ImportReport)
    assert len(report.tasks) == report.rows == len(rows(FIXTURES[fmt])) and not report.skipped
    for number, task in enumerate(report.tasks, start=1):
        stamp = task.metadata["import"]
        assert stamp["format"] == fmt and stamp["row"] == number
        assert stamp["source_sha256"] == report.source_sha256 and report.source_sha256.startswith("sha256:")


@pytest.mark.parametrize("fmt", sorted(FIXTURES))
def test_import_is_idempotent_same_source_same_bytes_and_hashes(fmt, tmp_path):
    first = write_tasks(import_tasks(fmt, FIXTURES[fmt]).tasks, tmp_path / "a.jsonl")
    second = write_tasks(import_tasks(fmt, FIXTURES[fmt]).tasks, tmp_path / "b.jsonl")
    assert first.read_bytes() == second.read_bytes()
    loaded = load_tasks(first)  # what was written validates like any task file
    assert [t.task_hash() for t in loaded] == [t.task_hash() for t in load_tasks(second)]
    assert loaded.dataset_hash == import_tasks(fmt, FIXTURES[fmt]).dataset_hash


def test_humaneval_stub_is_the_starter_canonical_the_reference_and_the_test_hidden():
    source = rows(FIXTURES["humaneval"])
    tasks = import_tasks("humaneval", FIXTURES["humaneval"]).tasks
    for row, task in zip(source, tasks):
        assert task.id == row["task_id"].replace("/", "-")
        assert task.metadata["import"]["source_id"] == row["task_id"]
        assert task.files == {"solution.py": row["prompt"]}
        assert task.solution == {"solution.py": row["prompt"] + row["canonical_solution"]}
        assert not task.tests and len(task.hidden_tests) == 1  # the expected values never reach the agent
        test = next(iter(task.hidden_tests.values()))
        assert row["test"].strip() in test and f"check({row['entry_point']})" in test
        assert row["canonical_solution"] not in task.prompt  # the prompt shows the stub, never the answer
        ast.parse(test)


def test_humaneval_tests_import_the_prompt_helpers_they_use():
    tasks = {t.id: t for t in import_tasks("humaneval", FIXTURES["humaneval"]).tasks}
    # HumanEval/10's prompt defines is_palindrome beside the make_palindrome stub
    header = next(iter(tasks["HumanEval-10"].hidden_tests.values())).split("\n\n")[0]
    assert "from solution import make_palindrome" in header


def test_mbpp_stub_signature_visible_asserts_hidden_challenge_and_reference_code():
    source = {row["task_id"]: row for row in rows(FIXTURES["mbpp"])}
    tasks = {t.id: t for t in import_tasks("mbpp", FIXTURES["mbpp"]).tasks}
    task = tasks["mbpp-2"]
    stub = task.files["solution.py"]
    assert stub.startswith("def similar_elements(test_tup1, test_tup2):") and "NotImplementedError" in stub
    assert task.solution["solution.py"] == source[2]["code"].replace("\r\n", "\n")
    (test,) = task.tests.values()
    assert test.count("def test_") == len(source[2]["test_list"])
    assert all(assert_line.strip() in task.prompt for assert_line in source[2]["test_list"])
    with_challenge = [t for t in tasks.values() if t.hidden_tests]
    assert with_challenge, "the fixture has a row with challenge tests"
    for task in with_challenge:
        row = source[int(task.metadata["import"]["source_id"])]
        (hidden,) = task.hidden_tests.values()
        assert hidden.count("def test_") == len(row["challenge_test_list"])
        assert not any(line.strip() in task.prompt for line in row["challenge_test_list"])


def test_gsm8k_answers_normalised_for_the_strict_verifier_original_kept():
    tasks = import_tasks("gsm8k", FIXTURES["gsm8k"]).tasks
    for row, task in zip(rows(FIXTURES["gsm8k"]), tasks):
        original = row["answer"].rsplit("####", 1)[1].strip()
        assert task.metadata["original_answer"] == original
        assert task.answer == original.replace(",", "")
        assert task.verifiers == ("answer",) and row["question"].strip() in task.prompt
        assert "#### " not in task.prompt and task.metadata["worked_solution"] not in task.prompt
    answers = {t.answer for t in tasks}
    assert "1080" in answers and "-7" in answers  # "1,080" and a negative, as the fixture has


def test_math_boxed_answers_with_nested_braces_units_and_text_normalised():
    tasks = import_tasks("math", FIXTURES["math"]).tasks
    got = {t.metadata["original_answer"]: t.answer for t in tasks}
    assert got["\\frac{243}{625}"] == "\\frac{243}{625}"
    assert got["-\\frac{35}{9}"] == "-\\frac{35}{9}"
    assert got["\\$15,\\!000"] == "15000" and got["10,\\!080"] == "10080"
    assert got["76^\\circ"] == "76" and got["5\\text{ inches}"] == "5"
    assert got["\\text{neither}"] == "neither" and got["(5,\\infty)"] == "(5,\\infty)"
    assert all(t.metadata.get("level") and t.metadata.get("type") for t in tasks)


def test_swe_instance_snapshot_files_hidden_patched_tests_listed_ids_and_gold_patch():
    (row,) = rows(FIXTURES["swe"])
    (task,) = import_tasks("swe", FIXTURES["swe"]).tasks
    assert task.id == row["instance_id"]
    assert set(task.hidden_tests) == {"tests/test_textkit.py", "tests/test_truncate_edges.py"}
    assert "def test_truncate_exact_width" in task.hidden_tests["tests/test_textkit.py"]
    assert "textkit/wrap.py" in task.files and "textkit/wrap.py" in task.solution
    assert task.files["textkit/wrap.py"] != task.solution["textkit/wrap.py"]
    assert not set(task.files) & (set(task.tests) | set(task.hidden_tests))
    ids = json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])
    assert task.test_command.split()[:4] == ["python", "-m", "pytest", "-q"]
    assert task.test_command.split()[4:] == ids
    assert task.metadata["FAIL_TO_PASS"] == json.loads(row["FAIL_TO_PASS"])
    assert task.metadata["base_commit"] == row["base_commit"]
    assert row["patch"] not in task.prompt and row["problem_statement"].strip() in task.prompt


def test_swe_snapshot_from_an_archive_gives_the_same_task(tmp_path):
    (row,) = rows(FIXTURES["swe"])
    repos = tmp_path / "snapshots"
    repos.mkdir()
    with tarfile.open(repos / f"{row['instance_id']}.tar.gz", "w:gz") as archive:
        # a forge's archive: one top-level folder, stripped on import
        archive.add(DATA / "swe" / "repos" / row["instance_id"], arcname=f"textkit-{row['base_commit'][:7]}")
    from_folder = import_tasks("swe", FIXTURES["swe"]).tasks[0]
    from_archive = import_tasks("swe", FIXTURES["swe"], repos=repos).tasks[0]
    assert from_archive.task_hash() == from_folder.task_hash()


def test_swe_test_id_that_does_not_exist_is_an_import_error_naming_it(tmp_path):
    (row,) = rows(FIXTURES["swe"])
    row["FAIL_TO_PASS"] = json.dumps([*json.loads(row["FAIL_TO_PASS"]), "tests/test_textkit.py::test_no_such"])
    row["PASS_TO_PASS"] = json.dumps(["tests/test_gone.py::test_x"])
    source = tmp_path / "instances.jsonl"
    source.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskFileError) as caught:
        import_tasks("swe", source, repos=DATA / "swe" / "repos")
    (problem,) = caught.value.problems  # the first bad id of the row
    assert problem.path == str(source) and problem.line == 1 and problem.field == "FAIL_TO_PASS"
    assert "tests/test_textkit.py::test_no_such" in problem.message


def test_swe_patch_that_does_not_apply_is_an_import_error_naming_the_field(tmp_path):
    (row,) = rows(FIXTURES["swe"])
    row["patch"] = row["patch"].replace("-", "~", 3)
    source = tmp_path / "instances.jsonl"
    source.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskFileError) as caught:
        import_tasks("swe", source, repos=DATA / "swe" / "repos")
    assert [(p.line, p.field) for p in caught.value.problems] == [(1, "patch")]


def test_parquet_and_a_saved_datasets_folder_give_the_jsonl_tasks(tmp_path):
    source = rows(FIXTURES["mbpp"])
    table = pa.Table.from_pylist(source)
    pq.write_table(table, tmp_path / "mbpp.parquet")
    folder = tmp_path / "saved"
    folder.mkdir()  # the layout Dataset.save_to_disk writes: arrow stream files listed in state.json
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (folder / "dataset_info.json").write_text("{}")

    def comparable(report):
        return [{**t.canonical(), "metadata": {**t.metadata, "import": {**t.metadata["import"], "source_sha256": 0}}}
                for t in report.tasks]

    expected = comparable(import_tasks("mbpp", FIXTURES["mbpp"]))
    assert comparable(import_tasks("mbpp", tmp_path / "mbpp.parquet")) == expected
    assert comparable(import_tasks("mbpp", folder)) == expected


def test_bad_rows_are_named_by_file_row_and_field_and_nothing_is_written(tmp_path):
    good = rows(FIXTURES["gsm8k"])
    bad = [good[0], {"question": "How many?", "answer": "It is 4."}, {"answer": "#### 3"},
           {"question": "Q", "answer": "#### three"}, good[1]]
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in bad) + "\nnot json\n")
    out = tmp_path / "tasks.jsonl"
    out.write_text("what was here before\n")
    result = cli("tasks", "import", "gsm8k", source, "--out", out)
    assert result.returncode == 2, result.stderr
    for where in (f"{source}:2: field 'answer': no '#### <answer>' line", f"{source}:3: field 'question'",
                  f"{source}:4: field 'answer'", f"{source}:6: invalid JSON"):
        assert where in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert out.read_text() == "what was here before\n"  # nothing already written is lost

    skipped = cli("tasks", "import", "gsm8k", source, "--out", out, "--skip-invalid", "--json")
    assert skipped.returncode == 0, skipped.stderr
    report = json.loads(skipped.stdout)
    assert report["imported"] == 2 and [s["row"] for s in report["skipped"]] == [2, 3, 4, 6]
    assert len(load_tasks(out)) == 2


def test_skip_invalid_reports_skipped_rows_in_the_api_too(tmp_path):
    source = tmp_path / "h.jsonl"
    good, *_ = rows(FIXTURES["humaneval"])
    source.write_text(json.dumps(good) + "\n" + json.dumps({**good, "task_id": "HumanEval/x", "entry_point": "nope"})
                      + "\n" + json.dumps({**good, "prompt": "def broken(:\n"}) + "\n")
    report = import_tasks("humaneval", source, skip_invalid=True)
    assert [t.id for t in report.tasks] == ["HumanEval-0"]
    assert all(isinstance(s, SkippedRow) for s in report.skipped)
    assert [(s.row, s.problems[0].field) for s in report.skipped] == [(2, "entry_point"), (3, "prompt")]


def test_duplicate_ids_are_a_problem_of_the_later_row(tmp_path):
    good, *_ = rows(FIXTURES["humaneval"])
    source = tmp_path / "h.jsonl"
    source.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(TaskFileError) as caught:
        import_tasks("humaneval", source)
    assert [(p.line, p.field) for p in caught.value.problems] == [(2, "id")]


def test_mapped_format_takes_any_column_layout(tmp_path):
    source = tmp_path / "quiz.jsonl"
    source.write_text(json.dumps({"qid": "q/1", "q": "What is 6 x 7?", "final": 42, "level": "easy"}) + "\n"
                      + json.dumps({"qid": "q/2", "q": "What is 2 + 2?", "final": "4", "level": "easy"}) + "\n")
    spec = tmp_path / "map.yaml"
    spec.write_text("id: qid\nprompt_template: \"{q}\\n\\nEnd with Final: <n>.\"\nanswer: final\nmetadata: [level]\n")
    tasks = import_tasks("mapped", source, map_file=spec).tasks
    assert [(t.id, t.answer, t.metadata["level"]) for t in tasks] == [("q-1", "42", "easy"), ("q-2", "4", "easy")]
    assert tasks[0].prompt.startswith("What is 6 x 7?")


def test_mapped_code_rows_get_tests_starter_and_reference(tmp_path):
    source = tmp_path / "code.jsonl"
    source.write_text(json.dumps({"name": "add", "ask": "Write add(a, b).", "stub": "def add(a, b):\n    pass\n",
                                  "ref": "def add(a, b):\n    return a + b\n",
                                  "check": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"})
                      + "\n")
    spec = tmp_path / "map.yaml"
    spec.write_text("id: name\nprompt: ask\nstarter: stub\nsolution: ref\nhidden_tests: check\n")
    (task,) = import_tasks("mapped", source, map_file=spec).tasks
    assert task.files == {"solution.py": "def add(a, b):\n    pass\n"}
    assert task.solution == {"solution.py": "def add(a, b):\n    return a + b\n"}
    assert list(task.hidden_tests) == ["test_solution.py"] and task.verifiers == ("tests",)


def test_map_file_problems_name_the_map_line_and_key(tmp_path):
    source = tmp_path / "quiz.jsonl"
    source.write_text(json.dumps({"q": "x"}) + "\n")
    spec = tmp_path / "map.yaml"
    spec.write_text("prompt: q\nanwser: final\nmetadata: level\n")
    with pytest.raises(TaskFileError) as caught:
        import_tasks("mapped", source, map_file=spec)
    assert [(p.path, p.line, p.field) for p in caught.value.problems] == [(str(spec), 2, "anwser"),
                                                                          (str(spec), 3, "metadata")]
    assert "allowed:" in caught.value.problems[0].message and "answer" in MAP_KEYS
    spec.write_text("prompt: q\nanswer: final\n")
    with pytest.raises(TaskFileError) as caught:
        import_tasks("mapped", source, map_file=spec)
    assert [(p.line, p.field) for p in caught.value.problems] == [(1, "final")]


def test_unknown_format_and_missing_source_are_clean_cli_errors(tmp_path):
    result = cli("tasks", "import", "nosuch", FIXTURES["gsm8k"], "--out", tmp_path / "t.jsonl")
    assert result.returncode == 2 and "unknown task format 'nosuch'" in result.stderr, result.stderr
    assert "humaneval" in result.stderr
    missing = cli("tasks", "import", "gsm8k", tmp_path / "none.jsonl", "--out", tmp_path / "t.jsonl")
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr and "Traceback" not in missing.stderr


def test_answer_only_import_writes_tasks_and_says_there_is_nothing_to_check(tmp_path):
    out = tmp_path / "gsm8k-tasks.jsonl"
    result = cli("tasks", "import", "gsm8k", FIXTURES["gsm8k"], "--out", out)
    assert result.returncode == 0, result.stderr
    assert "9 task(s) imported as gsm8k" in result.stdout and "nothing to check" in result.stdout, result.stdout
    validated = cli("tasks", "validate", out)
    assert validated.returncode == 0 and "9 task(s) valid" in validated.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git compares the patch applier with git apply")
def test_patch_applier_agrees_with_git_apply(tmp_path):
    (row,) = rows(FIXTURES["swe"])
    snapshot = DATA / "swe" / "repos" / row["instance_id"]
    work = tmp_path / "repo"
    shutil.copytree(snapshot, work)
    files = {p.relative_to(work).as_posix(): p.read_text() for p in work.rglob("*") if p.is_file()}
    for patch in (row["test_patch"], row["patch"]):
        files, _, _ = apply_patch(files, patch)
        subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=work, check=True)
    assert files == {p.relative_to(work).as_posix(): p.read_text() for p in work.rglob("*") if p.is_file()}
