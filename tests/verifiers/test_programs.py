"""Programs, files and process pools across the boundary, on real sandboxes.

A test that runs a solution file as a program runs it in the solution
sandbox through a proxy (argv, stdin, stdout, stderr, exit status, env, cwd
relayed); the tests' temporary folders are one scratch area at the same path
in both sandboxes, and a link planted there cannot hand a test a file of the
trusted side; data files shipped with the visible tests are the solution's to
read; process pools work in the sandbox.
"""

from __future__ import annotations

import asyncio
import shutil
import textwrap

import pytest

from factory.sandbox import SandboxSpec, create_sandbox, docker_image_status
from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, VerifyContext, run_verifier
from tests import _verify_loop

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
DOCKER_OK, DOCKER_WHY = docker_image_status()


def verify(task: Task, workspace: dict[str, str]):
    verifier = TestsVerifier(timeout_s=60.0, reference_sandbox="bwrap")
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None, workspace={**task.tests, **workspace})
    return _verify_loop.run(run_verifier(verifier, ctx))


CLI_TESTS = textwrap.dedent("""
    import os
    import signal
    import subprocess
    import sys


    def test_everything_a_program_has_is_relayed(tmp_path):
        (tmp_path / "in.txt").write_text("b a b")
        env = {**os.environ, "GREETING": "hello"}
        result = subprocess.run([sys.executable, os.path.abspath("cli.py"), "in.txt", "--shout"], cwd=tmp_path,
                                input="from stdin", capture_output=True, text=True, env=env)
        assert result.returncode == 3, result
        assert result.stdout.splitlines() == ["argv: in.txt --shout", "b 2", "a 1", "stdin: FROM STDIN",
                                              "env: hello", f"cwd: {tmp_path}"], result
        assert result.stderr == "a warning\\n"
        assert (tmp_path / "out.txt").read_text() == "written by the solution"


    def test_python_dash_m_runs_the_package():
        result = subprocess.run([sys.executable, "-m", "tool", "x"], capture_output=True, text=True)
        assert (result.returncode, result.stdout) == (0, "tool ['x']\\n"), result


    def test_a_signal_is_relayed_as_the_same_signal():
        result = subprocess.run([sys.executable, "cli.py", "--die"], capture_output=True)
        assert result.returncode == -signal.SIGTERM
""")
CLI = textwrap.dedent("""
    import collections
    import os
    import signal
    import sys

    if "--die" in sys.argv:
        os.kill(os.getpid(), signal.SIGTERM)
    print("argv:", " ".join(sys.argv[1:]))
    for word, count in collections.Counter(open(sys.argv[1]).read().split()).most_common():
        print(word, count)
    print("stdin:", sys.stdin.read().upper())
    print("env:", os.environ.get("GREETING"))
    print("cwd:", os.getcwd())
    print("a warning", file=sys.stderr)
    with open("out.txt", "w") as handle:
        handle.write("written by the solution")
    sys.exit(3)
""")


def test_a_solution_program_runs_in_the_solution_sandbox_through_a_proxy():
    task = Task(id="cli", prompt="Write cli.py and the tool package.", files={"cli.py": ""},
                tests={"test_cli.py": CLI_TESTS})
    workspace = {"cli.py": CLI, "tool/__init__.py": "",
                 "tool/__main__.py": "import sys\nprint('tool', sys.argv[1:])\n"}
    verdict = verify(task, workspace)
    assert verdict.status == "pass", verdict.details
    assert verdict.details["passed"] == verdict.details["total"] == 3
    # The proxy relays what the program does, nothing more: a wrong program fails.
    wrong = verify(task, {**workspace, "cli.py": "import sys\nprint('argv:')\nsys.exit(0)\n"})
    assert wrong.status == "fail" and wrong.details["passed"] < wrong.details["total"]


DATA_TESTS = textwrap.dedent("""
    import pathlib

    from records import count_records

    DATA = pathlib.Path(__file__).parent / "data"


    def test_sample():
        assert count_records(str(DATA / "sample.txt")) == 3
""")


def test_code_under_test_may_read_the_data_files_the_tests_hand_it():
    task = Task(id="records", prompt="count_records(path)",
                files={"records.py": "def count_records(p):\n    return 0\n"},
                tests={"tests/test_records.py": DATA_TESTS, "tests/data/sample.txt": "a\n\nb\nc\n"})
    solution = "def count_records(path):\n    return sum(1 for line in open(path) if line.strip())\n"
    for isolation in ("process", "in-process"):
        verdict = verify(task.model_copy(update={"test_isolation": isolation}), {"records.py": solution})
        assert verdict.status == "pass", (isolation, verdict.details)
        assert not verdict.details.get("hacks"), verdict.details


def test_hidden_tests_files_stay_on_the_trusted_side_and_a_link_out_of_the_scratch_area_is_not_followed():
    hidden = textwrap.dedent("""
        import pathlib

        from convert import convert

        EXPECTED = pathlib.Path(__file__).parent / "expected.txt"


        def test_convert(tmp_path):
            out = tmp_path / "out.txt"
            convert("hello", str(out))
            assert out.read_text() == EXPECTED.read_text()
    """)
    task = Task(id="convert", prompt="convert(text, path) writes text upper-cased to path.",
                files={"convert.py": "def convert(text, path):\n    pass\n"},
                hidden_tests={"tests/test_hidden.py": hidden, "tests/expected.txt": "HELLO"})
    honest = "def convert(text, path):\n    open(path, 'w').write(text.upper())\n"
    assert verify(task, {"convert.py": honest}).status == "pass"
    # Not in the solution sandbox: reading the hidden expected file fails there.
    peek = "def convert(text, path):\n    open(path, 'w').write(open('tests/expected.txt').read())\n"
    assert verify(task, {"convert.py": peek}).status == "fail"
    # A link in the shared scratch area to the trusted side's file: the solution sandbox cannot even make one
    # (symlink is refused there: a tool of the trusted side that is not Python would follow it), and the trusted
    # side's guard would not follow it either (tests/verifiers/test_scratch_guard.py).
    link = ("import os\n\n\ndef convert(text, path):\n"
            "    os.symlink(os.path.abspath('tests/expected.txt'), path)\n")
    verdict = verify(task, {"convert.py": link})
    assert verdict.status == "fail", verdict.details
    failures = str(verdict.details.get("failures"))
    assert "PermissionError" in failures or "scratch area" in failures, verdict.details


POOL = textwrap.dedent("""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    def square(x):
        return x * x

    if __name__ == "__main__":
        with multiprocessing.Pool(2) as pool:
            print(pool.map(square, [1, 2, 3]))
        with ProcessPoolExecutor(2) as pool:
            print(list(pool.map(square, [4, 5])))
""")


@pytest.mark.parametrize("backend", ["bwrap", pytest.param("docker", marks=pytest.mark.skipif(
    not DOCKER_OK, reason=DOCKER_WHY))])
def test_process_pools_work_inside_the_sandbox(backend):
    async def run():
        async with create_sandbox(backend, SandboxSpec(files={"pool.py": POOL})) as sandbox:
            return await sandbox.exec(["python", "pool.py"], timeout=60)

    result = asyncio.run(run())
    assert result.exit_code == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == ["[1, 4, 9]", "[16, 25]"]


def test_process_pools_work_in_an_isolated_verification():
    task = Task(id="pool", prompt="squares in a pool", files={"solution.py": ""},
                tests={"test_solution.py": "from solution import squares\n\n\ndef test_squares():\n"
                                           "    assert squares([1, 2, 3]) == [1, 4, 9]\n"})
    solution = ("from concurrent.futures import ProcessPoolExecutor\n\n\ndef _square(x):\n    return x * x\n\n\n"
                "def squares(xs):\n    with ProcessPoolExecutor(2) as pool:\n"
                "        return list(pool.map(_square, xs))\n")
    verdict = verify(task, {"solution.py": solution})
    assert verdict.status == "pass", verdict.details
