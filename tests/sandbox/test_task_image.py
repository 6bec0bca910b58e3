"""A task's ``image`` reaches every sandbox built for it: the agent's, verification's, both isolated-test sides.

The sandboxes are a registered backend of our own (the ``none`` backend that
also keeps the specs it was built from), so the real fork, pipeline and
tests verifier paths run unchanged.
"""

from __future__ import annotations

import asyncio

import pytest

from factory.models import create_model
from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.sandbox import SANDBOXES, NoSandbox, SandboxSpec, files_spec, register_sandbox, workspace_spec
from factory.store import Store, WorkspaceSnapshot
from factory.tasks import Task
from factory.verifiers import TestsVerifier, VerificationPipeline
from tests.rollouts.conftest import FIX_FACTORIAL
from tests.rollouts.test_agent import FACTORIAL

pytestmark = pytest.mark.filterwarnings("ignore::factory.sandbox.NoSandboxWarning")

IMAGE = "registry.example:5000/team/factory-sandbox:py3.11"


@pytest.fixture
def recorded(monkeypatch) -> list[SandboxSpec]:
    """Register ``recording`` (gone after the test) and return the specs it is built from, in order."""
    monkeypatch.setattr(SANDBOXES, "_entries", dict(SANDBOXES._entries))
    specs: list[SandboxSpec] = []

    @register_sandbox("recording")
    class Recording(NoSandbox):
        """The ``none`` backend, keeping every spec it is given."""

        def __init__(self, spec: SandboxSpec):
            super().__init__(spec)
            specs.append(spec)

    return specs


def test_files_and_workspace_specs_carry_the_task_image():
    task = FACTORIAL.model_copy(update={"image": IMAGE})
    final = {"solution.py": "def factorial(n):\n    return 1\n"}
    assert files_spec(task, final).image == IMAGE
    assert workspace_spec(task, WorkspaceSnapshot(files=final)).image == IMAGE
    assert workspace_spec(task, None).image == IMAGE
    # without one, the backend's default
    assert files_spec(FACTORIAL, final).image is None and workspace_spec(FACTORIAL, None).image is None


@pytest.mark.parametrize("isolation", ["process", "in-process"])
def test_every_sandbox_of_a_fork_starts_from_the_task_image(tmp_path, replay_file, recorded, isolation):
    task = FACTORIAL.model_copy(update={"image": IMAGE, "test_isolation": isolation})
    model = create_model(f"replay:{replay_file(FIX_FACTORIAL)}")
    pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox="recording")})
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, ForkConfig(branches=1, sandbox="recording"), run_id="r1",
                                   pipeline=pipeline)

        async def go():
            return [result async for result in runner.run([task])]

        (result,) = asyncio.run(go())
        verdicts = store.verdicts("r1").to_dicts()
    assert result.status == "ok"
    assert [(v["verifier"], v["status"]) for v in verdicts] == [("tests", "pass")]
    # the agent's sandbox, then verification's: solution and trusted sides (and, made but never started, the probe
    # that says where the shared folder appears inside them), or a fresh one and the reference run
    made = 4 if isolation == "process" else 3
    assert len(recorded) == made
    assert [spec.image for spec in recorded] == [IMAGE] * made
    assert "solution.py" in recorded[0].files and "test_solution.py" in recorded[0].readonly_files


def test_a_task_without_an_image_leaves_the_choice_to_the_backend(tmp_path, replay_file, recorded):
    model = create_model(f"replay:{replay_file(FIX_FACTORIAL)}")
    pipeline = VerificationPipeline({"tests": TestsVerifier(reference_sandbox="recording")})
    with Store.open(tmp_path / "run.duckdb") as store:
        runner = RolloutForkRunner(model, store, ForkConfig(branches=1, sandbox="recording"), run_id="r1",
                                   pipeline=pipeline)

        async def go():
            return [result async for result in runner.run([FACTORIAL])]

        asyncio.run(go())
    assert recorded and all(spec.image is None for spec in recorded)


def test_image_is_a_task_field_like_the_others():
    task = Task(id="t", prompt="p", image="python:3.12-slim")
    assert task.image == "python:3.12-slim" and Task(id="t", prompt="p").image is None
