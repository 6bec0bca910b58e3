"""The ``factory`` command: a thin, lazily loaded click layer over the library."""

from __future__ import annotations

import click

from factory._version import __version__
from factory.cli._lazy import LazyGroup

__all__ = ["COMMANDS", "main"]

#: Command name -> "module:attribute"; modules are imported only when used.
COMMANDS = {
    "db": "factory.cli._db:db",
    "export": "factory.cli._export:export",
    "feedback": "factory.cli._feedback:feedback",
    "fork": "factory.cli._fork:fork",
    "tasks": "factory.cli._tasks:tasks",
    "verify": "factory.cli._verify:verify",
    "view": "factory.cli._view:view",
    "memory": "factory.cli._memory:memory",
    "power": "factory.cli._rank:power",
    "query": "factory.cli._query:query",
    "rank": "factory.cli._rank:rank",
    "runs": "factory.cli._query:runs",
    "sandbox": "factory.cli._sandbox:sandbox",
    "train": "factory.cli._train:train",
}


@click.group(cls=LazyGroup, lazy_subcommands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="factory")
def main() -> None:
    """factory: turn agent rollouts into training data you can trust.

    Fork N sandboxed agent branches per task, verify and judge them, rank them
    with power checks, and export DPO / KTO / reward / SFT data for TRL.
    Everything lands in one DuckDB file (--db, $FACTORY_DB, ./factory.duckdb).
    """
