"""Rollouts: the agent loop, its tools, and the fork runner."""

from factory.rollouts._agent import AgentConfig, BranchStatus, ToolCallingAgent
from factory.rollouts._report import fork_summary
from factory.rollouts._runner import BranchPrimer, ForkConfig, RolloutForkRunner, StoredRun, branch_sampling
from factory.rollouts._tools import AGENT_TOOLS, ToolOutcome, execute_tool

__all__ = [
    "AGENT_TOOLS",
    "AgentConfig",
    "BranchPrimer",
    "BranchStatus",
    "ForkConfig",
    "RolloutForkRunner",
    "StoredRun",
    "ToolCallingAgent",
    "ToolOutcome",
    "branch_sampling",
    "execute_tool",
    "fork_summary",
]
