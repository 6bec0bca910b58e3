"""Execution backends: where a fork's branches run (``factory fork --backend``).

The runner owns everything that keeps data (the plan, the store, the flush
loop, the exactly-once bookkeeping); a backend only runs branches and hands
each finished one back through ``emit``. ``local`` runs them on this
process's event loop; ``ray`` (:mod:`factory.rollouts._ray`) runs them on the
workers of a Ray cluster and streams them back to this process, which stays
the only writer of the store. Backends register by name in :data:`BACKENDS`;
the name and :meth:`ExecutionBackend.describe` are recorded in the run's
manifest (not in its config hash: where a branch ran does not change it).
"""

from __future__ import annotations

import abc
import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from factory.models import ChatModel, ModelOptions, create_model
from factory.registry import Registry
from factory.tasks import Task

if TYPE_CHECKING:
    from factory.rollouts._runner import BranchResult, RolloutForkRunner
    from factory.verifiers import VerificationPipeline

__all__ = ["BACKENDS", "BackendOptions", "BranchJob", "ExecutionBackend", "LocalBackend", "create_backend"]


@dataclass(frozen=True)
class BranchJob:
    """One branch to run: its task, index, sampling and memory primer."""

    task: Task
    index: int
    temperature: float
    seed: int
    primer: str | None = None


@dataclass(frozen=True)
class BackendOptions:
    """What a backend may need to rebuild the run's parts where its branches run.

    Attributes:
        address: Where the cluster is (``ray``: a ``HOST:PORT`` or ``ray://`` address; None: start or join
            a local one). ``local`` takes none.
        model_options: The provider settings the policy was made with (workers make their own client).
        pipeline: Builds the verification pipeline on a worker (None: no verification); a picklable callable.
        workers: Worker processes to run branches in (``ray``; None: one per CPU of the cluster).
    """

    address: str | None = None
    model_options: ModelOptions = field(default_factory=ModelOptions)
    pipeline: Callable[[], VerificationPipeline] | None = None
    workers: int | None = None


class ExecutionBackend(abc.ABC):
    """Runs a fork's branches; the runner stores them.

    Attributes:
        name: The registered name (``--backend``).
        node_counts: Branches finished per node in this process's run (``local``: this host).
    """

    name: str = ""

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self.node_counts: Counter[str] = Counter()

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about where the run ran."""
        return {"name": self.name}

    def model(self, spec: str) -> ChatModel:
        """The policy the driver holds for ``spec`` (its spec, preflight and close; ``local`` also runs it)."""
        return create_model(spec, self.options.model_options)

    async def preflight(self, runner: RolloutForkRunner, tasks: Sequence[Task]) -> None:
        """Check, before the run writes anything, that branches can run where this backend runs them.

        Raises:
            FactoryError: They cannot; the message names the place and the cause.
        """
        return None

    @abc.abstractmethod
    async def run_branches(self, runner: RolloutForkRunner, jobs: Sequence[BranchJob],
                      emit: Callable[[BranchResult], None], stopped: Callable[[], bool]) -> None:
        """Run ``jobs``, calling ``emit`` once with each finished branch, in finishing order.

        Every job is emitted exactly once unless the run stops: ``stopped()``
        turns true (the provider is gone) and no new branch may start, or the
        call is cancelled (Ctrl-C, the caller closing its iterator). A
        branch's infrastructure failure is emitted as an ``infra_error``
        branch, never as the agent's.

        Args:
            runner: The run (its config, run id and :meth:`RolloutForkRunner.run_branch`).
            jobs: The branches to run.
            emit: Hands a finished branch to the runner (which stores it); never blocks.
            stopped: True once no new branch may start.
        """

    async def aclose(self) -> None:
        """Release what the backend holds (a cluster connection, worker processes)."""
        return None


#: Execution backends by name (``--backend``); an entry builds one from :class:`BackendOptions`.
BACKENDS: Registry[Callable[[BackendOptions], ExecutionBackend]] = Registry("execution backend")


def create_backend(name: str, options: BackendOptions | None = None) -> ExecutionBackend:
    """The backend registered as ``name``.

    Raises:
        ConfigError: No backend has that name (the message lists those there are).
    """
    return BACKENDS.get(name)(options or BackendOptions())


@BACKENDS.register("local")
class LocalBackend(ExecutionBackend):
    """Branches on this process's event loop: ``config.concurrency`` workers take jobs from one queue."""

    name = "local"

    async def run_branches(self, runner: RolloutForkRunner, jobs: Sequence[BranchJob],
                      emit: Callable[[BranchResult], None], stopped: Callable[[], bool]) -> None:
        todo = iter(jobs)  # one event loop: taking the next job needs no lock
        host = "local"

        async def worker() -> None:
            while not stopped():
                job = next(todo, None)
                if job is None:
                    return
                result = await runner.run_branch(job)
                self.node_counts[host] += 1
                emit(result)

        workers = [asyncio.create_task(worker()) for _ in range(min(runner.config.concurrency, len(jobs)))]
        try:
            # A worker's unexpected exception ends that worker only; its branch is run again on resume.
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)


@BACKENDS.register("ray")
def _ray_backend(options: BackendOptions) -> ExecutionBackend:
    """``ray``, imported only when chosen (the ``ray`` extra)."""
    from factory.rollouts._ray import RayBackend

    return RayBackend(options)
