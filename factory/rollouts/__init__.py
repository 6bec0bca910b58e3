"""Rollouts: the agent loop, its tools, and the fork runner."""

from factory.rollouts._agent import AgentConfig, AgentResult, BranchStatus, ToolCallingAgent, answer_only
from factory.rollouts._report import fork_summary
from factory.rollouts._runner import BranchResult, ForkConfig, RolloutForkRunner, branch_sampling, new_run_id
from factory.rollouts._tools import AGENT_TOOLS, ToolOutcome, execute_tool

__all__ = [
    "AGENT_TOOLS",
    "AgentConfig",
    "AgentResult",
    "BranchResult",
    "BranchStatus",
    "ForkConfig",
    "RolloutForkRunner",
    "ToolCallingAgent",
    "ToolOutcome",
    "answer_only",
    "branch_sampling",
    "execute_tool",
    "fork_summary",
    "new_run_id",
]
