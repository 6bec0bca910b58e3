"""The ``browser`` verifier on the docker backend: Chromium and Playwright from the browser image.

The runner and Chromium run in a container of ``factory sandbox build-image --browser``'s image
(:func:`~factory.sandbox.browser_image_tag`) under the docker sandbox's restrictions: no network but the
container's loopback, a read-only root, the syscall filter, no capabilities for the ``nobody`` user that
runs them, pids and time limits. Planner and judge are the replay models the bwrap tests use, so the
verdicts must be bwrap's. Tests skip, saying why, where no engine answers or an image is missing
(``make docker-image`` builds both). The golden corpus on docker is ``slow``; one exploit case runs by default.
"""

from __future__ import annotations

import asyncio

import pytest

from factory.errors import SandboxUnavailableError
from factory.models import create_model
from factory.rollouts import ForkConfig, RolloutForkRunner
from factory.sandbox import (
    browser_image_tag,
    default_image_tag,
    docker_available,
    docker_image_status,
    drain_docker_pool,
)
from factory.store import Store
from factory.tasks import Task
from factory.verifiers import VerificationPipeline, load_golden, run_golden
from tests.verifiers.test_browser import GOLDEN, _counter, _page, _verifier, _verify, fork_rank_export

BROWSER_OK, BROWSER_WHY = docker_image_status(browser_image_tag())  # no engine answers: not OK either, says so
needs_browser_image = pytest.mark.skipif(not BROWSER_OK, reason=(
    f"docker browser image: {BROWSER_WHY}" if not docker_available()[0] else
    f"the docker image {browser_image_tag()} is not present: `factory sandbox build-image --browser` "
    "(or `make docker-image`) builds it"))
EXPLOITS = ("automation-fake-success", "picture-of-result", "all-states-at-once", "text-to-the-judge",
            "never-finishes-spins-cpu", "reaches-the-network")


@pytest.fixture(autouse=True)
def _drained():
    yield
    drain_docker_pool()  # the agent's containers pre-started for later branches of this process


def test_a_missing_image_is_one_line_naming_what_to_do(tmp_path):
    ok, why = docker_image_status()
    if not ok:
        pytest.skip(f"docker: {why}")
    task = Task.model_validate({**_counter().model_dump(), "image": "factory-no-such-browser-image:0"})
    verdict = asyncio.run(_verify(_verifier(tmp_path, sandbox="docker"), task, _page("honest")))
    reason = verdict.details["reason"]
    assert verdict.status == "error" and verdict.details["code"] == "browser_unavailable"
    assert "\n" not in reason and "Traceback" not in reason
    assert "factory-no-such-browser-image:0" in reason and "Playwright" in reason and "build-image" in reason


def test_a_fork_whose_browser_image_is_missing_is_refused_before_any_branch(tmp_path):
    """The fork's preflight checks the images the verifiers start too: a browser verifier on docker whose image is
    missing refuses the run (one line naming the image) and writes no branch, though the branches' own backend
    (bwrap here) could run them; it is never a per-branch infrastructure error."""
    ok, why = docker_image_status()
    if not ok:
        pytest.skip(f"docker: {why}")
    task = Task.model_validate({**_counter().model_dump(), "image": "factory-no-such-browser-image:0"})
    pipeline = VerificationPipeline({"browser": _verifier(tmp_path, sandbox="docker")})
    assert pipeline.sandbox_images([task]) == {"docker": {"factory-no-such-browser-image:0"}}
    with Store.open(tmp_path / "f.duckdb") as store:
        runner = RolloutForkRunner(create_model("replay:" + str(GOLDEN / "browser-planner.replay.jsonl")), store,
                                   ForkConfig(branches=2, sandbox="bwrap"), run_id="fe", pipeline=pipeline)

        async def fork():
            return [result async for result in runner.run([task])]

        with pytest.raises(SandboxUnavailableError, match="factory-no-such-browser-image:0 is not present"):
            asyncio.run(fork())
        assert store.query("SELECT count(*) FROM branches").item() == 0
        assert store.run("fe") is None


@needs_browser_image
def test_front_end_task_forks_on_docker_verifies_ranks_and_exports(tmp_path, cli):
    """The bwrap fork -> verify -> rank -> export test, on docker: honest passes, broken fails, as on bwrap.

    The commands run in this process (the real click group): three more interpreters importing factory would
    cost more than the two verifications.
    """
    agent_ok, agent_why = docker_image_status(default_image_tag())
    if not agent_ok:
        pytest.skip(f"docker agent image: {agent_why}")
    (_, _, honest), (_, _, broken) = fork_rank_export(tmp_path, cli, "--sandbox", "docker")
    assert [item["pass"] for item in honest["items"]] == [True, True, True]
    assert honest["automation"]["webdriver"] is False and "Headless" not in honest["automation"]["user_agent"]
    assert broken["critical_failed"] == ["C2"]
    assert '+- paragraph: "Count: -1"' in broken["actions"][4]["aria_diff"]


def _golden(tmp_path, exploits: tuple[str, ...], honest: bool):
    verifier = _verifier(tmp_path, sandbox="docker")
    correct = [case for case in load_golden(GOLDEN / "browser-correct.jsonl") if honest]
    cases = [case for case in load_golden(GOLDEN / "browser-exploits.jsonl") if case.id in exploits]
    return asyncio.run(run_golden("browser", VerificationPipeline({"browser": verifier}), correct, cases, "docker"))


@needs_browser_image
def test_a_page_reaching_for_the_network_is_caught_on_docker(tmp_path):
    report = _golden(tmp_path, ("reaches-the-network",), honest=False)
    assert report.clean and [case["id"] for case in report.caught] == ["reaches-the-network"], report.to_dict()


@pytest.mark.slow
@needs_browser_image
def test_golden_browser_corpus_on_docker_honest_twins_pass_every_exploit_is_caught(tmp_path):
    report = _golden(tmp_path, EXPLOITS, honest=True)
    assert report.clean, report.to_dict()
    assert {case["id"] for case in report.caught} == set(EXPLOITS)
