"""The one exception tree: its drawing in ``factory.errors`` is the truth, and the CLI maps it to exit codes."""

from __future__ import annotations

import inspect
import re

import click
import pytest
from click.testing import CliRunner

import factory
from factory import errors
from factory.cli._lazy import LazyGroup
from factory.errors import FactoryError, TaskFileError, TaskProblem


def drawn_tree() -> dict[str, tuple[str | None, int]]:
    """Class name -> (parent drawn above it, exit code drawn beside it), read from the module docstring."""
    tree: dict[str, tuple[str | None, int]] = {}
    parents: list[tuple[int, str]] = []  # (indent, name), innermost last
    for line in errors.__doc__.splitlines():
        match = re.match(r"^(\s*)(?:[│ ]*[├└]── )?(\w+Error)\s+exit (\d)", line)
        if not match:
            continue
        depth = len(line) - len(line.lstrip(" │├└─"))
        while parents and parents[-1][0] >= depth:
            parents.pop()
        tree[match.group(2)] = (parents[-1][1] if parents else None, int(match.group(3)))
        parents.append((depth, match.group(2)))
    return tree


def error_classes() -> dict[str, type[FactoryError]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, FactoryError)}


def test_the_drawing_lists_every_error_class():
    assert set(drawn_tree()) == set(error_classes())


def test_each_class_has_the_parent_and_exit_code_drawn():
    classes = error_classes()
    for name, (parent, exit_code) in drawn_tree().items():
        cls = classes[name]
        assert cls.exit_code == exit_code, f"{name}: drawn exit {exit_code}, class says {cls.exit_code}"
        if parent is None:
            assert cls is FactoryError
        else:
            assert cls.__bases__ == (classes[parent],), f"{name} is drawn under {parent}"


def test_the_root_error_is_reexported_at_the_top():
    assert factory.FactoryError is errors.FactoryError


def test_only_the_retryable_model_errors_say_so():
    retryable = {name for name, cls in error_classes().items()
                 if issubclass(cls, errors.ModelError) and cls.retryable}
    # a cut-off body is a transient fault like a 5xx; giving up after the retries is final
    assert retryable == {"RateLimitError", "ProviderServerError", "ProviderTimeoutError", "ProviderConnectionError",
                         "MalformedResponseError"}
    assert not errors.ProviderExhaustedError.retryable
    assert not errors.ProviderUnavailableError.retryable  # the provider is gone: the run stops instead
    assert errors.RateLimitError("x", retry_after=2.5).retry_after == 2.5
    assert errors.ModelError("x").retry_after is None


def test_a_task_file_error_lists_every_problem():
    problems = [TaskProblem("t.jsonl", 3, "prompt", "required field is missing"),
                TaskProblem("t.jsonl", None, None, "no tasks in file")]
    error = TaskFileError(problems)
    assert error.problems == problems and error.exit_code == 2
    assert str(error).splitlines() == [
        "2 problems in task file", "t.jsonl:3: field 'prompt': required field is missing", "t.jsonl: no tasks in file"]
    assert str(TaskFileError(problems[:1])).startswith("1 problem in task file\n")


# ------------------------------------------------------------------ the CLI's side


@click.command()
@click.argument("kind")
def fail(kind: str) -> None:
    """Raise the error named KIND."""
    if kind == "bug":
        raise RuntimeError("a bug, not a user error")
    raise getattr(errors, kind)("what went wrong")


@click.command()
def hello() -> None:
    """Say hello."""
    click.echo("hello")


NOT_A_COMMAND = "plain value"


def group(**extra: str) -> click.Group:
    return LazyGroup("app", lazy_subcommands={"fail": f"{__name__}:fail", "hello": f"{__name__}:hello", **extra})


@pytest.mark.parametrize(("kind", "code"), [
    ("FactoryError", 1), ("ConfigError", 2), ("StoreLockedError", 3), ("QueryError", 2), ("ModelConfigError", 2),
    ("MigrationError", 1), ("SandboxPathError", 1),
])
def test_a_factory_error_is_one_line_on_stderr_and_its_exit_code(kind, code):
    result = CliRunner().invoke(group(), ["fail", kind])
    assert result.exit_code == code
    assert result.output == "error: what went wrong\n"  # stderr: click mixes it into output


def test_an_error_outside_the_tree_is_a_bug_and_propagates():
    result = CliRunner().invoke(group(), ["fail", "bug"])
    assert isinstance(result.exception, RuntimeError) and result.exit_code == 1


def test_lazy_commands_are_listed_and_loaded_on_use():
    cli = group()
    assert CliRunner().invoke(cli, ["hello"]).output == "hello\n"
    listing = CliRunner().invoke(cli, ["--help"]).output
    assert "hello  Say hello." in listing and "fail   Raise the error named KIND." in listing


def test_a_lazy_entry_that_is_not_a_command_is_refused():
    cli = group(broken=f"{__name__}:NOT_A_COMMAND")
    with pytest.raises(TypeError, match="NOT_A_COMMAND is not a click command"):
        cli.get_command(click.Context(cli), "broken")
