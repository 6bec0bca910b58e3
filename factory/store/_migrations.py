"""Named, append-only schema migrations.

Each migration is applied once, in a transaction, and recorded in
``factory_migrations``. Never edit or reorder a migration that has shipped:
add a new one. A database carrying a migration this code does not know was
written by a newer `factory` and is refused rather than guessed at.

All timestamps are UTC, stored as ``TIMESTAMP``. ``JSON`` columns hold
canonical JSON text written by the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb

from factory.errors import MigrationError

__all__ = ["MIGRATIONS", "Migration", "applied_migrations", "migrate"]


@dataclass(frozen=True)
class Migration:
    """One schema step.

    Attributes:
        name: Unique, stable name (``NNNN_words``), recorded when applied.
        sql: Statements run in one transaction.
    """

    name: str
    sql: str


#: Every schema step, oldest first; append only.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "0001_runs_tasks_branches_events",
        """
        CREATE TABLE runs (
            run_id          VARCHAR PRIMARY KEY,
            created_at      TIMESTAMP NOT NULL,
            finished_at     TIMESTAMP,
            status          VARCHAR NOT NULL,   -- running | finished | interrupted | failed
            task_file       VARCHAR,
            dataset_hash    VARCHAR,
            config_hash     VARCHAR,
            model           VARCHAR,
            sandbox         VARCHAR,
            n_branches      INTEGER,
            package_version VARCHAR,
            git_sha         VARCHAR,
            config          JSON                -- the run manifest: sampling parameters, seeds, ...
        );
        CREATE TABLE tasks (
            run_id      VARCHAR NOT NULL,
            task_id     VARCHAR NOT NULL,
            task_hash   VARCHAR NOT NULL,
            prompt      VARCHAR NOT NULL,
            verifiers   VARCHAR[],
            spec        JSON NOT NULL,          -- the whole normalized task
            PRIMARY KEY (run_id, task_id)
        );
        CREATE TABLE branches (
            run_id             VARCHAR NOT NULL,
            task_id            VARCHAR NOT NULL,
            branch_index       INTEGER NOT NULL,
            session_id         VARCHAR NOT NULL,
            temperature        DOUBLE,
            seed               BIGINT,
            model              VARCHAR,
            status             VARCHAR NOT NULL,
            final_answer       VARCHAR,
            trajectory         JSON,
            tool_call_sequence JSON,
            usage              JSON,
            input_tokens       BIGINT,
            output_tokens      BIGINT,
            cost_usd           DOUBLE,
            started_at         TIMESTAMP,
            finished_at        TIMESTAMP,
            error              VARCHAR,
            PRIMARY KEY (run_id, task_id, branch_index)
        );
        -- No primary key: a branch's events are replaced as a set, in the same
        -- transaction as its branch row, which keeps bulk appends fast.
        CREATE TABLE events (
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            branch_index INTEGER NOT NULL,
            seq          INTEGER NOT NULL,
            ts           TIMESTAMP NOT NULL,
            kind         VARCHAR NOT NULL,  -- run_start|model_call|tool_call|tool_result|final_answer|error
            payload      JSON
        );
        """,
    ),
    Migration(
        "0002_verdicts_judgments_rankings",
        """
        CREATE TABLE verdicts (
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            branch_index INTEGER NOT NULL,
            verifier     VARCHAR NOT NULL,
            version      VARCHAR NOT NULL,
            ok           BOOLEAN NOT NULL,
            score        DOUBLE,
            status       VARCHAR NOT NULL,      -- pass | fail | error | running | unknown | budget_exhausted
            details      JSON,
            created_at   TIMESTAMP NOT NULL,
            PRIMARY KEY (run_id, task_id, branch_index, verifier, version)
        );
        CREATE TABLE judgments (
            judgment_id  VARCHAR PRIMARY KEY,   -- hash of the identifying columns below
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            judge        VARCHAR NOT NULL,
            kind         VARCHAR NOT NULL,      -- scalar | pairwise
            branch_a     INTEGER NOT NULL,
            branch_b     INTEGER,               -- NULL for scalar judgments
            sample_index INTEGER NOT NULL,
            swapped      BOOLEAN NOT NULL DEFAULT false,
            score        DOUBLE,
            preference   VARCHAR,               -- a | b | tie
            status       VARCHAR NOT NULL,
            raw          VARCHAR,
            created_at   TIMESTAMP NOT NULL
        );
        CREATE TABLE rankings (
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            branch_index INTEGER NOT NULL,
            rank         INTEGER NOT NULL,
            strength     DOUBLE,
            ci_low       DOUBLE,
            ci_high      DOUBLE,
            reward       DOUBLE,
            components   JSON,
            created_at   TIMESTAMP NOT NULL,
            PRIMARY KEY (run_id, task_id, branch_index)
        );
        """,
    ),
    Migration(
        "0003_memory",
        """
        CREATE TABLE memory (
            memory_id    VARCHAR PRIMARY KEY,
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            branch_index INTEGER NOT NULL,
            task_text    VARCHAR NOT NULL,
            key_steps    VARCHAR[],
            final_answer VARCHAR,
            embedder     VARCHAR NOT NULL,
            dim          INTEGER NOT NULL,
            embedding    FLOAT[] NOT NULL,
            created_at   TIMESTAMP NOT NULL
        );
        """,
    ),
    Migration(
        "0004_branch_rollout_id",
        """
        -- One rollout id per (run, task); a branch's session_id is <rollout_id>-b<index>-<uuid>.
        ALTER TABLE branches ADD COLUMN rollout_id VARCHAR;
        """,
    ),
    Migration(
        "0005_branch_workspace",
        """
        -- The branch's final workspace as a change set against the task's files:
        -- {"files": {path: text}, "deleted": [path, ...]}; lets `factory verify`
        -- re-verify exactly what the branch left behind.
        ALTER TABLE branches ADD COLUMN workspace JSON;
        """,
    ),
    Migration(
        "0006_memory_discards",
        """
        -- Branches the memory refused (not a clean objective win): counted, never stored as memories.
        CREATE TABLE memory_discards (
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            branch_index INTEGER NOT NULL,
            reason       VARCHAR NOT NULL,
            PRIMARY KEY (run_id, task_id, branch_index)
        );
        """,
    ),
    Migration(
        "0007_artifacts",
        """
        -- Files a command wrote from a run's data (rank and power plots, export folders, trained models),
        -- recorded so `factory view` can show them beside the run. The file stays where the user put it;
        -- this row points at it, with the hash it had when written (a later change is visible as a mismatch).
        CREATE TABLE artifacts (
            artifact_id  VARCHAR PRIMARY KEY,
            run_id       VARCHAR,
            kind         VARCHAR NOT NULL,
            path         VARCHAR NOT NULL,
            sha256       VARCHAR,
            meta         JSON,
            created_at   TIMESTAMP NOT NULL
        );
        """,
    ),
    Migration(
        "0008_feedback",
        """
        -- Turn- and span-level feedback on a branch's trajectory (hints and polarities), from users,
        -- verifiers, judges and the monitor; proposals wait for a user's accept or override.
        -- turn: the assistant turn index; span_start/span_end: a message range [start, end).
        CREATE TABLE feedback (
            feedback_id  VARCHAR PRIMARY KEY,
            run_id       VARCHAR NOT NULL,
            task_id      VARCHAR NOT NULL,
            branch_index INTEGER NOT NULL,
            turn         INTEGER,
            span_start   INTEGER,
            span_end     INTEGER,
            polarity     VARCHAR NOT NULL,
            hint         VARCHAR,
            source       VARCHAR NOT NULL,
            status       VARCHAR NOT NULL,
            note         VARCHAR,
            evidence     JSON,
            created_at   TIMESTAMP NOT NULL
        );
        """,
    ),
)

_LEDGER = """
CREATE TABLE IF NOT EXISTS factory_migrations (
    seq        INTEGER PRIMARY KEY,
    name       VARCHAR NOT NULL UNIQUE,
    applied_at TIMESTAMP NOT NULL
)
"""


def applied_migrations(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Names of the migrations recorded in the database, in order (empty if none)."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'factory_migrations'"
    ).fetchall()[0]
    if not exists or not exists[0]:
        return []
    return [row[0] for row in con.execute("SELECT name FROM factory_migrations ORDER BY seq").fetchall()]


def migrate(con: duckdb.DuckDBPyConnection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """Apply the pending migrations, each in its own transaction.

    Args:
        con: A read-write connection.
        migrations: The known migrations, oldest first.

    Returns:
        The names applied by this call.

    Raises:
        MigrationError: If the database holds migrations this code does not
            know, or a migration fails (it is rolled back).
    """
    con.execute(_LEDGER)
    applied = applied_migrations(con)
    known = [m.name for m in migrations]
    if applied != known[: len(applied)]:
        unknown = [name for name in applied if name not in known]
        raise MigrationError(
            f"database schema has migrations this factory does not know ({', '.join(unknown) or 'reordered'}); "
            "it was written by a newer version — upgrade factory to open it"
        )
    done: list[str] = []
    for seq, migration in enumerate(migrations[len(applied):], start=len(applied) + 1):
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(migration.sql)
            con.execute(
                "INSERT INTO factory_migrations VALUES (?, ?, ?)",
                [seq, migration.name, datetime.now(timezone.utc).replace(tzinfo=None)],
            )
            con.execute("COMMIT")
        except duckdb.Error as exc:
            con.execute("ROLLBACK")
            raise MigrationError(f"migration {migration.name} failed: {exc}") from exc
        done.append(migration.name)
    return done
