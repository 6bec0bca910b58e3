"""Rollouts: the agent loop, its tools, the fork runner and where it runs branches (execution backends)."""

from factory.rollouts._agent import AgentConfig, BranchStatus, ToolCallingAgent
from factory.rollouts._backend import (
    BACKENDS,
    BackendOptions,
    BranchJob,
    ExecutionBackend,
    LocalBackend,
    create_backend,
)
from factory.rollouts._ray_cluster import LocalRayCluster
from factory.rollouts._report import fork_summary
from factory.rollouts._runner import BranchPrimer, ForkConfig, RolloutForkRunner, StoredRun, branch_sampling
from factory.rollouts._tools import AGENT_TOOLS, ToolOutcome, execute_tool

__all__ = [
    "AGENT_TOOLS",
    "BACKENDS",
    "AgentConfig",
    "BackendOptions",
    "BranchJob",
    "BranchPrimer",
    "BranchStatus",
    "ExecutionBackend",
    "ForkConfig",
    "LocalBackend",
    "LocalRayCluster",
    "RolloutForkRunner",
    "StoredRun",
    "ToolCallingAgent",
    "ToolOutcome",
    "branch_sampling",
    "create_backend",
    "execute_tool",
    "fork_summary",
]
