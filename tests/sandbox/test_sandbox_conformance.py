"""One conformance suite that every sandbox backend runs.

The checks ship in the package (``factory.sandbox.CHECKS``, run by
:func:`factory.sandbox.self_check`) so that a user's own backend can run them
without pytest; here every check runs for every registered backend. A check
of a guarantee the backend does not claim is skipped with that reason (``none``
says plainly that it has no network or filesystem isolation), and a backend
that cannot run on this machine (docker without an engine) is skipped with why.
"""

from __future__ import annotations

import asyncio

import pytest

from factory.sandbox import (
    CHECKS,
    CONFORMANCE_SPEC,
    SANDBOXES,
    CheckResult,
    ConformanceCheck,
    Guarantee,
    NoSandbox,
    NoSandboxWarning,
    create_sandbox,
    docker_image_status,
    expect,
    self_check,
)

DOCKER_OK, DOCKER_WHY = docker_image_status()  # an engine and its image: neither alone starts a sandbox
#: Why a registered backend cannot run on this machine (absent: it can).
UNAVAILABLE = {} if DOCKER_OK else {"docker": DOCKER_WHY or "no engine"}
BACKENDS = [
    pytest.param(name, id=name, marks=pytest.mark.skipif(name in UNAVAILABLE, reason=UNAVAILABLE.get(name, "")))
    for name in SANDBOXES.names()
]
SPEC = CONFORMANCE_SPEC


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_passes_check(backend, check):
    reason = check.skip_reason(backend)
    if reason is not None:
        pytest.skip(reason)
    run(check.run(backend))


def test_the_suite_covers_every_guarantee():
    claimed = {check.requires for check in CHECKS}
    assert set(Guarantee) <= claimed, set(Guarantee) - claimed


def test_self_check_reports_passed_failed_and_skipped_without_stopping():
    async def passes(factory):
        async with factory(SPEC) as sb:
            expect((await sb.exec("echo ok")).stdout == "ok\n", "echo failed")

    async def fails(factory):
        expect(False, "deliberately failed")

    async def crashes(factory):
        raise RuntimeError("backend bug")

    checks = [ConformanceCheck("passes", passes), ConformanceCheck("fails", fails),
              ConformanceCheck("crashes", crashes), ConformanceCheck("skipped", passes, Guarantee.NETWORK)]
    results = run(self_check(NoSandbox, checks))
    assert results == [
        CheckResult("passes", "passed"),
        CheckResult("fails", "failed", "deliberately failed"),
        CheckResult("crashes", "failed", "RuntimeError: backend bug"),
        CheckResult("skipped", "skipped", "'none' does not guarantee no-network"),
    ]
    assert [result.passed for result in results] == [True, False, False, False]


def test_none_backend_warns_and_says_what_it_lacks():
    with pytest.warns(NoSandboxWarning, match="WITHOUT isolation"):
        async def body():
            async with create_sandbox("none", SPEC) as sb:
                return (await sb.exec("echo hi")).stdout
        assert run(body()) == "hi\n"
    none = type(create_sandbox("none", SPEC))
    assert Guarantee.NETWORK not in none.guarantees and Guarantee.FILESYSTEM not in none.guarantees


def test_missing_bubblewrap_names_the_install_command(monkeypatch):
    from factory.errors import SandboxUnavailableError

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        run(create_sandbox("bwrap", SPEC).start())
