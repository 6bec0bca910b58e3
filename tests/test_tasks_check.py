"""``factory tasks check``: each task's reference solution verified isolated and bare, on real bwrap sandboxes.

The check exists to tell a task author, before the first fork, which tasks the
isolation boundary cannot carry: an honest solution that passes bare but fails
isolated would label every correct branch a failure.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from factory.errors import TaskFileError
from factory.store import Store
from factory.tasks import Task, load_tasks
from factory.verifiers import TaskCheck, check_tasks, load_solutions

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

SORT_TESTS = ("from sorting import stable_sort\n\n"
              "def test_by_first():\n"
              "    assert stable_sort([(2, 'a'), (1, 'b'), (2, 'c')], key=lambda p: p[0]) == "
              "[(1, 'b'), (2, 'a'), (2, 'c')]\n\n"
              "def test_plain():\n"
              "    assert stable_sort([3, 1, 2]) == [1, 2, 3]\n")
SORT_STUB = "def stable_sort(items, key=None):\n    raise NotImplementedError\n"
SORT_SOLUTION = "def stable_sort(items, key=None):\n    return sorted(items, key=key)\n"
MONEY_TESTS = ("from money import total\n\n"
               "def test_total_equals():\n    assert total([1, 2]) == 3\n\n"
               "def test_total_cents():\n    assert total([1, 2]).cents == 3\n")
MONEY_SOLUTION = ("class Money:\n    def __init__(self, cents):\n        self.cents = cents\n\n"
                  "    def __eq__(self, other):\n"
                  "        return other == self.cents if isinstance(other, int) else (\n"
                  "            isinstance(other, Money) and other.cents == self.cents)\n\n"
                  "    def __hash__(self):\n        return hash(self.cents)\n\n\n"
                  "def total(items):\n    return Money(sum(items))\n")
ADD_TESTS = ("from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n\n"
             "def test_neg():\n    assert add(-1, 1) == 0\n")
ADD_STUB = "def add(a, b):\n    pass\n"

# An honest solution whose test compares an object of a class the tests never name with the test's own value:
# bare it passes; isolated the solution's own __eq__ would decide against the test's expected value, so the
# boundary refuses it (by design) and the test fails with a BoundaryError.
MONEY = {"id": "money", "prompt": "Write Money and total.", "files": {"money.py": "class Money:\n    pass\n"},
         "tests": {"test_money.py": MONEY_TESTS}, "solution": {"money.py": MONEY_SOLUTION}}
# A key function passed to the solution: it crosses as a handle, so isolated and bare agree.
SORT = {"id": "sort-by-key", "prompt": "Write stable_sort(items, key).", "files": {"sorting.py": SORT_STUB},
        "tests": {"test_sorting.py": SORT_TESTS}, "solution": {"sorting.py": SORT_SOLUTION}}
ADD = {"id": "add", "prompt": "Write add(a, b).", "files": {"solution.py": ADD_STUB},
       "tests": {"test_solution.py": ADD_TESTS}, "solution": {"solution.py": "def add(a, b):\n    return a + b\n"}}
WRONG = {**ADD, "id": "wrong-reference",  # right for add(-1, 1), wrong for add(1, 2)
         "solution": {"solution.py": "def add(a, b):\n    return a + b + (a > 0)\n"}}
NO_SOLUTION = {**ADD, "id": "from-solutions-file", "solution": {}}
ANSWER = {"id": "answer-only", "prompt": "What is 17 + 25?", "answer": "42"}


def write(path, *rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


# ------------------------------------------------------------------ the solution field


def test_a_solution_leaves_old_task_hashes_unchanged_and_is_part_of_its_own():
    plain = Task.model_validate({k: v for k, v in ADD.items() if k != "solution"})
    assert "solution" not in plain.canonical()
    assert Task.model_validate({**ADD, "solution": {}}).task_hash() == plain.task_hash()
    assert Task.model_validate(ADD).task_hash() != plain.task_hash()


def test_a_solution_may_replace_files_but_never_a_test(tmp_path):
    assert Task.model_validate(ADD).solution == {"solution.py": "def add(a, b):\n    return a + b\n"}
    path = write(tmp_path / "t.jsonl", {**ADD, "solution": {"test_solution.py": "def test_add(): pass\n"}},
                 {**ADD, "id": "up", "solution": {"../up.py": ""}})
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    text = str(caught.value)
    assert "t.jsonl:1: paths in both solution and tests: test_solution.py" in text
    assert "t.jsonl:2: field 'solution': file path '../up.py' must be relative" in text


@needs_bwrap
def test_the_reference_solution_never_reaches_the_agent(tmp_path, cli):
    """Not in the prompt, not in the sandbox: the agent reads the stub and lists no extra file."""
    marker = "REFERENCE_ONLY_7f3a"
    task = {**SORT, "solution": {"sorting.py": f"# {marker}\n" + SORT_SOLUTION, "extra_helper.py": f"# {marker}\n"}}
    tasks = write(tmp_path / "tasks.jsonl", task)
    replies = write(tmp_path / "replies.jsonl",
                    {"prompt_contains": "stable_sort", "turn": 0,
                     "response": {"text": "", "tool_calls": [{"name": "run", "arguments": {
                         "command": "ls -aR; cat sorting.py"}}]}},
                    {"prompt_contains": "stable_sort", "turn": 1,
                     "response": {"text": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "done"}}]}})
    db = tmp_path / "run.duckdb"
    result = cli("fork", tasks, "--model", f"replay:{replies}", "--sandbox", "bwrap", "-n", "1", "--db", db,
                 "--run-id", "r1", "--json")
    assert result.exit_code == 0, result.output
    with Store.open(db, read_only=True) as store:
        trajectory = json.dumps(store.branches("r1")["trajectory"].to_list())
    assert "raise NotImplementedError" in trajectory  # the agent did read its workspace
    assert marker not in trajectory and "extra_helper" not in trajectory


# ------------------------------------------------------------------ the check, end to end


@needs_bwrap
def test_tasks_check_finds_the_task_whose_honest_solution_passes_bare_but_fails_isolated(tmp_path, cli):
    tasks = write(tmp_path / "tasks.jsonl", MONEY, SORT, WRONG, NO_SOLUTION, ANSWER)
    solutions = write(tmp_path / "solutions.jsonl",
                      {"id": "from-solutions-file", "files": {"solution.py": "def add(a, b):\n    return b + a\n"}})
    result = cli("tasks", "check", tasks, "--solutions", solutions, "--json")
    assert result.exit_code == 1, result.output  # a task differs: the author must look
    report = json.loads(result.output)
    by_id = {t["task_id"]: t for t in report["tasks"]}
    assert {k: t["kind"] for k, t in by_id.items()} == {
        "money": "differs", "sort-by-key": "same", "wrong-reference": "fails", "from-solutions-file": "same",
        "answer-only": "no_tests"}
    assert report["counts"] == {"same": 2, "differs": 1, "fails": 1, "error": 0, "no_solution": 0, "no_tests": 1}
    money = by_id["money"]
    assert money["line"] == 1 and money["solution_source"] == "task"
    assert (money["isolated"]["status"], money["bare"]["status"]) == ("fail", "pass")
    assert money["bare"]["passed"] == money["bare"]["total"] == 2 and money["isolated"]["passed"] == 1
    # only the test that compares the solution's objects differs, and the report says what could not cross
    assert [(d["test"], d["isolated"], d["bare"]) for d in money["differences"]] == [
        ("test_money.py::test_total_equals", "failed", "passed")]
    assert "comparing it" in money["differences"][0]["why"]
    assert [b["test"] for b in money["isolated"]["boundary"]] == ["test_money.py::test_total_equals"]
    wrong = by_id["wrong-reference"]
    assert wrong["differences"] == [] and wrong["isolated"]["passed"] == wrong["bare"]["passed"] == 1
    assert by_id["from-solutions-file"]["solution_source"] == solutions

    text = cli("tasks", "check", tasks, "--solutions", solutions)
    assert text.exit_code == 1
    lines = text.output.splitlines()
    assert f"{tasks}:1: money  differs: isolated and bare verdicts differ (isolated fail (1/2), " \
           "bare pass (2/2))" in lines, lines
    assert any(line.startswith("    test_money.py::test_total_equals: isolated failed: <solution object Money")
               and line.endswith("; bare passed") for line in lines), lines
    assert f"{tasks}:3: wrong-reference  fails: the reference solution fails either way " \
           "(isolated fail (1/2), bare fail (1/2))" in lines
    assert lines[-1] == f"2 same, 1 differs, 1 fails, 1 no tests; 5 task(s) in {tasks}"


@needs_bwrap
def test_tasks_check_exits_0_when_every_reference_passes_both_ways(tmp_path, cli):
    tasks = write(tmp_path / "tasks.jsonl", ADD, NO_SOLUTION)
    result = cli("tasks", "check", tasks)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"1 same, 1 no solution; 2 task(s) in {tasks}"


@needs_bwrap
def test_check_tasks_library_call_matches_the_verifier_on_each_side():
    tasks = [Task.model_validate(MONEY), Task.model_validate(ADD)]
    checks = asyncio.run(check_tasks(tasks, {"add": {"solution.py": "def add(a, b):\n    return a * b\n"}}, jobs=2))
    assert [type(c) for c in checks] == [TaskCheck, TaskCheck]
    money, add = checks
    assert money.kind == "differs" and money.problem
    assert add.kind == "fails" and add.solution_source == "--solutions"  # the file's solution wins over the field
    assert sorted(add.isolated.failed) == ["test_solution.py::test_add", "test_solution.py::test_neg"]


# ------------------------------------------------------------------ bad input: file, line and field


def test_solutions_file_problems_name_file_line_and_field(tmp_path):
    tasks = [Task.model_validate(ADD), Task.model_validate(SORT)]
    path = write(tmp_path / "solutions.jsonl",
                 '{"id": "add", "files": ',
                 {"id": "nope", "files": {"solution.py": ""}},
                 {"id": "add", "files": {"../escape.py": ""}},
                 {"id": "add", "files": {"test_solution.py": "forged"}},
                 {"id": "add", "files": {"solution.py": 3}},
                 {"id": "add"},
                 {"id": "sort-by-key", "files": {}},
                 {"id": "sort-by-key", "files": {"sorting.py": SORT_SOLUTION}, "colour": "red"},
                 ["not", "an", "object"],
                 {"id": "add", "files": {"solution.py": "ok"}},
                 {"id": "add", "files": {"solution.py": "again"}})
    with pytest.raises(TaskFileError) as caught:
        load_solutions(path, tasks)
    problems = [str(p) for p in caught.value.problems]
    assert problems == [
        f"{path}:1: invalid JSON: Expecting value (column 24)",
        f"{path}:2: field 'id': no task 'nope' in the task file",
        f"{path}:3: field 'files': file path '../escape.py' must be relative and stay inside the workspace",
        f"{path}:4: field 'files': paths in both solution and tests: test_solution.py",
        f"{path}:5: field 'files.solution.py': expected a string",
        f"{path}:6: field 'files': required field is missing",
        f"{path}:7: field 'files': expected an object of at least one path -> text",
        f"{path}:8: field 'colour': unknown key (allowed: id, files)",
        f"{path}:9: expected an object with id and files",
        f"{path}:11: field 'id': duplicate id 'add' (first on line 10)",
    ]


def test_tasks_check_without_any_reference_solution_is_a_clean_error(tmp_path, cli):
    tasks = write(tmp_path / "tasks.jsonl", NO_SOLUTION)
    result = cli("tasks", "check", tasks)
    assert result.exit_code == 2
    assert "no task in" in result.output and "--solutions FILE" in result.output


def test_tasks_check_refuses_an_unknown_sandbox_before_running_anything(tmp_path, cli):
    tasks = write(tmp_path / "tasks.jsonl", ADD)
    result = cli("tasks", "check", tasks, "--sandbox", "nosuch")
    assert result.exit_code == 2
    assert "nosuch" in result.output
