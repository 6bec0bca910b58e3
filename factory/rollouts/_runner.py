"""``RolloutForkRunner``: N independent branches per task, each in its own sandbox.

Branches run on a fixed pool of ``concurrency`` workers. Finished branches
are written to the store in small batches (every ``flush_interval_s`` or
``flush_max`` branches, whichever comes first) and yielded only once stored,
so what the caller sees is what survives a crash. A killed run loses at most
the unflushed window, which ``resume`` runs again: every (task, branch) ends
up stored exactly once, because writes are keyed by (run, task, branch).

Where branches run is the execution backend's (:mod:`factory.rollouts._backend`:
``local``, this event loop; ``ray``, a cluster's workers): either way this
process is the store's only writer, and the guarantees above hold.

Every tool-using branch gets a fresh sandbox; single-turn branches (answer-only
tasks) run no code, so they start none.

Per-branch sampling: branch ``b`` uses ``temperatures[b]`` and ``seeds[b]``
for every task, both recorded on the branch row and in the run manifest.
"""

from __future__ import annotations

import asyncio
import json
import platform
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from factory.errors import ConfigError, ProviderUnavailableError, RunAbortedError, RunError
from factory.models import ChatModel, Usage
from factory.provenance import content_hash, git_sha, package_version
from factory.rollouts._agent import AgentConfig, AgentResult, BranchStatus, ToolCallingAgent
from factory.rollouts._backend import BranchJob, ExecutionBackend, LocalBackend
from factory.sandbox import (
    SANDBOXES,
    SandboxLimits,
    SandboxSpec,
    WorkspaceFiles,
    create_sandbox,
    sandbox_owner,
    snapshot_of,
    sweep_sandbox_folders,
)
from factory.store import BranchEvent, BranchRecord, ErrorEvent, RunManifest, Store, WorkspaceSnapshot, utc_now
from factory.tasks import Task, dataset_hash
from factory.verifiers import (
    BranchOutput,
    VerificationPipeline,
    objective_pass,
    verdict_events,
    verify_in_fresh_sandbox,
)

__all__ = [
    "BranchPrimer",
    "BranchResult",
    "ForkConfig",
    "RolloutForkRunner",
    "StoredRun",
    "branch_sampling",
    "new_run_id",
]


@runtime_checkable
class BranchPrimer(Protocol):
    """What primes a task's branches: a system-prompt section per task.

    The runner sits below memory in the layers, so it names only what it
    needs; :class:`factory.memory.RolloutMemoryStore` implements it, and the
    CLI wires one in.
    """

    def prime(self, task_text: str, k: int) -> str:
        """The system-prompt section for a task (empty: nothing to add)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a resume needs to reopen the same primer (recorded in the run manifest)."""
        ...


def new_run_id() -> str:
    """A sortable, unique run id: ``run-YYYYmmdd-HHMMSS-xxxxxx``."""
    return datetime.now(timezone.utc).strftime("run-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def branch_sampling(
    branches: int, temperatures: Sequence[float] | None, seeds: Sequence[int] | None, base_seed: int = 0
) -> tuple[list[float], list[int]]:
    """Per-branch temperatures and seeds.

    A temperature list as long as ``branches`` is used as is; a shorter one
    is cycled. Seeds default to ``base_seed + branch_index``.

    Raises:
        ConfigError: If a list is longer than ``branches`` or a value is invalid.
    """
    temps = list(temperatures or [0.7])
    if len(temps) > branches:
        raise ConfigError(f"{len(temps)} temperatures given for {branches} branches")
    if any(t < 0 for t in temps):
        raise ConfigError("temperatures must be >= 0")
    per_branch_temps = [float(temps[b % len(temps)]) for b in range(branches)]
    if seeds is not None:
        if len(seeds) != branches:
            raise ConfigError(f"{len(seeds)} seeds given for {branches} branches")
        per_branch_seeds = [int(s) for s in seeds]
    else:
        per_branch_seeds = [base_seed + b for b in range(branches)]
    return per_branch_temps, per_branch_seeds


@dataclass(frozen=True)
class ForkConfig:
    """Settings of a fork run (all recorded in the run manifest).

    Attributes:
        branches: Branches per task.
        concurrency: Branches running at once.
        temperatures: Per-branch temperatures (cycled if shorter than ``branches``).
        seeds: Per-branch seeds (default ``base_seed + branch_index``).
        base_seed: See ``seeds``.
        sandbox: Sandbox backend name.
        limits: Sandbox limits.
        agent: Agent settings.
        flush_interval_s: Longest time a finished branch waits to be stored.
        flush_max: Finished branches that force a store write.
        memory_k: Memories retrieved per task into each branch's system prompt (0: none).
    """

    branches: int = 4
    concurrency: int = 8
    temperatures: tuple[float, ...] = (0.7,)
    seeds: tuple[int, ...] | None = None
    base_seed: int = 0
    sandbox: str = "bwrap"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    agent: AgentConfig = field(default_factory=AgentConfig)
    flush_interval_s: float = 0.2
    flush_max: int = 512
    memory_k: int = 0

    def sampling(self) -> tuple[list[float], list[int]]:
        """Per-branch (temperatures, seeds)."""
        return branch_sampling(self.branches, self.temperatures, self.seeds, self.base_seed)

    @classmethod
    def from_manifest(cls, manifest: RunManifest | str | dict[str, Any], concurrency: int) -> ForkConfig:
        """The config a stored run was made with (for resuming it exactly); concurrency is free to change.

        Args:
            manifest: The run's manifest, or its stored JSON (older shapes are upgraded).
            concurrency: Branches running at once in the resumed run.

        Raises:
            RecordError: The stored manifest is not one this factory reads.
        """
        data = manifest if isinstance(manifest, RunManifest) else RunManifest.from_stored(manifest)
        return cls(
            branches=data.branches, concurrency=concurrency,
            temperatures=tuple(data.sampling.temperatures), seeds=tuple(data.sampling.seeds),
            sandbox=data.sandbox, limits=SandboxLimits(**data.limits), agent=AgentConfig(**data.agent),
            memory_k=data.memory.k if data.memory is not None else 0,
        )


@dataclass(frozen=True)
class StoredRun:
    """A stored run, reopened to resume it exactly as it was started.

    Attributes:
        run_id: The run's id.
        config: Its fork settings, as its manifest recorded them (only ``concurrency`` is the caller's).
        model: The spec of the policy it ran with.
        tasks: Its tasks, as stored (no task file needed).
        primer: The memory settings its manifest recorded (``k`` and :meth:`BranchPrimer.describe`:
            memory's embedder and backend), empty when it had none. The runner sits below memory,
            so the caller reopens the primer from these.
        backend: The execution backend its manifest recorded (:meth:`ExecutionBackend.describe`), empty
            for runs from before backends (they ran ``local``).
    """

    run_id: str
    config: ForkConfig
    model: str
    tasks: list[Task]
    primer: dict[str, Any]
    backend: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, store: Store, run_id: str, *, concurrency: int) -> StoredRun:
        """Reopen run ``run_id`` of ``store``.

        Raises:
            ConfigError: There is no such run.
        """
        run = store.run(run_id)
        if run is None:
            raise ConfigError(f"no run {run_id} in {store.path}")
        manifest = RunManifest.from_stored(run["config"])
        return cls(run_id, ForkConfig.from_manifest(manifest, concurrency=concurrency), run["model"],
                   _stored_tasks(store, run_id),
                   manifest.memory.model_dump() if manifest.memory is not None else {}, manifest.backend or {})


@dataclass
class BranchResult:
    """One finished branch, as stored."""

    run_id: str
    task_id: str
    branch_index: int
    rollout_id: str
    session_id: str
    temperature: float
    seed: int
    model: str
    status: str
    final_answer: str | None
    trajectory: list[dict[str, Any]]
    tool_call_sequence: list[dict[str, Any]]
    usage: Usage
    started_at: datetime
    finished_at: datetime
    error: str | None
    events: list[BranchEvent]
    workspace: WorkspaceSnapshot | None = None
    verdicts: list[Any] = field(default_factory=list)
    fatal: ProviderUnavailableError | None = field(default=None, repr=False)
    node: str | None = field(default=None, repr=False)  # where it ran (the backend's name for it; not stored)

    @property
    def objective_pass(self) -> bool | None:
        """Every objective verdict passed (None: not verified objectively)."""
        return objective_pass(self.verdicts)

    def record(self) -> BranchRecord:
        """The branch as its stored record."""
        return BranchRecord(
            run_id=self.run_id, task_id=self.task_id, branch_index=self.branch_index,
            rollout_id=self.rollout_id, session_id=self.session_id,
            temperature=self.temperature, seed=self.seed,
            model=self.model, status=self.status, final_answer=self.final_answer,
            trajectory=self.trajectory, tool_call_sequence=self.tool_call_sequence,
            usage={"input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens,
                   "cost_usd": self.usage.cost_usd},
            input_tokens=self.usage.input_tokens,
            output_tokens=self.usage.output_tokens, cost_usd=self.usage.cost_usd,
            started_at=self.started_at, finished_at=self.finished_at, error=self.error,
            workspace=self.workspace,
        )

    def branch_row(self) -> dict[str, Any]:
        """The ``branches`` table row."""
        return self.record().row()

    def event_rows(self) -> list[dict[str, Any]]:
        """The ``events`` table rows."""
        key = {"run_id": self.run_id, "task_id": self.task_id, "branch_index": self.branch_index}
        return [{**key, **event.row()} for event in self.events]


def _output(result: AgentResult) -> BranchOutput:
    return BranchOutput(result.final_answer, result.messages, result.status)


def _stored_tasks(store: Store, run_id: str) -> list[Task]:
    return [Task.model_validate(json.loads(spec) if isinstance(spec, str) else spec)
            for spec in store.tasks(run_id)["spec"].to_list()]


class RolloutForkRunner:
    """Samples N branches per task and stores each as it finishes.

    Args:
        model: The policy (wrap it in ``ResilientModel`` for retries).
        store: An open, writable store.
        config: Fork settings.
        run_id: The run's id (new one if None).
        pipeline: Verifies each branch as soon as it finishes, in its own
            sandbox before the sandbox closes (None: no verification).
        memory: Primes each task's branches with the ``config.memory_k`` most
            similar stored winners (recorded in each branch's ``run_start`` event);
            any :class:`BranchPrimer`.
        backend: Where branches run (default: ``local``, this event loop); recorded in the manifest.
    """

    def __init__(self, model: ChatModel, store: Store, config: ForkConfig, run_id: str | None = None,
                 pipeline: VerificationPipeline | None = None, memory: BranchPrimer | None = None,
                 backend: ExecutionBackend | None = None):
        self.model = model
        self.store = store
        self.config = config
        self.pipeline = pipeline
        self.memory = memory
        self.backend = backend or LocalBackend()
        self.run_id = run_id or new_run_id()
        self.agent = ToolCallingAgent(model, config.agent)
        self._rollout_ids: dict[tuple[str, str], str] = {}  # a hash per task, not per branch

    def rollout_id(self, task_id: str) -> str:
        """The id shared by a task's branches in this run (stable across resumes)."""
        key = (self.run_id, task_id)
        found = self._rollout_ids.get(key)
        if found is None:
            found = self._rollout_ids[key] = "ro-" + content_hash([self.run_id, task_id])[7:19]
        return found

    # ----------------------------------------------------------- manifest

    def manifest(self, tasks: Sequence[Task], task_file: str | None) -> RunManifest:
        """Everything the run's results depend on."""
        temperatures, seeds = self.config.sampling()
        return RunManifest(
            dataset_hash=dataset_hash(tasks),
            task_file=task_file,
            n_tasks=len(tasks),
            model=self.model.spec,
            branches=self.config.branches,
            sampling={"temperatures": temperatures, "seeds": seeds, "max_tokens": self.config.agent.max_tokens},
            agent=asdict(self.config.agent),
            sandbox=self.config.sandbox,
            limits=asdict(self.config.limits),
            memory=None if self.memory is None or not self.config.memory_k else {
                "k": self.config.memory_k, **self.memory.describe()},
            backend=self.backend.describe(),
            package_version=package_version(),
            git_sha=git_sha(Path(__file__).resolve().parent),
            python=platform.python_version(),
            platform=sys.platform,
        )

    @staticmethod
    def config_hash(manifest: RunManifest | dict[str, Any]) -> str:
        """Hash of the result-determining part of a manifest (not versions or paths)."""
        if not isinstance(manifest, RunManifest):
            manifest = RunManifest.from_stored(manifest)
        return manifest.config_hash()

    def _start_run(self, tasks: Sequence[Task], task_file: str | None) -> None:
        manifest = self.manifest(tasks, task_file)
        self.store.write_run({
            "run_id": self.run_id, "created_at": utc_now(), "status": "running", "task_file": task_file,
            "dataset_hash": manifest.dataset_hash, "config_hash": manifest.config_hash(),
            "model": self.model.spec, "sandbox": self.config.sandbox, "n_branches": self.config.branches,
            "package_version": manifest.package_version, "git_sha": manifest.git_sha,
            "config": manifest.model_dump(mode="json"),
        })
        self.store.write_tasks([
            {"run_id": self.run_id, "task_id": t.id, "task_hash": t.task_hash(), "prompt": t.prompt,
             "verifiers": list(t.verifiers), "spec": t.canonical()}
            for t in tasks
        ])

    def stored_tasks(self) -> list[Task]:
        """The tasks of this run, as stored (for resuming without the task file)."""
        return _stored_tasks(self.store, self.run_id)

    def _done(self, retry_errors: bool) -> set[tuple[str, int]]:
        statuses = {BranchStatus.OK, BranchStatus.MAX_TURNS, BranchStatus.INVALID_ACTION} | (
            set() if retry_errors else set(BranchStatus.NOT_OUTCOMES))
        frame = self.store.branches(self.run_id)
        return {
            (row["task_id"], row["branch_index"])
            for row in frame.select("task_id", "branch_index", "status").iter_rows(named=True)
            if row["status"] in statuses
        }

    # ------------------------------------------------------------- running

    def primers(self, tasks: Sequence[Task]) -> dict[str, str | None]:
        """Per task, the memories section of the system prompt (None without memory)."""
        if self.memory is None or not self.config.memory_k:
            return {}
        return {t.id: self.memory.prime(t.prompt, self.config.memory_k) or None for t in tasks}

    async def run_branch(self, job: BranchJob) -> BranchResult:
        """Run one branch here (agent, sandbox, verification), unstored; what a backend's worker calls."""
        return await self._run_branch(job.task, job.index, job.temperature, job.seed, job.primer)

    async def _run_branch(self, task: Task, index: int, temperature: float, seed: int,
                          primer: str | None = None) -> BranchResult:
        rollout_id = self.rollout_id(task.id)
        session_id = f"{rollout_id}-b{index}-{secrets.token_hex(6)}"  # as random as uuid4's first 12, cheaper
        started = utc_now()
        # Hidden tests are never in the agent's sandbox; they join only at verification.
        spec = SandboxSpec(files=task.files, readonly_files=task.tests, limits=self.config.limits, image=task.image)
        workspace: WorkspaceSnapshot | None = None
        collected: WorkspaceFiles | None = None
        verdicts: list[Any] = []
        try:
            if self.agent.single_turn(task):
                # No tools, so no code of the policy's runs during its turn: no sandbox to start.
                result = await self.agent.run(task, None, temperature=temperature, seed=seed, primer=primer)
            else:
                async with create_sandbox(self.config.sandbox, spec) as sandbox:
                    result = await self.agent.run(task, sandbox, temperature=temperature, seed=seed, primer=primer)
                    if result.status not in BranchStatus.NOT_OUTCOMES:
                        collected = await sandbox.collect_workspace()
                        workspace = snapshot_of(collected, task)
                # The agent's sandbox is closed: none of its processes outlive it into verification.
        except Exception as exc:  # a sandbox that fails to start or close: the infrastructure's, recorded
            result = AgentResult(BranchStatus.INFRA_ERROR, None, self.agent.opening(task), [], [
                ErrorEvent(seq=0, ts=utc_now(), type=type(exc).__name__, message=str(exc))], Usage(),
                error=f"{type(exc).__name__}: {exc}")
            collected = workspace = None
        if self.pipeline is not None and result.status not in BranchStatus.NOT_OUTCOMES:
            # Verified after the fact, in fresh sandboxes built from the final workspace (and the
            # tests, hidden ones too, restored): never in the sandbox the policy's code ran in.
            verdicts = await verify_in_fresh_sandbox(
                self.pipeline, task, _output(result), self.config.sandbox, workspace,
                files=None if collected is None else collected.files, limits=self.config.limits)
        events = result.events + verdict_events(verdicts, start_seq=len(result.events))  # none without verdicts
        return BranchResult(
            run_id=self.run_id, task_id=task.id, branch_index=index,
            rollout_id=rollout_id, session_id=session_id,
            temperature=temperature, seed=seed, model=self.model.spec, status=result.status,
            final_answer=result.final_answer, trajectory=result.messages,
            tool_call_sequence=result.tool_call_sequence, usage=result.usage, started_at=started,
            finished_at=utc_now(), error=result.error, events=events, workspace=workspace, verdicts=verdicts,
            fatal=result.fatal,
        )

    def _flush(self, results: list[BranchResult]) -> None:
        rows = [r.branch_row() for r in results]
        events = [event for r in results for event in r.event_rows()]
        with self.store.transaction():  # a branch and its verdicts land together or not at all
            self.store.write_branches(rows, events)
            for r in results:
                if r.verdicts:
                    VerificationPipeline.store(self.store, r.run_id, r.task_id, r.branch_index, r.verdicts)

    def resume(self, tasks: Sequence[Task] | None = None, *, retry_errors: bool = False
               ) -> AsyncIterator[BranchResult]:
        """Run only the unfinished branches of this (stored) run; see :meth:`run`.

        Args:
            tasks: The run's tasks (default: as stored; :attr:`StoredRun.tasks` holds them too).
            retry_errors: Also run again the branches that are not outcomes (``infra_error``, old ``error``).

        Raises:
            RunError: The run does not exist, or was made from other tasks or with another model.
        """
        return self.run(self.stored_tasks() if tasks is None else tasks, resume=True, retry_errors=retry_errors)

    async def run(
        self,
        tasks: Sequence[Task],
        branches: int | None = None,
        concurrency: int | None = None,
        temperatures: Sequence[float] | None = None,
        seeds: Sequence[int] | None = None,
        *,
        task_file: str | None = None,
        resume: bool = False,
        retry_errors: bool = False,
    ) -> AsyncIterator[BranchResult]:
        """Run every branch not yet stored; yield each result once it is stored, in finishing order.

        Close the iterator when stopping early (``contextlib.aclosing``): that
        stores what finished and marks the run ``interrupted``.

        Args:
            tasks: The tasks (on resume, :meth:`stored_tasks` gives them back).
            branches: Overrides ``config.branches``.
            concurrency: Overrides ``config.concurrency``.
            temperatures: Overrides ``config.temperatures``.
            seeds: Overrides ``config.seeds``.
            task_file: Where the tasks came from (recorded).
            resume: Continue an existing run: only unfinished branches run.
            retry_errors: On resume, run again the branches that are not outcomes (``infra_error``, old ``error``).

        Raises:
            RunError: Resuming a run that does not exist, or with different tasks or model.
        """
        overrides = {"branches": branches, "concurrency": concurrency, "seeds": None if seeds is None else tuple(seeds),
                     "temperatures": None if temperatures is None else tuple(temperatures)}
        if any(value is not None for value in overrides.values()):
            self.config = replace(self.config, **{k: v for k, v in overrides.items() if v is not None})
        per_branch_temps, per_branch_seeds = self.config.sampling()
        existing = self.store.run(self.run_id)
        # A backend that cannot start here (no engine, a missing image) fails the run before it is written,
        # not every branch as an infrastructure error.
        # The verifiers' own sandboxes too (the browser verifier's image): a missing one refuses the run.
        images = {self.config.sandbox: {task.image for task in tasks}}
        for backend, wanted in (self.pipeline.sandbox_images(tasks) if self.pipeline is not None else {}).items():
            images.setdefault(backend, set()).update(wanted)
        for backend, wanted in images.items():
            preflight = getattr(SANDBOXES.get(backend), "preflight", None)  # any factory may register
            if preflight is not None:
                await asyncio.to_thread(preflight, wanted)
        # So must a model that cannot answer here (an engine that died loading): nothing is written.
        model_preflight = getattr(self.model, "preflight", None)
        if model_preflight is not None:
            await model_preflight()
        await self.backend.preflight(self, tasks)  # and a cluster whose nodes cannot run them
        if resume:
            if existing is None:
                raise RunError(f"no run {self.run_id} to resume in {self.store.path}")
            if existing["dataset_hash"] != dataset_hash(tasks):
                raise RunError(f"run {self.run_id} was made from other tasks ({existing['dataset_hash']})")
            if existing["model"] != self.model.spec:
                raise RunError(f"run {self.run_id} used model {existing['model']}, not {self.model.spec}")
            self.store.update_run(self.run_id, status="running", finished_at=None)
            done = self._done(retry_errors)
        else:
            if existing is not None:
                raise RunError(f"run {self.run_id} already exists; use --resume {self.run_id}")
        if not resume:
            self._start_run(tasks, task_file)
            done = set()

        # What sandboxes of a fork killed mid-run left on the host goes now (never a live process's).
        await asyncio.to_thread(sweep_sandbox_folders)
        primers = self.primers(tasks)
        plan = [BranchJob(task, b, per_branch_temps[b], per_branch_seeds[b], primers.get(task.id))
                for task in tasks for b in range(self.config.branches) if (task.id, b) not in done]
        finished: asyncio.Queue[BranchResult | None] = asyncio.Queue()  # None: the backend stopped
        fatal: list[ProviderUnavailableError] = []  # the provider is gone: no new branch starts
        emitted = [0]

        def emit(result: BranchResult) -> None:
            emitted[0] += 1
            if result.fatal is not None and not fatal:
                fatal.append(result.fatal)
            finished.put_nowait(result)

        with sandbox_owner(self.run_id):  # the workers' sandboxes go in this run's folder
            workers = [asyncio.create_task(self.backend.run_branches(self, plan, emit, lambda: bool(fatal)))]
        workers[0].add_done_callback(lambda _: finished.put_nowait(None))
        buffer: list[BranchResult] = []
        live = len(workers)
        completed = False
        try:
            while live:
                item = await finished.get()
                if item is None:
                    live -= 1
                else:
                    buffer.append(item)
                deadline = time.monotonic() + self.config.flush_interval_s
                while buffer and live and len(buffer) < self.config.flush_max:
                    remaining = deadline - time.monotonic()
                    if finished.empty() and remaining <= 0:
                        break
                    try:
                        item = finished.get_nowait() if not finished.empty() else \
                            await asyncio.wait_for(finished.get(), remaining)
                    except asyncio.TimeoutError:
                        break
                    if item is None:
                        live -= 1
                    else:
                        buffer.append(item)
                if not buffer:
                    continue
                batch, buffer = buffer, []
                # The write runs in a thread so branches keep going meanwhile.
                await asyncio.to_thread(self._flush, batch)
                for result in batch:
                    yield result
            failure = workers[0].exception()  # done: its None came last
            if failure is not None:  # the backend itself failed (a cluster lost): what finished is kept
                raise failure
            completed = not fatal
        finally:
            # Everything that keeps data runs before the first await: an
            # abandoned iterator is closed during loop shutdown, when awaits
            # get cancelled. The store serializes these with a flush still in flight.
            for task in workers:
                task.cancel()
            while not finished.empty():  # finished while we were stopping: keep them
                item = finished.get_nowait()
                if item is not None:
                    buffer.append(item)
            try:
                if buffer:
                    self._flush(buffer)
            finally:  # whatever the last flush did, the run's status says it stopped
                self.store.update_run(self.run_id, status="finished" if completed else "interrupted",
                                      finished_at=utc_now())
            await asyncio.gather(*workers, return_exceptions=True)
        if fatal:
            raise RunAbortedError(
                f"{fatal[0]} — run {self.run_id} stopped: the branches in flight are infra_error, "
                f"{len(plan) - emitted[0]} were not started; once fixed, resume with: "
                f"factory fork --resume {self.run_id}",
                run_id=self.run_id, cause=fatal[0])
