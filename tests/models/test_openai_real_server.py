"""``openai:`` against a real OpenAI-compatible server: llama-cpp-python's own, serving the embedded GGUF.

Our wire fakes (``tests/rollouts/wire_server.py``) are only as good as their
likeness to real servers. Here ``python -m llama_cpp.server`` (the ``server``
extra of llama-cpp-python) serves the embedded Qwen2.5-Coder GGUF on a free
loopback port, and:

* the same requests go to it and to the fake: the answers must have the same
  shape (tool calls, finish reasons, usage, error bodies);
* ``factory fork`` runs example tasks through ``--model openai:NAME
  --base-url ...`` in bwrap sandboxes: every branch must end with a verdict,
  code tasks must receive tool calls, tokens and finish reasons recorded.

The chat format is the GGUF's own template (the server's default). The
server's ``chatml-function-calling`` format does not work for this model with
``tool_choice: "auto"``: its first pass picks ``message:`` at temperature 0,
and the message is then constrained by the grammar meant for follow-up calls,
so the reply's content is ``functions.run:`` with no arguments (seen with
llama-cpp-python 0.3.36). With the GGUF's template the model writes each call
as a JSON object in its text, which the provider reads (``origin="text"``);
the server returns structured calls (``origin="native"``) when one tool is
forced through ``tool_choice``, which is how the native shape is compared.

Skipped, with the reason, where the server extra or the weights are missing.
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
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from factory.errors import ModelConfigError
from factory.models import ModelOptions, ToolSpec, create_model, ensure_weights
from factory.store import Store
from tests.rollouts.wire_server import OPENAI_PATH, Reply, WireServer

pytest.importorskip("openai")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The model name the fork asks for; llama-cpp-python's server answers any name with its one model.
MODEL_ALIAS = "qwen2.5-coder-0.5b"
#: One answer task and two code tasks from the examples, one branch each: both kinds, short on 2 cores. The
#: server answers one request at a time, so the fork sends one at a time (queued calls would pass the timeout).
FORK_TASKS = ("add-small", "fix-factorial", "fix-is-even")
FORK_BRANCHES = 1
START_TIMEOUT_S = 180.0

RUN = ToolSpec("run", "Run a shell command in the workspace.", {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]})
SUBMIT = ToolSpec("submit", "Submit the final answer.", {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})


def _server_importable() -> str | None:
    """Why ``llama_cpp.server`` cannot start here, or None.

    Checked in a child: importing llama.cpp loads native code, which must not
    take the test process down on a CPU the build does not suit.
    """
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp.server.app"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode == 0:
        return None
    lines = (probe.stderr.strip() or f"exit status {probe.returncode}").splitlines()
    return lines[-1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RealServer:
    """A running ``llama_cpp.server``.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (no trailing slash).
        log: Its stdout and stderr.
    """

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def post(self, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        """POST ``body`` to the chat completions path; status, headers and parsed JSON body."""
        return _post(self.url + OPENAI_PATH, body)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(payload) if payload else None


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End the server and anything it started (its own process group), waiting for it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
    try:  # a child it left behind in its group
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    reason = _server_importable()
    if reason is not None:
        pytest.skip(f"llama_cpp.server is not importable (install llama-cpp-python[server]): {reason}")
    try:
        gguf = ensure_weights(cache=tmp_path_factory.mktemp("models"))
    except ModelConfigError as exc:
        pytest.skip(f"the embedded weights are not installed: {exc}")
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    port = _free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_ALIAS,
             "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", "4096", "--n_threads", str(min(2, os.cpu_count() or 1)), "--verbose", "false"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = RealServer(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within {START_TIMEOUT_S:g} s:\n"
                            f"{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield server
    finally:
        _stop(process)
    assert process.returncode is not None


def _shape(value: Any) -> Any:
    """The JSON shape of ``value``: its keys and the types of its leaves (lists by their first item)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


TOOL_REQUEST = {
    "model": MODEL_ALIAS, "temperature": 0.0, "seed": 0, "max_tokens": 64,
    "messages": [{"role": "system", "content": "You are an agent. Use the tools."},
                 {"role": "user", "content": "Run the command `ls` in the workspace."}],
    "tools": [RUN.openai_schema(), SUBMIT.openai_schema()], "tool_choice": "auto",
}
FORCED_REQUEST = {**TOOL_REQUEST, "tool_choice": {"type": "function", "function": {"name": "run"}}}


def test_the_fake_answers_a_tool_call_in_the_real_servers_shape(real_server: RealServer) -> None:
    status, headers, real = real_server.post(FORCED_REQUEST)
    assert status == 200, real
    message = real["choices"][0]["message"]
    assert message.get("tool_calls"), f"the real server made no tool call: {message}"
    call = message["tool_calls"][0]
    with WireServer() as fake:
        fake.push(Reply.ok(tool_calls=[(call["function"]["name"], call["function"]["arguments"])],
                           usage=(real["usage"]["prompt_tokens"], real["usage"]["completion_tokens"])))
        fake_status, _, faked = _post(fake.url + OPENAI_PATH, FORCED_REQUEST)
    assert fake_status == 200
    assert _shape(faked) == _shape(real)
    assert real["choices"][0]["finish_reason"] == faked["choices"][0]["finish_reason"] == "tool_calls"
    assert isinstance(json.loads(call["function"]["arguments"]), dict)  # arguments come as JSON text
    assert "retry-after" not in headers


def test_the_fake_answers_text_in_the_real_servers_shape(real_server: RealServer) -> None:
    request = {"model": MODEL_ALIAS, "temperature": 0.0, "seed": 0, "max_tokens": 16,
               "messages": [{"role": "user", "content": "Say hello."}]}
    status, _, real = real_server.post(request)
    assert status == 200, real
    with WireServer() as fake:
        fake.push(Reply.ok("hello", finish_reason=real["choices"][0]["finish_reason"]))
        _, _, faked = _post(fake.url + OPENAI_PATH, request)
    assert _shape(faked) == _shape(real)
    assert real["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_fake_sends_the_real_servers_error_bodies(real_server: RealServer) -> None:
    """A prompt past the context window: 400 with OpenAI's error body, and no ``Retry-After``."""
    request = {"model": MODEL_ALIAS, "max_tokens": 16,
               "messages": [{"role": "user", "content": "word " * 6000}]}
    status, headers, real = real_server.post(request)
    assert status == 400 and real["error"]["code"] == "context_length_exceeded", real
    assert "retry-after" not in headers
    with WireServer() as fake:
        fake.push(Reply.error(400, real["error"]["message"], code="context_length_exceeded", param="messages"))
        fake_status, _, faked = _post(fake.url + OPENAI_PATH, request)
    assert fake_status == 400 and faked == real


def test_a_body_the_real_server_cannot_validate_is_a_500_the_provider_does_not_retry(real_server: RealServer) -> None:
    status, headers, real = real_server.post({"model": MODEL_ALIAS, "messages": "not a list"})
    assert status == 500 and real["error"]["type"] == "internal_server_error", real
    assert "validation error" in real["error"]["message"] and "'loc': ('body'" in real["error"]["message"]
    with WireServer() as fake:
        fake.push(Reply.error(500, "planned"))
        _, _, faked = _post(fake.url + OPENAI_PATH, {})
    assert _shape(faked) == _shape(real)


def test_the_provider_reads_the_calls_the_real_server_leaves_in_the_text(real_server: RealServer) -> None:
    model = create_model(f"openai:{MODEL_ALIAS}", ModelOptions(base_url=real_server.url + "/v1", timeout_s=120))

    async def go():
        try:
            return await model.chat(TOOL_REQUEST["messages"], [RUN, SUBMIT], temperature=0.0, seed=0, max_tokens=64)
        finally:
            await model.aclose()

    response = asyncio.run(go())
    # the server parses no call for this model: it arrives in the text, and is read from there
    assert [(c.name, c.origin, c.error) for c in response.tool_calls] == [("run", "text", None)], response
    assert response.tool_calls[0].arguments.get("command")
    assert response.finish_reason == "stop"  # as the server said
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


#: The 0.5B model mostly answers a code task in prose (seen with local: too); told which tool to call first it
#: writes the call (as JSON in its text), so one code task says so, and the test can require that calls arrive.
DIRECTED = "fix-is-even"
DIRECTION = "Start by calling the run tool with the command python -m pytest -q. Then: "


def _fork_tasks(path: Path) -> Path:
    rows = [json.loads(line) for line in (EXAMPLES / "tasks.jsonl").read_text().splitlines() if line.strip()]
    chosen = [row for row in rows if row["id"] in FORK_TASKS]
    assert [row["id"] for row in chosen] == list(FORK_TASKS)
    for row in chosen:
        if row["id"] == DIRECTED:
            row["prompt"] = DIRECTION + row["prompt"]
    path.write_text("".join(json.dumps(row) + "\n" for row in chosen))
    return path


@pytest.mark.slow  # minutes of generation on 2 cores (706 s at load 8-16): opt-in with -m slow
def test_fork_through_the_real_server(real_server: RealServer, tmp_path: Path) -> None:
    db = tmp_path / "fork.duckdb"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "factory.cli", "fork", str(_fork_tasks(tmp_path / "tasks.jsonl")),
         "--model", f"openai:{MODEL_ALIAS}", "--base-url", real_server.url + "/v1", "--sandbox", "bwrap",
         "--branches", str(FORK_BRANCHES), "--max-turns", "3", "--max-tokens", "256", "--concurrency", "1",
         "--request-timeout", "300", "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=1200)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    with Store.open(db, read_only=True) as store:
        branches = store.query("SELECT task_id, branch_index, status, error, input_tokens, output_tokens "
                               "FROM branches ORDER BY task_id, branch_index").to_dicts()
        verdicts = store.query("SELECT task_id, branch_index, status FROM verdicts").to_dicts()
        calls = store.query("SELECT task_id, payload FROM events WHERE kind = 'tool_call'").to_dicts()
        model_calls = store.query("SELECT payload FROM events WHERE kind = 'model_call'").to_dicts()
    origins = [json.loads(row["payload"]).get("origin") for row in calls]
    report = {
        "elapsed_s": round(elapsed, 1), "branches": len(branches), "passed": summary["passed"],
        "statuses": [row["status"] for row in branches], "verdicts": sorted(row["status"] for row in verdicts),
        "native_calls": origins.count("native"), "text_calls": origins.count("text"),
        "finish_reasons": sorted({json.loads(row["payload"])["finish_reason"] for row in model_calls}),
    }
    print("real-server fork:", json.dumps(report))  # the figures for the record (pytest -s shows them)
    assert len(branches) == len(FORK_TASKS) * FORK_BRANCHES
    assert summary["errors"] == 0 and "infra_error" not in report["statuses"], branches
    judged = {(row["task_id"], row["branch_index"]) for row in verdicts if row["status"] in ("pass", "fail")}
    assert judged == {(row["task_id"], row["branch_index"]) for row in branches}, verdicts
    code_tasks = {row["task_id"] for row in calls}
    # a 0.5B model sometimes answers a code task in prose (its loss, verified as a fail); calls go to code tasks only
    assert DIRECTED in code_tasks and code_tasks <= {"fix-factorial", "fix-is-even"}, "no code task received a call"
    assert set(origins) <= {"native", "text"} and report["text_calls"] > 0  # this server parses none for Qwen
    assert all(row["input_tokens"] > 0 and row["output_tokens"] > 0 for row in branches)
    assert all(json.loads(row["payload"])["finish_reason"] in ("stop", "length", "tool_calls")
               for row in model_calls)
