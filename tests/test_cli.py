"""The CLI shell: lazy loading, help text, version, errors, query and runs."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import click
import pytest

from factory import __version__
from factory.cli import COMMANDS, main
from factory.store import Store, utc_now

HEAVY_MODULES = ("torch", "trl", "transformers", "vllm", "ray", "llama_cpp", "anthropic", "openai", "docker",
                 "starlette", "uvicorn", "playwright")


def all_commands() -> list[tuple[str, click.Command]]:
    """Every command and subcommand, loaded through the lazy group."""
    found = []
    ctx = click.Context(main)

    def walk(group: click.Group, prefix: str, ctx: click.Context) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            path = f"{prefix} {name}".strip()
            found.append((path, command))
            if isinstance(command, click.Group):
                walk(command, path, click.Context(command, parent=ctx))

    walk(main, "", ctx)
    return found


def test_help_imports_no_heavy_module():
    code = (
        "import sys\n"
        "from factory.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"for name in {sorted(COMMANDS)!r}:\n"
        "    try:\n        main([name, '--help'])\n    except SystemExit:\n        pass\n"
        f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_every_registered_command_loads():
    names = {path.split()[0] for path, _ in all_commands()}
    assert set(COMMANDS) <= names


@pytest.mark.parametrize(("path", "command"), all_commands(), ids=[p for p, _ in all_commands()])
def test_every_command_has_help_text(path, command):
    assert command.help and command.help.strip(), f"`factory {path}` has no help text"
    assert command.get_short_help_str().strip()
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"option {param.opts} of `factory {path}` has no help text"


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"factory, version {__version__}"


@pytest.fixture
def populated_db(tmp_path):
    path = tmp_path / "q.duckdb"
    with Store.open(path) as store:
        store.write_run({"run_id": "r1", "created_at": utc_now(), "status": "finished", "model": "replay:a",
                         "n_branches": 2})
        store.write_branches(
            [{"run_id": "r1", "task_id": "t1", "branch_index": i, "session_id": f"s{i}",
              "status": "ok" if i else "error"} for i in range(2)],
            [{"run_id": "r1", "task_id": "t1", "branch_index": i, "seq": 0, "ts": utc_now(),
              "kind": "model_call", "payload": {"i": i}} for i in range(2)],
        )
    return path


SQL = "SELECT branch_index, status FROM branches ORDER BY branch_index"


def test_query_table_format(cli, populated_db):
    result = cli("query", SQL, "--db", populated_db)
    assert result.exit_code == 0
    assert "branch_index" in result.output and "error" in result.output
    assert result.output.strip().endswith("(2 rows)")


def test_query_csv_format(cli, populated_db):
    result = cli("query", SQL, "--db", populated_db, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert rows == [{"branch_index": "0", "status": "error"}, {"branch_index": "1", "status": "ok"}]


def test_query_json_format(cli, populated_db):
    result = cli("query", SQL, "--db", populated_db, "--format", "json")
    assert json.loads(result.output) == [{"branch_index": 0, "status": "error"}, {"branch_index": 1, "status": "ok"}]


def test_query_csv_flattens_nested_values(cli, populated_db):
    result = cli("query", "SELECT [1, 2] AS xs, {'a': 1} AS s", "--db", populated_db, "--format", "csv")
    assert list(csv.reader(io.StringIO(result.output))) == [["xs", "s"], ["[1, 2]", '{"a": 1}']]


def test_query_is_read_only_and_errors_are_one_line(cli, populated_db):
    result = cli("query", "DELETE FROM branches", "--db", populated_db)
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "read-only" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = cli("query", "SELEC nonsense", "--db", populated_db)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    with Store.open(populated_db, read_only=True) as store:
        assert store.branches("r1").height == 2


def test_runs_lists_counts(cli, populated_db):
    data = json.loads(cli("runs", "--db", populated_db, "--json").output)
    assert len(data) == 1
    assert {k: data[0][k] for k in ("run_id", "branches", "errors", "events", "status")} == {
        "run_id": "r1", "branches": 2, "errors": 1, "events": 2, "status": "finished"}
    table = cli("runs", "--db", populated_db).output
    assert "r1" in table and "replay:a" in table


def test_db_migrate_and_info(cli, tmp_path):
    path = tmp_path / "fresh.duckdb"
    created = json.loads(cli("db", "migrate", "--db", path, "--json").output)
    assert created["created"] is True and len(created["migrations"]) >= 3
    assert "opened" in cli("db", "migrate", "--db", path).output
    info = json.loads(cli("db", "info", "--db", path, "--json").output)
    assert info["rows"]["branches"] == 0 and set(info["rows"]) >= {"runs", "events", "memory"}
    assert cli("runs", "--db", path).output.strip() == "no runs yet"


def test_missing_database_is_a_clean_error_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "factory.cli", "runs", "--db", str(tmp_path / "absent.duckdb")],
        capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: no database at {tmp_path / 'absent.duckdb'} " \
        "(run `factory fork` first, or pass --db)"
    assert "Traceback" not in result.stderr + result.stdout


def test_locked_database_exit_code(tmp_path):
    path = tmp_path / "busy.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys\nfrom factory.store import Store\ns = Store.open({str(path)!r})\nprint('ready', flush=True)\n"
         "sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        result = subprocess.run([sys.executable, "-m", "factory.cli", "db", "migrate", "--db", str(path)],
                                capture_output=True, text=True)
    finally:
        holder.communicate("\n", timeout=30)
    assert result.returncode == 3
    assert "open for writing by another process" in result.stderr and "Traceback" not in result.stderr
