"""Engines in a child process: native crashes contained, the preflight, and a dead endpoint that stops the run.

The crashing engine (tests/models/crash_engine.py) is a registered provider
loaded through FACTORY_PLUGINS; it dies by a real signal in its real child
process, as llama.cpp does on an instruction the CPU refuses.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from factory.errors import EndpointDownError, EngineCrashedError, ProviderConnectionError, ProviderServerError
from factory.models import ChildEngineModel, CircuitBreaker, ModelOptions, ResilientModel, RetryPolicy, crash_message

ROOT = Path(__file__).resolve().parents[2]
TASKS = [{"id": f"q{i}", "prompt": f"What is {i} + {4 - i}? End with `Final: <number>`.", "answer": "4"}
         for i in range(6)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRASHTEST_")}
    env["FACTORY_PLUGINS"] = "tests.models.crash_engine"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, **extra}


def _fork(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "factory.cli", "fork", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def _branches(db: Path) -> list[tuple[str, int, str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT task_id, branch_index, status FROM branches ORDER BY 1, 2").fetchall()


def _engine_hosts() -> list[int]:
    """Live engine child processes started from this test session."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"factory.models._engine_host" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    return path


def test_sigill_mid_run_stops_the_run_in_one_line_and_resume_finishes_it(tmp_path, tasks_file):
    db = tmp_path / "crash.duckdb"
    before = set(_engine_hosts())
    # Call 1 is the preflight, calls 2-3 answer q0 and q1; call 4 (q2) kills the engine with SIGILL.
    crashed = _fork(tmp_path, str(tasks_file), "--model", "crashtest:m", "--branches", "1", "--concurrency", "1",
                    "--db", str(db), "--run-id", "r1", env=_env(CRASHTEST_SIGNAL_AT="4"))
    assert crashed.returncode == 1, crashed.stderr
    errors = [line for line in crashed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, crashed.stderr
    assert "died with SIGILL during the run" in errors[0] and "illegal instruction" in errors[0]
    assert "-DGGML_NATIVE=OFF" in errors[0] and f"factory fork --resume r1 --db {db}" in errors[0]
    assert "Traceback" not in crashed.stderr
    rows = _branches(db)
    assert [(t, s) for t, _, s in rows] == [("q0", "ok"), ("q1", "ok"), ("q2", "infra_error")]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchone() == ("interrupted",)
        error = con.execute("SELECT error FROM branches WHERE task_id = 'q2'").fetchone()[0]
        assert error.startswith("EngineCrashedError") and "SIGILL" in error
    assert set(_engine_hosts()) <= before, "the engine's child outlived the fork"
    assert not list(tmp_path.glob("core*"))

    # Fixed: the resume runs the infrastructure failure again and the three never started, each once.
    resumed = _fork(tmp_path, "--resume", "r1", "--retry-errors", "--db", str(db), "--json", env=_env())
    assert resumed.returncode == 0, resumed.stderr
    rows = _branches(db)
    assert rows == [(f"q{i}", 0, "ok") for i in range(6)]
    assert json.loads(resumed.stdout)["status"] == "finished"


def test_engine_dying_in_its_preflight_leaves_no_store(tmp_path, tasks_file):
    db = tmp_path / "never.duckdb"
    result = _fork(tmp_path, str(tasks_file), "--model", "crashtest:m", "--db", str(db),
                   env=_env(CRASHTEST_SIGNAL_AT="1"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "died with SIGILL while loading the model" in errors[0], result.stderr
    assert "nothing was written" in errors[0] and "Traceback" not in result.stderr
    assert not db.exists() and not Path(str(db) + ".wal").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]


def test_oom_kill_is_named_with_what_to_do(tmp_path, tasks_file, monkeypatch):
    for key, value in _env(CRASHTEST_SIGNAL_AT="2", CRASHTEST_SIGNAL="SIGKILL").items():
        monkeypatch.setenv(key, value)
    model = ChildEngineModel("crashtest:k", ModelOptions())
    assert model.spec == "crashtest:k" and model.pid in _engine_hosts()
    with pytest.raises(EngineCrashedError) as caught:
        asyncio.run(model.chat([{"role": "user", "content": "hi"}]))
    assert caught.value.signal == "SIGKILL" and "OOM killer" in str(caught.value)
    with pytest.raises(EngineCrashedError):  # every later call too, at once
        asyncio.run(model.chat([{"role": "user", "content": "hi"}]))
    asyncio.run(model.aclose())


def test_engine_answers_concurrent_calls_and_closes(monkeypatch):
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    model = ChildEngineModel("crashtest:ok", ModelOptions())

    async def many():
        return await asyncio.gather(*(model.chat([{"role": "user", "content": str(i)}]) for i in range(8)))

    replies = asyncio.run(many())
    assert [r.text for r in replies] == ["Final: 4"] * 8 and replies[0].usage.output_tokens == 3
    asyncio.run(model.aclose())
    assert model._proc.returncode == 0 and model.pid not in _engine_hosts()


def test_crash_messages_name_the_signal_and_the_remedy():
    assert "SIGILL" in crash_message("local", -signal.SIGILL) and "GGML_NATIVE=OFF" in crash_message("local", -4)
    assert "segmentation fault" in crash_message("hf:m", -signal.SIGSEGV, "boom\n")
    assert "last output: boom" in crash_message("hf:m", -signal.SIGSEGV, "boom\n")
    assert "exited with status 3" in crash_message("local", 3, "Traceback\nValueError: bad\n")


# ------------------------------------------------------------------ the circuit breaker


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_breaker_trips_only_after_a_window_of_nothing_but_connection_failures():
    clock = _Clock()
    breaker = CircuitBreaker(window_s=20, endpoint="http://127.0.0.1:9/v1", clock=clock)
    failure = ProviderConnectionError("openai: connection failed: refused")
    breaker.connect_failed(failure)
    clock.now = 19.0
    breaker.connect_failed(failure)
    assert breaker.until_trip() == pytest.approx(1.0)
    breaker.success()  # a server that answers some calls keeps per-call retries
    clock.now = 39.5
    breaker.connect_failed(failure)
    assert breaker.tripped is None
    clock.now = 60.0
    with pytest.raises(EndpointDownError, match=r"http://127.0.0.1:9/v1 does not answer: 2 calls"):
        breaker.connect_failed(failure)
    with pytest.raises(EndpointDownError):
        breaker.check()


class _Flaky:
    """Fails to connect on odd calls, answers on even ones."""

    spec = "flaky:m"

    def __init__(self):
        self.calls = 0

    async def chat(self, messages, tools=None, **kwargs):
        from factory.models import ChatResponse

        self.calls += 1
        if self.calls % 2:
            raise ProviderConnectionError("flaky: connection failed")
        return ChatResponse(text="ok")

    async def aclose(self):
        return None


def test_a_provider_that_answers_some_calls_never_trips_the_breaker():
    model = ResilientModel(_Flaky(), RetryPolicy(base_s=0.001, cap_s=0.002),
                           breaker=CircuitBreaker(window_s=0.0))
    for _ in range(5):
        assert asyncio.run(model.chat([])).text == "ok"
    assert model.unavailable is None and model.retries == 5


class _Refused:
    spec = "refused:m"

    async def chat(self, messages, tools=None, **kwargs):
        raise ProviderServerError("HTTP 503")

    async def aclose(self):
        return None


def test_server_errors_do_not_arm_the_breaker():
    breaker = CircuitBreaker(window_s=0.0)
    model = ResilientModel(_Refused(), RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.001), breaker=breaker)
    with pytest.raises(Exception, match="gave up after 3 attempts"):
        asyncio.run(model.chat([]))
    assert breaker.tripped is None and model.unavailable is None


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_fork_against_a_dead_endpoint_stops_fast_and_resumes(tmp_path, write_jsonl):
    pytest.importorskip("openai", reason="needs the 'openai' extra")
    tasks = write_jsonl([{"id": f"t{i}", "prompt": f"What is {i}?", "answer": str(i)} for i in range(40)])
    db = tmp_path / "down.duckdb"
    port = _closed_port()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "factory.cli", "fork", str(tasks), "--model", "openai:m", "--base-url",
         f"http://127.0.0.1:{port}/v1", "--branches", "2", "--concurrency", "4", "--db", str(db), "--run-id", "down"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OPENAI_API_KEY": "x"})
    elapsed = time.monotonic() - started
    assert result.returncode == 1 and elapsed < 40, (elapsed, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"http://127.0.0.1:{port}/v1 does not answer" in errors[0], result.stderr
    assert "factory fork --resume down" in errors[0]
    rows = _branches(db)
    assert rows and {status for _, _, status in rows} == {"infra_error"}
    assert len(rows) <= 4  # only the branches in flight; the other 76 stay pending
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchone() == ("interrupted",)
