"""``--backend ray``: a fork's branches on the workers of a Ray cluster; this process stays the store's only writer.

Each worker is a Ray actor (one process, ``BranchWorker``) that runs whole
branches (agent loop, sandbox, verification) on its node, several at once on
its event loop. The driver keeps at most ``--concurrency`` branches in flight
over the whole cluster, takes results back as they finish (``ray.wait``) and
hands them to the runner, which writes them in batches exactly as for
``local``.

Faults, with Ray's own machinery: a worker process that dies mid-branch is
restarted by Ray and its branches in flight are run again
(``max_restarts``/``max_task_retries``); one gone for good (its node lost) has
its branches sent to the other workers. A branch that still cannot run is
stored as ``infra_error`` (never the agent's failure), which
``--resume --retry-errors`` runs again; writes keyed by (run, task, branch)
keep every branch stored once. Every worker sweeps its node's sandbox folders
(and docker containers) of dead processes when it starts: a killed worker's
bwrap sandboxes died with it (``--die-with-parent``) and their folders, and
its containers, go then.

Models: providers behind an endpoint (OpenAI, Anthropic, vLLM's server) and
``replay:`` files are opened on each worker, which calls them directly; an
in-process engine (``local``, ``hf``) is loaded once, in a ``ModelHost``
actor that owns it, and the workers call that actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import platform
import shutil
import socket
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError, EngineCrashedError, FactoryError, RunError
from factory.models import (
    CHILD_ENGINES,
    AdaptiveLimiter,
    ChatModel,
    ChatResponse,
    CircuitBreaker,
    Message,
    ModelOptions,
    ResilientModel,
    ToolSpec,
    Usage,
    create_model,
)
from factory.provenance import package_version
from factory.rollouts._backend import BackendOptions, BranchJob, ExecutionBackend
from factory.sandbox import (
    SANDBOXES,
    SandboxSpec,
    create_sandbox,
    sandbox_folder,
    sandbox_owner,
    sweep_sandbox_folders,
)
from factory.store import ErrorEvent, utc_now
from factory.tasks import Task

try:
    import ray
    from ray.exceptions import (
        ActorDiedError,
        GetTimeoutError,
        NodeDiedError,
        ObjectLostError,
        RayActorError,
        RayError,
        RayTaskError,
        WorkerCrashedError,
    )
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ConfigError("--backend ray needs Ray: pip install 'factory-rlaif[ray]'") from exc

if TYPE_CHECKING:
    from factory.rollouts._runner import BranchResult, ForkConfig, RolloutForkRunner
    from factory.verifiers import VerificationPipeline

__all__ = ["RayBackend"]

#: Times Ray restarts a dead worker process, and runs again a branch that was in flight on it.
WORKER_RESTARTS = 3
#: Times the driver sends a branch whose worker is gone for good to another worker, before it is infra_error.
RESUBMITS = 2
#: Seconds the node check may take (it starts one sandbox on each node).
NODE_CHECK_TIMEOUT_S = 120.0
#: Seconds a worker may take to close (its docker containers removed) before it is killed.
CLOSE_TIMEOUT_S = 30.0
#: Seconds the model host may take to load an in-process engine (as ``ChildEngineModel`` allows).
MODEL_LOAD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class _Recipe:
    """What a worker rebuilds the run's parts from (everything picklable)."""

    run_id: str
    config: ForkConfig
    model_spec: str
    model_options: ModelOptions
    model_host: Any  # ModelHost's actor handle for an in-process engine; None: open the model on the worker
    pipeline: Callable[[], VerificationPipeline] | None
    concurrency: int  # branches at once on this worker
    judge_budget: ClusterBudget | None = None  # the run's judge call cap, counted once for the cluster


def _node_label() -> str:
    return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"


class _ActorModel:
    """A :class:`ChatModel` whose engine lives in a ``ModelHost`` actor (callable from any node)."""

    def __init__(self, host: Any, spec: str):
        self.host = host
        self.spec = spec

    async def chat(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None, *,
                   temperature: float = 0.7, seed: int | None = None, max_tokens: int = 1024) -> ChatResponse:
        try:
            return await self.host.chat.remote(list(messages), None if tools is None else list(tools),
                                               temperature, seed, max_tokens)
        except RayTaskError as exc:  # the engine's own error (a ModelError, a crash), as a local engine raises it
            if isinstance(exc.cause, Exception):
                raise exc.cause from None
            raise
        except RayActorError as exc:  # the host process itself is gone: as a crashed engine, it stops the run
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EngineCrashedError(f"{self.spec}: the model host died: {message}") from None

    async def preflight(self) -> None:
        await self.host.preflight.remote()

    async def aclose(self) -> None:
        return None  # the driver ends the host with the run


class ModelHost:
    """Owns one in-process engine (``local``, ``hf``) for the whole cluster; workers call :meth:`chat`.

    The engine runs in this actor's own child process, as :func:`create_model` starts it anywhere (a
    native crash there is an :class:`~factory.errors.EngineCrashedError`, which stops the run). A model
    that cannot load does not fail the actor's creation: :meth:`describe` raises its error, so that the
    driver reports it as ``create_model`` would.
    """

    def __init__(self, spec: str, options: ModelOptions):
        self.model: ChatModel | None = None
        self.error: Exception | None = None
        self.calls = 0
        try:
            self.model = create_model(spec, options)
        except Exception as exc:
            self.error = exc

    def _loaded(self) -> ChatModel:
        if self.model is None:
            raise self.error or RunError("the model host holds no model")
        return self.model

    async def describe(self) -> dict[str, Any]:
        """The engine's spec and where it runs: this actor's node and pid, the engine's pid, calls served."""
        model = self._loaded()
        return {"spec": model.spec, "node": _node_label(), "pid": os.getpid(),
                "engine_pid": getattr(model, "pid", None), "calls": self.calls}

    async def chat(self, messages: list[Message], tools: list[ToolSpec] | None, temperature: float,
                   seed: int | None, max_tokens: int) -> ChatResponse:
        self.calls += 1
        return await self._loaded().chat(messages, tools, temperature=temperature, seed=seed, max_tokens=max_tokens)

    async def preflight(self) -> None:
        check = getattr(self._loaded(), "preflight", None)
        if check is not None:
            await check()

    async def aclose(self) -> None:
        if self.model is not None:
            await self.model.aclose()


class BudgetHost:
    """The judge call budget of one run: one count for every worker of the cluster (a ``ClusterBudget``'s)."""

    def __init__(self, cap: int):
        self.cap, self.used, self.exhausted = cap, 0, 0

    def take(self) -> bool:
        if self.used < self.cap:
            self.used += 1
            return True
        self.exhausted += 1
        return False

    def state(self) -> tuple[int, int]:
        return self.used, self.exhausted


class ClusterBudget:
    """A judge budget (``JudgeBudget``'s interface) whose count lives in a ``BudgetHost`` actor.

    Each worker builds its own verification pipeline, with a budget of its own; the workers' and
    the driver's are replaced by one of these, so ``--judge-budget`` caps the run, not each worker.
    :meth:`take` is synchronous, as the verifiers call it (claiming calls before any starts, in sample
    order): a round trip to the actor, short beside the judge call it grants. Once the run ends the
    driver's copy keeps the final count (:meth:`freeze`), for the summary.

    Args:
        host: The ``BudgetHost`` actor's handle.
        cap: Calls allowed in all.
    """

    def __init__(self, host: Any, cap: int):
        self.host = host
        self.max_judge_calls_per_batch = cap
        self._final: tuple[int, int] | None = None

    def take(self) -> bool:
        """Claim one call for the whole run: True if it is within the cap, else False (and counted)."""
        return bool(ray.get(self.host.take.remote()))

    def _state(self) -> tuple[int, int]:
        return self._final if self._final is not None else tuple(ray.get(self.host.state.remote()))

    @property
    def used(self) -> int:
        """Calls granted so far, on every worker."""
        return self._state()[0]

    @property
    def exhausted(self) -> int:
        """Calls refused so far, on every worker."""
        return self._state()[1]

    @property
    def remaining(self) -> int:
        """Calls still allowed."""
        return max(0, self.max_judge_calls_per_batch - self.used)

    def freeze(self) -> None:
        """Keep the count as it is now (the actor is about to end)."""
        with contextlib.suppress(Exception):
            self._final = tuple(ray.get(self.host.state.remote(), timeout=10.0))

    def __getstate__(self) -> dict[str, Any]:
        return {"host": self.host, "max_judge_calls_per_batch": self.max_judge_calls_per_batch, "_final": None}


def _judge_budgets(pipeline: VerificationPipeline | None) -> list[Any]:
    """The verifiers of ``pipeline`` that hold a judge budget (the judge and the browser verifier share one)."""
    if pipeline is None:
        return []
    return [verifier for verifier in pipeline.verifiers.values()
            if hasattr(getattr(verifier, "budget", None), "max_judge_calls_per_batch")]


def _share_budget(pipeline: VerificationPipeline | None, budget: ClusterBudget) -> None:
    for verifier in _judge_budgets(pipeline):
        verifier.budget = budget  # type: ignore[attr-defined]


class BranchWorker:
    """One worker process: runs whole branches of one run on its node, ``recipe.concurrency`` at a time."""

    def __init__(self, recipe: _Recipe):
        self.recipe = recipe
        self.node = _node_label()
        # Sandboxes of a worker that died on this node: their processes died with it, their folders
        # (and containers) go now. A live process's never: each holds a lock on its folder.
        sweep_sandbox_folders()
        if recipe.config.sandbox == "docker":
            from factory.sandbox import sweep_docker_containers

            with contextlib.suppress(Exception):  # best effort: the node check saw the engine answer
                sweep_docker_containers()
        self._runner: RolloutForkRunner | None = None

    def _open(self) -> RolloutForkRunner:
        """The branch runner, made in the actor's event loop (the model's clients belong to it)."""
        if self._runner is None:
            from factory.rollouts._runner import RolloutForkRunner

            recipe = self.recipe
            if recipe.model_host is not None:
                inner: ChatModel = _ActorModel(recipe.model_host, recipe.model_spec)
            else:
                inner = create_model(recipe.model_spec, recipe.model_options)
            model = ResilientModel(inner, limiter=AdaptiveLimiter(recipe.concurrency),
                                   breaker=CircuitBreaker(endpoint=recipe.model_options.base_url or inner.spec))
            pipeline = recipe.pipeline() if recipe.pipeline is not None else None
            if recipe.judge_budget is not None:
                _share_budget(pipeline, recipe.judge_budget)
            self._runner = RolloutForkRunner(model, None, recipe.config, run_id=recipe.run_id,  # type: ignore[arg-type]
                                             pipeline=pipeline)
        return self._runner

    async def run(self, job: BranchJob) -> BranchResult:
        """Run one branch here and return it (unstored: the driver stores it)."""
        runner = self._open()
        with sandbox_owner(self.recipe.run_id):
            result = await runner.run_branch(job)
        result.node = self.node
        return result

    async def where(self) -> tuple[str, int]:
        """(node label, process id)."""
        return self.node, os.getpid()

    async def close(self) -> None:
        """Close the model's clients, remove this process's containers and sandbox folder (the driver then ends it).

        Docker removes a closed sandbox's container off the caller's path, and keeps containers started
        ahead: both are waited for here, since the driver's ``ray.kill`` ends this process without its
        exit handlers (the containers would still go, their holder gone, but after the run's end).
        """
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.model.aclose()
            if self._runner.pipeline is not None:
                with contextlib.suppress(Exception):
                    await self._runner.pipeline.aclose()
        if self.recipe.config.sandbox == "docker":
            from factory.sandbox import drain_docker_pool

            with contextlib.suppress(Exception):
                await asyncio.to_thread(drain_docker_pool, CLOSE_TIMEOUT_S - 5.0)
        with sandbox_owner(self.recipe.run_id):  # its sandboxes are closed: the folder is empty
            shutil.rmtree(sandbox_folder(), ignore_errors=True)


def _check_node(sandbox: str, images: list[str | None], replay: str | None) -> dict[str, Any]:
    """What a node has: factory's version, and whether it can start the run's sandboxes and read its replay file."""
    problems = []
    if sandbox != "none":
        try:
            backend = SANDBOXES.get(sandbox)
            backend.preflight(images)

            async def start_one() -> None:
                async with create_sandbox(sandbox, SandboxSpec()):
                    pass

            with sandbox_owner("node-check"):
                asyncio.run(start_one())
            if sandbox == "docker":  # no container started ahead outlives the check in this idle worker
                from factory.sandbox import drain_docker_pool

                drain_docker_pool()
        except Exception as exc:
            problems.append(f"sandbox {sandbox} cannot start there: {type(exc).__name__}: {exc}")
    if replay is not None and not os.access(replay, os.R_OK):
        problems.append(f"the replay file {replay} is not readable there")
    return {"version": package_version(), "python": platform.python_version(), "host": socket.gethostname(),
            "problems": problems}


class RayBackend(ExecutionBackend):
    """Branches on a Ray cluster (:mod:`factory.rollouts._ray`)."""

    name = "ray"

    def __init__(self, options: BackendOptions | None = None) -> None:
        super().__init__(options)
        self._host: Any = None
        self._host_cpus = 0.0  # what the model host holds of the cluster's CPUs
        self._budget: ClusterBudget | None = None  # the run's judge budget, shared by every worker
        self._workers: list[Any] = []
        self._where: dict[int, tuple[str, int]] = {}  # worker -> (node, pid), once it is up
        self._connected = False  # this backend's ray.init made the session (it ends it)

    # ------------------------------------------------------------ cluster

    def _connect(self) -> None:
        """Join (or start) the cluster, unless this process is connected already (then that session is used)."""
        if ray.is_initialized():
            return
        # Never report usage anywhere; a local cluster this starts listens on this host only.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            ray.init(address=self.options.address, log_to_driver=False, logging_level=logging.WARNING,
                     namespace="factory")
            self._connected = True
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.options.address or "a local cluster"
            raise ConfigError(f"--backend ray: cannot start or join {where}: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.options.address or "local", "workers": self.options.workers}

    def model(self, spec: str) -> ChatModel:
        """An in-process engine is loaded once, in a ``ModelHost`` actor; anything else is a client here too.

        Raises:
            FactoryError: The engine cannot load (its own error, as :func:`create_model` raises it here).
        """
        if spec.partition(":")[0] not in CHILD_ENGINES:
            return create_model(spec, self.options.model_options)
        self._connect()
        threads = self.options.model_options.threads or 1
        self._host_cpus = min(threads, self._cpus())
        self._host = ray.remote(ModelHost).options(
            num_cpus=self._host_cpus, max_concurrency=1024).remote(spec, self.options.model_options)
        try:  # loaded before the run is written, as create_model loads it for ``local``
            info = ray.get(self._host.describe.remote(), timeout=MODEL_LOAD_TIMEOUT_S)
        except RayTaskError as exc:
            cause = exc.cause
            raise cause if isinstance(cause, FactoryError) else ConfigError(
                f"{spec}: the model host failed: {type(cause).__name__}: {cause}") from None
        except (RayActorError, GetTimeoutError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{spec}: the model host did not start: {message}") from None
        return _ActorModel(self._host, info["spec"])

    def model_host(self) -> dict[str, Any] | None:
        """Where the in-process engine runs and the calls it served (``ModelHost.describe``); None without one."""
        if self._host is None:
            return None
        return ray.get(self._host.describe.remote(), timeout=60.0)

    def _cpus(self) -> float:
        return float(ray.cluster_resources().get("CPU", 1.0))

    async def preflight(self, runner: RolloutForkRunner, tasks: Sequence[Task]) -> None:
        """Every live node runs this factory version and can start the run's sandboxes; else a line naming it."""
        self._connect()
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        spec = runner.model.spec
        replay = str(Path(spec[len("replay:"):]).resolve()) if spec.startswith("replay:") else None
        images = sorted({task.image for task in tasks}, key=str)
        check = ray.remote(_check_node)
        probes = {node["NodeID"]: check.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(runner.config.sandbox, images, replay) for node in nodes}
        here = package_version()
        for node in nodes:
            name = f"ray node {node.get('NodeManagerAddress')} ({node.get('NodeManagerHostname')})"
            try:
                found = await asyncio.to_thread(ray.get, probes[node["NodeID"]], timeout=NODE_CHECK_TIMEOUT_S)
            except GetTimeoutError:
                raise ConfigError(f"{name}: did not answer the node check in {NODE_CHECK_TIMEOUT_S:.0f}s") from None
            except RayError as exc:
                raise ConfigError(f"{name}: cannot run factory's worker code (is factory {here} installed "
                                  f"there?): {str(exc).strip().splitlines()[-1]}") from None
            if found["version"] != here:
                raise ConfigError(f"{name}: factory {found['version']} is installed there, {here} here: "
                                  "install the same version on every node")
            if found["problems"]:
                raise ConfigError(f"{name}: {'; '.join(found['problems'])}")

    # ------------------------------------------------------------ running

    def _start_workers(self, runner: RolloutForkRunner) -> list[Any]:
        cpus = max(0.0, self._cpus() - self._host_cpus)  # the model host's CPUs are not the workers'
        count = self.options.workers or max(1, int(cpus))
        recipe = _Recipe(run_id=runner.run_id, config=runner.config, model_spec=runner.model.spec,
                         model_options=self.options.model_options, model_host=self._host,
                         pipeline=self.options.pipeline,
                         concurrency=math.ceil(runner.config.concurrency / count),
                         judge_budget=self._share_judge_budget(runner))
        actor = ray.remote(BranchWorker).options(
            num_cpus=min(1.0, cpus / count), max_concurrency=recipe.concurrency + 2,  # + where() and close()
            max_restarts=WORKER_RESTARTS, max_task_retries=WORKER_RESTARTS, scheduling_strategy="SPREAD")
        return [actor.remote(recipe) for _ in range(count)]

    def _share_judge_budget(self, runner: RolloutForkRunner) -> ClusterBudget | None:
        """One judge budget for the run, in an actor, if the run's pipeline has one (the driver's reads it too)."""
        holders = _judge_budgets(runner.pipeline)
        if not holders:
            return None
        if self._budget is None:
            cap = holders[0].budget.max_judge_calls_per_batch
            host = ray.remote(BudgetHost).options(num_cpus=0).remote(cap)
            self._budget = ClusterBudget(host, cap)
        _share_budget(runner.pipeline, self._budget)  # the summary counts the cluster's refusals
        return self._budget

    async def run_branches(self, runner: RolloutForkRunner, jobs: Sequence[BranchJob],
                      emit: Callable[[BranchResult], None], stopped: Callable[[], bool]) -> None:
        if not jobs:
            return
        self._connect()
        self._workers = workers = self._start_workers(runner)
        self._where = {}
        # A worker gets branches once it is up (process started, its node's sweep done): on a busy
        # cluster some start tens of seconds after others, and branches queued on them would wait.
        starting = {worker.where.remote(): index for index, worker in enumerate(workers)}
        live = set(range(len(workers)))  # not known dead
        load = [0] * len(workers)
        pending: deque[tuple[BranchJob, int]] = deque((job, 0) for job in jobs)  # (job, times resubmitted)
        inflight: dict[Any, tuple[BranchJob, int, int]] = {}  # ref -> (job, resubmitted, worker)
        limit = runner.config.concurrency
        try:
            while inflight or (pending and not stopped()):
                up = [index for index in live if index in self._where]
                while up and pending and not stopped() and len(inflight) < limit:
                    job, again = pending.popleft()
                    worker = min(up, key=load.__getitem__)  # the least busy: Ray queues the rest on it
                    inflight[workers[worker].run.remote(job)] = (job, again, worker)
                    load[worker] += 1
                for ref, outcome in await asyncio.to_thread(_finished, [*inflight, *starting]):
                    if ref in starting:
                        index = starting.pop(ref)
                        if isinstance(outcome, BaseException):  # it could not start: Ray's restarts spent
                            live.discard(index)
                        else:
                            self._where[index] = outcome
                        continue
                    job, again, worker = inflight.pop(ref)
                    load[worker] -= 1
                    if isinstance(outcome, BaseException):
                        if isinstance(outcome, (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError)):
                            if isinstance(outcome, ActorDiedError):  # restarts spent: gone for good
                                live.discard(worker)
                            if again < RESUBMITS and live:
                                pending.appendleft((job, again + 1))
                                continue
                        outcome = _infra_error(runner, job, outcome)
                    self.node_counts[outcome.node or "unknown"] += 1
                    emit(outcome)
                if not live and pending:
                    raise RunError(f"every Ray worker of run {runner.run_id} died; {len(pending)} branch(es) "
                                   f"not run: resume with: factory fork --resume {runner.run_id}")
        finally:
            for ref in inflight:  # stopping early: a branch in flight closes its sandbox as it is cancelled
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            await self._stop_workers()

    async def _stop_workers(self) -> None:
        workers, where, self._workers, self._where = self._workers, self._where, [], {}
        # Only a worker that is up closes itself; one never started (no CPU free for it) has nothing
        # to close and would hold the wait to its timeout.
        closing = [workers[index].close.remote() for index in where if index < len(workers)]
        if closing:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ray.wait, closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT_S)
        for worker in workers:  # one that did not end by itself
            with contextlib.suppress(Exception):
                ray.kill(worker, no_restart=True)

    def worker_processes(self) -> list[tuple[str, int]]:
        """(node, pid) of each worker of the run in progress that is up (for tests and diagnostics)."""
        return [self._where[index] for index in sorted(self._where)]

    async def aclose(self) -> None:
        await self._stop_workers()
        if self._budget is not None:
            budget, self._budget = self._budget, None
            await asyncio.to_thread(budget.freeze)
            with contextlib.suppress(Exception):
                ray.kill(budget.host, no_restart=True)
        if self._host is not None:
            host, self._host = self._host, None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ray.get, host.aclose.remote(), timeout=30.0)
            with contextlib.suppress(Exception):
                ray.kill(host, no_restart=True)
        if self._connected and ray.is_initialized():
            # A cluster this started ends with it; a joined one carries on. A session the caller opened
            # (ray.init before the fork) is the caller's, and stays.
            self._connected = False
            ray.shutdown()


def _finished(refs: list[Any]) -> list[tuple[Any, Any]]:
    """Refs that are done (waiting up to half a second for the first), each with its result or its error."""
    if not refs:
        return []
    ready, rest = ray.wait(refs, num_returns=1, timeout=0.5)
    if ready and rest:
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
        ready += more
    done = []
    for ref in ready:
        try:
            done.append((ref, ray.get(ref)))
        except RayError as exc:
            done.append((ref, exc))
    return done


def _infra_error(runner: RolloutForkRunner, job: BranchJob, exc: BaseException) -> BranchResult:
    """A branch that could not run on the cluster: the infrastructure's failure, recorded, never the agent's."""
    from factory.rollouts._agent import BranchStatus
    from factory.rollouts._runner import BranchResult

    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    now = utc_now()
    rollout_id = runner.rollout_id(job.task.id)
    return BranchResult(
        run_id=runner.run_id, task_id=job.task.id, branch_index=job.index, rollout_id=rollout_id,
        session_id=f"{rollout_id}-b{job.index}-{uuid.uuid4().hex[:12]}", temperature=job.temperature,
        seed=job.seed, model=runner.model.spec, status=BranchStatus.INFRA_ERROR, final_answer=None,
        trajectory=runner.agent.opening(job.task, job.primer), tool_call_sequence=[], usage=Usage(),
        started_at=now, finished_at=now, error=f"{type(exc).__name__}: {message}",
        events=[ErrorEvent(seq=0, ts=now, type=type(exc).__name__, message=message)])
