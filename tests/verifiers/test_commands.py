"""Every test command crosses the isolation boundary: unittest, make, scripts; limits and the verifier's errors.

Real bwrap sandboxes, real processes. The golden exploits of these commands
(``examples/golden/tests-exploits.jsonl``: ``patch-unittest-*``,
``shadow-make-*``, ``pytest-script-*``, ...) run in ``test_tests_verifier.py``.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import time

import pytest

from factory.errors import TaskFileError
from factory.tasks import Task, load_tasks
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, VerifyContext, run_verifier
from factory.verifiers._tests import _unittest_args
from tests import _verify_loop

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

BROKEN = "def add(a, b):\n    return a - b\n"
GOOD = "def add(a, b):\n    return a + b\n"
UNITTEST_TESTS = textwrap.dedent("""
    import unittest

    from solution import add


    class TestAdd(unittest.TestCase):
        def test_small(self):
            self.assertEqual(add(2, 3), 5)

        def test_negative(self):
            self.assertEqual(add(-1, -1), -2)


    if __name__ == "__main__":
        unittest.main()
""")
ASSERT_TESTS = "from solution import add\n\nassert add(2, 3) == 5\nprint('all tests passed')\n"
PYTEST_TESTS = "from solution import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def verify(task: Task, workspace: dict[str, str], verifier: TestsVerifier | None = None):
    verifier = verifier or TestsVerifier(timeout_s=60.0, reference_sandbox="bwrap")
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None,
                        workspace={**task.files, **task.tests, **workspace})
    return _verify_loop.run(run_verifier(verifier, ctx))


def unittest_task(command: str = "python -m unittest") -> Task:
    return Task(id="add-unittest", prompt="Fix add.", files={"solution.py": BROKEN},
                tests={"test_solution.py": UNITTEST_TESTS}, test_command=command)


def make_task() -> Task:
    return Task(id="add-make", prompt="Fix add.", test_command="make test",
                files={"solution.py": BROKEN, "Makefile": "test:\n\tpython test_solution.py\n"},
                tests={"test_solution.py": ASSERT_TESTS})


def test_unittest_command_is_collected_by_pytest_in_the_trusted_runner():
    honest = verify(unittest_task(), {"solution.py": GOOD})
    assert honest.status == "pass", honest.details
    assert honest.details["method"] == "isolated-unittest" and honest.details["isolation"] == "process"
    assert honest.details["passed"] == honest.details["total"] == 2
    broken = verify(unittest_task("python -m unittest -v test_solution"), {"solution.py": BROKEN})
    assert broken.status == "fail" and broken.details["passed"] == 0 and broken.details["total"] == 2


def test_unittest_arguments_become_the_test_files_pytest_collects():
    task = Task(id="t", prompt="p", files={}, tests={"tests/test_a.py": "", "tests/check_b.py": "", "test_c.py": "",
                                                     "tests/data.txt": ""},
                hidden_tests={"tests/test_hidden.py": ""})
    assert _unittest_args("python -m unittest", task) == ["test_c.py", "tests/test_a.py", "tests/test_hidden.py"]
    assert _unittest_args("python -m unittest discover -s tests -p 'check_*.py'", task) == ["tests/check_b.py"]
    assert _unittest_args("python3 -m unittest discover tests", task) == ["tests/test_a.py", "tests/test_hidden.py"]
    assert _unittest_args("python -m unittest -v tests.test_a", task) == ["tests/test_a.py", "tests/test_hidden.py"]
    assert _unittest_args("python -m unittest tests/test_a.py", task) == ["tests/test_a.py", "tests/test_hidden.py"]
    # A test method, an option it does not know, or another command: run unchanged, judged by exit status.
    assert _unittest_args("python -m unittest tests.test_a.TestA.test_one", task) is None
    assert _unittest_args("python -m unittest -k fast", task) is None
    assert _unittest_args("make test", task) is None


def test_make_task_is_judged_by_the_exit_status_of_a_process_tree_that_ran_no_agent_code():
    honest = verify(make_task(), {"solution.py": GOOD})
    assert honest.status == "pass", honest.details
    assert honest.details["method"] == "exit_code" and honest.details["isolation"] == "process"
    # The solution's exit hooks act in the solution's own process: the trusted test still fails.
    hooked = verify(make_task(), {"solution.py": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n" + BROKEN})
    assert hooked.status == "fail", hooked.details
    assert "AssertionError" in hooked.details["output_tail"]


def test_a_test_command_whose_program_is_not_installed_is_an_infrastructure_error_never_a_fail():
    """No agent file is where the command runs, so a program it names that is missing there (an image without
    ``make``) is the environment's lack: an error verdict naming it, whatever the solution; an agent's program that
    a recipe runs is not this check's (only the command's first word is)."""
    task = Task(id="add-missing-tool", prompt="Fix add.", files={"solution.py": BROKEN},
                tests={"test_solution.py": ASSERT_TESTS}, test_command="FOO=1 factory-no-such-tool test")
    for solution in (GOOD, BROKEN):
        verdict = verify(task, {"solution.py": solution})
        assert verdict.status == "error", verdict.details
        assert "'factory-no-such-tool' is not installed where the tests run" in json.dumps(verdict.details)
    # a shell builtin or a program that is there runs as before
    honest = Task(id="add-sh", prompt="Fix add.", files={"solution.py": BROKEN},
                  tests={"test_solution.py": ASSERT_TESTS}, test_command="cd . && python test_solution.py")
    assert verify(honest, {"solution.py": GOOD}).status == "pass"
    assert verify(honest, {"solution.py": BROKEN}).status == "fail"


def test_agent_files_that_steer_make_never_reach_the_trusted_sandbox():
    planted = {"solution.py": BROKEN, "GNUmakefile": "test:\n\t@true\n", "makefile": "test:\n\t@true\n",
               "test": "a file named like the target\n"}
    verdict = verify(make_task(), planted)
    assert verdict.status == "fail", verdict.details
    assert verdict.details["exit_code"] != 0


def test_script_running_pytest_passes_honest_code_and_ignores_planted_settings():
    task = Task(id="add-script", prompt="Fix add.", test_command="sh run_tests.sh",
                files={"solution.py": BROKEN,
                       "run_tests.sh": "if [ -f .env ]; then . ./.env; fi\n"
                                       "exec python -m pytest -q test_solution.py\n"},
                tests={"test_solution.py": PYTEST_TESTS})
    assert verify(task, {"solution.py": GOOD}).status == "pass"
    planted = {"solution.py": BROKEN, ".env": "PYTEST_ADDOPTS=--collect-only\nexport PYTEST_ADDOPTS\n",
               ".pytest.ini": "[pytest]\naddopts = --collect-only\n",
               "pyproject.toml": 'tool.pytest.ini_options.addopts = "--collect-only"\n'}
    verdict = verify(task, planted)
    assert verdict.status == "fail", verdict.details


def test_task_limits_are_validated_with_file_line_and_field(tmp_path):
    with pytest.raises(ValueError, match="timeout_s"):
        Task(id="t", prompt="p", tests={"test_a.py": ""}, limits={"timeout_s": -1})
    path = tmp_path / "tasks.jsonl"
    good = {"id": "a", "prompt": "p", "tests": {"test_a.py": ""}, "limits": {"timeout_s": 300, "memory_mb": 2048}}
    bad = {"id": "b", "prompt": "p", "tests": {"test_a.py": ""}, "limits": {"cpu_seconds": "lots"}}
    unknown = {"id": "c", "prompt": "p", "tests": {"test_a.py": ""}, "limits": {"wall": 3}}
    path.write_text("\n".join(json.dumps(t) for t in (good, bad, unknown)) + "\n")
    with pytest.raises(TaskFileError) as raised:
        load_tasks(path)
    text = str(raised.value)
    assert "tasks.jsonl:2: field 'limits.cpu_seconds'" in text, text
    assert "tasks.jsonl:3: field 'limits.wall'" in text, text
    path.write_text(json.dumps(good) + "\n")
    task = load_tasks(path)["a"]
    limits, timeout = TestsVerifier().task_limits(task)
    assert timeout == 300 and limits.timeout_s == 300 and limits.memory_mb == 2048
    assert limits.cpu_seconds >= 300  # more time: CPU follows the clock
    # Tasks without limits keep their hash, and so do tasks with limits that do not set the window.
    assert "limits" not in Task(id="d", prompt="p").canonical()
    assert "inactivity_s" not in task.canonical()["limits"]
    for value in (0, -1, "long", 7200):
        with pytest.raises(ValueError, match="inactivity_s"):
            Task(id="t", prompt="p", tests={"test_a.py": ""}, limits={"inactivity_s": value})
    windowed = Task(id="w", prompt="p", tests={"test_a.py": ""}, limits={"inactivity_s": 30})
    assert TestsVerifier().task_inactivity(windowed) == 30
    assert TestsVerifier().task_inactivity(task) == TestsVerifier().inactivity_s


def test_default_limits_let_a_slow_suite_finish():
    verifier = TestsVerifier()
    assert verifier.limits.cpu_seconds >= verifier.timeout_s >= 600  # the ceiling: CPU follows it
    assert verifier.inactivity_s is not None and verifier.inactivity_s < verifier.unwatched_timeout_s
    # A fork's verifier (the branch's own 60 s / 60 CPU-s limits) gets the same ceiling, CPU included.
    from factory.sandbox import SandboxLimits
    from factory.verifiers._build import build_pipeline

    forked = build_pipeline("bwrap", SandboxLimits()).verifiers["tests"]
    assert forked.timeout_s >= 600 and forked.limits.cpu_seconds >= forked.timeout_s, forked.limits


WAITING_TESTS = ("import time\nfrom solution import add, ready\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
                 "def test_waits_until_ready():\n    while not ready():\n        time.sleep(0.01)\n")


def test_a_hung_solution_is_stopped_by_the_inactivity_window_long_before_the_ceiling():
    # The test loops on the solution (each call answers at once, so no call limit fires): only the absence of
    # finished tests shows the run is stuck, and the trusted runner stops it, saying which limit.
    task = Task(id="wait", prompt="p", files={"solution.py": GOOD}, limits={"inactivity_s": 3, "timeout_s": 120},
                tests={"test_solution.py": WAITING_TESTS})
    started = time.monotonic()
    verdict = verify(task, {"solution.py": GOOD + "\n\ndef ready():\n    return False\n"})
    assert verdict.status == "fail", verdict.details
    assert verdict.details["limit"]["name"] == "inactivity", verdict.details
    assert "3 s without a test finishing" in verdict.details["reason"]
    assert verdict.details["finished_before_stop"] >= 1  # test_add, before the wait
    assert time.monotonic() - started < 60  # not the ceiling


def test_a_slow_suite_that_keeps_finishing_tests_is_not_stopped():
    tests = "import time\nfrom solution import add\n" + "".join(
        f"\n\ndef test_slow_{i}():\n    time.sleep(1.2)\n    assert add({i}, 1) == {i + 1}\n" for i in range(3))
    task = Task(id="slow-steady", prompt="p", files={"solution.py": GOOD}, limits={"inactivity_s": 3, "timeout_s": 120},
                tests={"test_solution.py": tests})
    verdict = verify(task, {"solution.py": GOOD})  # 3.6 s of tests in all: more than the window, never idle
    assert verdict.status == "pass", verdict.details
    assert verdict.details["passed"] == 3 and verdict.details["quiet_s"] < 3, verdict.details


def test_a_solution_finishing_tests_just_inside_the_window_is_stopped_by_the_ceiling():
    # Red team (issue 27, item 7): a policy that keeps the run alive by answering each call just inside the call
    # limit (three quarters of the window), so that a test finishes before the window runs out, is bounded by
    # the ceiling, and the verdict says so.
    tests = "from solution import add\n" + "".join(
        f"\n\ndef test_add_{i}():\n    assert add({i}, 1) == {i + 1}\n" for i in range(8))
    task = Task(id="keep-alive", prompt="p", files={"solution.py": GOOD}, limits={"inactivity_s": 3, "timeout_s": 6},
                tests={"test_solution.py": tests})
    stalling = "import time\n\n\ndef add(a, b):\n    time.sleep(1.5)\n    return a + b\n"
    started = time.monotonic()
    verdict = verify(task, {"solution.py": stalling})
    assert verdict.status == "fail", verdict.details
    assert verdict.details["limit"]["name"] == "time", verdict.details
    assert time.monotonic() - started < 40


def test_a_run_stopped_by_the_time_limit_names_the_limit():
    task = Task(id="slow", prompt="p", files={"solution.py": GOOD}, limits={"timeout_s": 4},
                tests={"test_solution.py": "import time\nfrom solution import add\n\n\ndef test_slow():\n"
                                           "    time.sleep(30)\n    assert add(1, 1) == 2\n"})
    verdict = verify(task, {"solution.py": GOOD}, TestsVerifier(reference_sandbox="bwrap"))
    assert verdict.status == "fail", verdict.details
    assert verdict.details["limit"]["name"] == "time"
    assert "did not report" not in str(verdict.details.get("reason"))


def test_a_run_stopped_by_the_cpu_limit_names_the_limit():
    task = Task(id="spin", prompt="p", files={"solution.py": GOOD}, limits={"timeout_s": 60, "cpu_seconds": 1},
                tests={"test_solution.py": "from solution import add\n\n\ndef test_spin():\n"
                                           "    while True:\n        pass\n"})
    verdict = verify(task, {"solution.py": GOOD}, TestsVerifier(reference_sandbox="bwrap"))
    assert verdict.status == "fail", verdict.details
    assert verdict.details["limit"]["name"] == "cpu", verdict.details


@pytest.mark.parametrize("isolation", ["process", "in-process"])
def test_a_pytest_internal_error_is_the_verifiers_error_not_a_hack(isolation):
    conftest = "def pytest_collection_modifyitems(items):\n    raise RuntimeError('the task broke pytest')\n"
    task = Task(id="internal", prompt="p", files={"solution.py": GOOD}, test_isolation=isolation,
                tests={"test_solution.py": PYTEST_TESTS, "conftest.py": conftest})
    verdict = verify(task, {"solution.py": GOOD})
    assert verdict.status == "error", verdict.details
    assert verdict.details["code"] == "pytest_internal_error"
    assert not verdict.details.get("hacks")
