"""The sandbox extension point: a backend of our own is registered by name and checked like the built-ins.

A backend that claims a guarantee it does not keep fails the conformance check
for it, and a check of our own joins the suite.
"""

from __future__ import annotations

import asyncio

import pytest

from factory.errors import ConfigError
from factory.sandbox import (
    CHECKS,
    CONFORMANCE_SPEC,
    SANDBOXES,
    Guarantee,
    NoSandbox,
    Sandbox,
    SandboxFactory,
    conformance_check,
    create_sandbox,
    expect,
    register_sandbox,
    sandbox_names,
    self_check,
)


@pytest.fixture
def registries(monkeypatch):
    """Whatever a test registers (backends, checks) is gone after it."""
    monkeypatch.setattr(SANDBOXES, "_entries", dict(SANDBOXES._entries))
    saved = list(CHECKS)
    yield
    CHECKS[:] = saved


def check_named(name: str):
    return next(check for check in CHECKS if check.name == name)


def test_the_built_in_backends_are_registered():
    assert {"bwrap", "docker", "none"} <= set(sandbox_names()) and sandbox_names() == SANDBOXES.names()


def test_a_registered_backend_is_created_by_name(registries):
    @register_sandbox("scratch")
    class Scratch(NoSandbox):
        """The ``none`` backend under another name."""

    assert Scratch.name == "scratch" and "scratch" in sandbox_names()
    sandbox = create_sandbox("scratch", CONFORMANCE_SPEC)
    assert isinstance(sandbox, Scratch) and isinstance(sandbox, Sandbox) and sandbox.spec is CONFORMANCE_SPEC
    results = asyncio.run(self_check("scratch", [check_named("exit_codes_stdin_and_python_with_pytest")]))
    assert [(r.name, r.status) for r in results] == [("exit_codes_stdin_and_python_with_pytest", "passed")]


def test_a_backend_claiming_isolation_it_lacks_fails_that_check(registries):
    @register_sandbox("boastful")
    class Boastful(NoSandbox):
        """Claims filesystem isolation, but runs commands on the host like ``none``."""

        guarantees = NoSandbox.guarantees | {Guarantee.FILESYSTEM}

    check = check_named("no_writes_outside_workspace_and_tests_read_only")
    assert check.requires is Guarantee.FILESYSTEM
    assert check.skip_reason("none") == "'none' does not guarantee no-writes-outside-workspace"
    assert check.skip_reason("boastful") is None
    (result,) = asyncio.run(self_check("boastful", [check]))
    assert result.status == "failed" and not result.passed and "outside.txt succeeded" in result.detail
    (honest,) = asyncio.run(self_check("none", [check]))
    assert honest.status == "skipped" and honest.detail == check.skip_reason("none")


def test_a_check_of_our_own_joins_the_suite(registries):
    @conformance_check()
    async def echo_round_trips(factory: SandboxFactory) -> None:
        """A command's output comes back."""
        async with factory(CONFORMANCE_SPEC) as sandbox:
            result = await sandbox.exec("echo conformance")
            expect(result.stdout == "conformance\n", f"echo printed {result.stdout!r}")

    @conformance_check(requires=Guarantee.NETWORK)
    async def never_runs_on_none(factory):
        """Skipped for a backend without network isolation."""
        expect(False, "should have been skipped")

    ours = CHECKS[-2:]
    assert [(c.name, c.description, c.requires) for c in ours] == [
        ("echo_round_trips", "A command's output comes back.", None),
        ("never_runs_on_none", "Skipped for a backend without network isolation.", Guarantee.NETWORK)]
    results = asyncio.run(self_check(NoSandbox, ours))  # a factory works as well as a name
    assert [(r.name, r.status) for r in results] == [("echo_round_trips", "passed"), ("never_runs_on_none", "skipped")]


def test_a_failed_expectation_names_what_failed(registries):
    @conformance_check()
    async def always_fails(factory):
        """Fails on purpose."""
        expect(1 + 1 == 3, "arithmetic broke")

    (result,) = asyncio.run(self_check("none", CHECKS[-1:]))
    assert (result.status, result.detail) == ("failed", "arithmetic broke")
    with pytest.raises(AssertionError, match="arithmetic broke"):
        expect(0, "arithmetic broke")


def test_an_unknown_backend_name_is_a_config_error():
    with pytest.raises(ConfigError, match="bwrap"):
        asyncio.run(self_check("no-such-backend"))
