"""The isolated ``tests`` verifier on real bwrap sandboxes: honest solutions pass, forgeries do not.

Each case is a task plus the final workspace an agent left; the verifier
runs the task's tests in a trusted sandbox against the solution served from
a second sandbox (see ``factory/verifiers/_isolation.py``).
"""

from __future__ import annotations

import asyncio
import shutil
import textwrap

import pytest

from factory.sandbox import SandboxLimits
from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, VerifyContext, run_verifier
from factory.verifiers._isolation import module_names, solution_files
from tests import _verify_loop

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

STACK_TESTS = textwrap.dedent("""
    import pytest
    from stack import Stack, EmptyStack

    def test_push_pop():
        s = Stack()
        s.push(1)
        s.push("two")
        assert len(s) == 2
        assert s.pop() == "two"
        assert s.peek() == 1

    def test_empty_raises():
        with pytest.raises(EmptyStack):
            Stack().pop()

    def test_isinstance():
        assert isinstance(Stack(), Stack)

    def test_items_are_plain():
        s = Stack()
        for i in range(3):
            s.push(i)
        assert list(s) == [2, 1, 0]
""")

STACK = textwrap.dedent("""
    class EmptyStack(LookupError):
        pass

    class Stack:
        def __init__(self):
            self._items = []

        def push(self, item):
            self._items.append(item)

        def pop(self):
            if not self._items:
                raise EmptyStack("empty")
            return self._items.pop()

        def peek(self):
            return self._items[-1]

        def __len__(self):
            return len(self._items)

        def __iter__(self):
            return iter(reversed(self._items))
""")

ADD_TESTS = textwrap.dedent("""
    import math
    import pytest
    from solution import add

    @pytest.mark.parametrize("a,b,expected", [(1, 2, 3), (2, 2, 4), (-5, 5, 0)])
    def test_add(a, b, expected):
        assert add(a, b) == expected

    def test_floats():
        assert add(0.1, 0.2) == pytest.approx(0.3)
        assert math.isclose(add(1.5, 1.5), 3.0)
""")
ADD_CORRECT = "def add(a, b):\n    return a + b\n"


def add_task(**extra) -> Task:
    return Task(id="add", prompt="Write add(a, b).", files={"solution.py": "def add(a, b):\n    pass\n"},
                tests={"test_solution.py": ADD_TESTS}, **extra)


def verify(task: Task, workspace: dict[str, str], timeout_s: float = 60.0):
    verifier = TestsVerifier(timeout_s=timeout_s, reference_sandbox="bwrap",
                             limits=SandboxLimits(timeout_s=timeout_s))
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None, workspace={**task.tests, **workspace})
    return _verify_loop.run(run_verifier(verifier, ctx))


def test_honest_function_solution_passes_in_process_isolation():
    verdict = verify(add_task(), {"solution.py": ADD_CORRECT})
    assert verdict.status == "pass", verdict.details
    assert verdict.details["isolation"] == "process"
    assert verdict.details["passed"] == verdict.details["total"] == 4


def test_wrong_solution_fails_with_counts():
    verdict = verify(add_task(), {"solution.py": "def add(a, b):\n    return a * b\n"})
    assert verdict.status == "fail"
    assert 0 < verdict.details["passed"] < verdict.details["total"]


def test_honest_class_solution_with_custom_exception_and_iteration_passes():
    task = Task(id="stack", prompt="Write a stack.", files={}, tests={"test_stack.py": STACK_TESTS})
    verdict = verify(task, {"stack.py": STACK})
    assert verdict.status == "pass", verdict.details


def test_honest_package_with_helper_module_passes():
    task = Task(id="pkg", prompt="p", tests={"test_pkg.py": "from geometry.shapes import area\n"
                                                           "def test_area():\n    assert area(2, 3) == 6\n"})
    files = {"geometry/__init__.py": "", "geometry/shapes.py": "from geometry._mul import mul\n"
             "def area(w, h):\n    return mul(w, h)\n", "geometry/_mul.py": "def mul(a, b):\n    return a * b\n"}
    verdict = verify(task, files)
    assert verdict.status == "pass", verdict.details


def test_honest_unittest_testcase_passes():
    tests = ("import unittest\nfrom solution import add\n\n"
             "class AddTest(unittest.TestCase):\n"
             "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
             "    def test_type(self):\n        self.assertIsInstance(add(1, 1), int)\n")
    task = Task(id="ut", prompt="p", files={"solution.py": ""}, tests={"test_ut.py": tests})
    verdict = verify(task, {"solution.py": ADD_CORRECT})
    assert verdict.status == "pass", verdict.details


def test_task_without_starter_file_passes_when_solved_and_fails_when_not():
    task = Task(id="new-module", prompt="Create solution.py with add.", tests={"test_solution.py": ADD_TESTS})
    assert verify(task, {"solution.py": ADD_CORRECT}).status == "pass"
    assert verify(task, {}).status == "fail"
    assert verify(task, {"solution.py": "def add(a, b):\n    return 0\n"}).status == "fail"


EQ_ALWAYS = textwrap.dedent("""
    class Anything(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

    def add(a, b):
        return Anything(-1000)
""")
#: The same forged __eq__ on a class of its own (not a builtin value): its comparison is refused, with the reason.
EQ_ALWAYS_OPAQUE = textwrap.dedent("""
    class Anything:
        def __eq__(self, other):
            return True
        __hash__ = object.__hash__

    def add(a, b):
        return Anything()
""")
MOCK_ANY = "from unittest.mock import ANY\n\ndef add(a, b):\n    return ANY\n"
PATCH_APPROX = textwrap.dedent("""
    import math, pytest
    pytest.approx = lambda *a, **k: True
    math.isclose = lambda *a, **k: True
    def add(a, b):
        return None
""")
FRAME_PEEK = textwrap.dedent("""
    import gc, sys
    def add(a, b):
        frame = sys._getframe(1)
        while frame is not None:
            if "expected" in frame.f_locals:
                return frame.f_locals["expected"]
            frame = frame.f_back
        for obj in gc.get_objects():
            if type(obj).__name__ == "CallSpec2":
                return obj.params.get("expected")
        return None
""")
EXIT_AT_IMPORT = "import os\nos._exit(0)\n"
SKIP_FROM_SOLUTION = "import pytest\n\ndef add(a, b):\n    pytest.skip('nothing to see')\n"
SYS_EXIT = "import sys\n\ndef add(a, b):\n    sys.exit(0)\n"
PLANTED_HOOKS = {
    "solution.py": "def add(a, b):\n    return None\n",
    "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                   "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n",
    "sitecustomize.py": "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n",
    "evil.pth": "import os; os._exit(0)\n",
}
SHADOW_STDLIB = {"solution.py": "def add(a, b):\n    return None\n",
                 "math.py": "def isclose(*a, **k):\n    return True\n",
                 "pytest.py": "def approx(x):\n    return x\n"}


@pytest.mark.parametrize(("case", "workspace"), [
    ("eq-always-true", {"solution.py": EQ_ALWAYS}),
    ("eq-always-true-opaque", {"solution.py": EQ_ALWAYS_OPAQUE}),
    ("mock-any", {"solution.py": MOCK_ANY}),
    ("patch-approx-isclose", {"solution.py": PATCH_APPROX}),
    ("frame-and-gc-peek", {"solution.py": FRAME_PEEK}),
    ("os-exit-at-import", {"solution.py": EXIT_AT_IMPORT}),
    ("skip-from-solution", {"solution.py": SKIP_FROM_SOLUTION}),
    ("sys-exit", {"solution.py": SYS_EXIT}),
    ("planted-hooks", PLANTED_HOOKS),
    ("shadow-stdlib", SHADOW_STDLIB),
])
def test_forgeries_never_pass(case, workspace):
    verdict = verify(add_task(), workspace)
    assert verdict.status != "pass", (case, verdict.details)
    assert verdict.details.get("passed", 0) == 0, (case, verdict.details)


def test_comparing_a_solution_object_fails_with_a_reason():
    verdict = verify(add_task(), {"solution.py": EQ_ALWAYS_OPAQUE})
    assert "comparing it" in str(verdict.details["failures"]), verdict.details


def test_a_hung_call_fails_that_test_and_the_others_still_report():
    tests = ("from solution import add, spin\n\ndef test_spin():\n    spin()\n\n"
             "def test_add():\n    assert add(1, 1) == 2\n")
    task = Task(id="hang", prompt="p", files={"solution.py": ""}, tests={"test_hang.py": tests})
    solution = ADD_CORRECT + "\ndef spin():\n    while True:\n        pass\n"
    verdict = verify(task, {"solution.py": solution}, timeout_s=8.0)
    assert verdict.status == "fail"
    assert verdict.details["total"] == 2 and verdict.details["passed"] <= 1
    assert "did not answer" in (verdict.details.get("solution_error") or ""), verdict.details


def test_hidden_tests_join_at_verification():
    hidden = "from solution import add\n\ndef test_hidden():\n    assert add(10, 20) == 30\n"
    task = add_task(hidden_tests={"test_hidden.py": hidden})
    fitted = ("def add(a, b):\n    return {(1, 2): 3, (2, 2): 4, (-5, 5): 0, (1.5, 1.5): 3.0}.get((a, b), "
              "0.30000000000000004)\n")
    assert verify(task, {"solution.py": fitted}).status == "fail"
    verdict = verify(task, {"solution.py": ADD_CORRECT})
    assert verdict.status == "pass" and verdict.details["total"] == 5, verdict.details


def test_in_process_mode_is_explicit_and_says_so():
    verdict = verify(add_task(test_isolation="in-process"), {"solution.py": ADD_CORRECT})
    assert verdict.status == "pass", verdict.details
    assert verdict.details["isolation"] == "in-process"


def test_solution_files_strip_tests_and_interpreter_hooks():
    task = add_task(hidden_tests={"hidden/test_h.py": "x"})
    files = solution_files(task, {"solution.py": "s", "test_solution.py": "forged", "hidden/test_h.py": "forged",
                                  "__pycache__/solution.cpython-311.pyc": b"\x00", "a.pth": "import os",
                                  "sitecustomize.py": "", "pkg/conftest.py": "", "data.txt": "d"})
    assert set(files) == {"solution.py", "data.txt"}


def test_module_names_never_shadow_the_trusted_side():
    names = module_names({"solution.py": "", "json.py": "", "tests_helper.py": "", "pkg/a.py": "", "src/lib.py": "",
                          "notes.txt": "", "bad-name.py": ""},
                         {"tests_helper.py": "", "test_x.py": ""})
    assert names == ["lib", "pkg", "solution"]


def test_a_server_that_ends_before_it_listens_is_an_infrastructure_error_at_once(tmp_path):
    """The trusted side may wait for the socket as long as the run lasts; a dead server is said at once."""
    from factory.errors import SandboxError
    from factory.sandbox import SandboxSpec, create_sandbox
    from factory.verifiers._isolation import await_trusted

    async def body():
        async with create_sandbox("bwrap", SandboxSpec()) as one, create_sandbox("bwrap", SandboxSpec()) as other:
            trusted = asyncio.ensure_future(one.exec("sleep 60", timeout=90))
            server = asyncio.ensure_future(other.exec("echo 'no module named x' >&2; exit 1", timeout=90))
            with pytest.raises(SandboxError, match="ended before it listened: exit 1: no module named x"):
                await await_trusted(trusted, server, str(tmp_path / "never.sock"))
            assert trusted.cancelled()  # never waited for: the dead server was noticed when it ended
            # A server that listened and ended later (agent code may end it) leaves the trusted side to report.
            (tmp_path / "listened.sock").write_text("")
            done = asyncio.ensure_future(one.exec("sleep 1; echo report", timeout=90))
            ended = asyncio.ensure_future(other.exec("exit 0", timeout=90))
            return (await await_trusted(done, ended, str(tmp_path / "listened.sock"))).stdout

    assert asyncio.run(body()) == "report\n"
