"""Rollouts: the fork runner, agent loop, tools, output summarizer, models and sandboxes."""

from factory.rollouts._agent import AgentConfig, AgentResult, BranchStatus, ToolCallingAgent, answer_only
from factory.rollouts._report import fork_summary
from factory.rollouts._runner import BranchResult, ForkConfig, RolloutForkRunner, branch_sampling, new_run_id
from factory.rollouts._summarize import summarize_tool_output
from factory.rollouts._tools import AGENT_TOOLS, ToolOutcome, execute_tool
from factory.rollouts._workspace import snapshot_workspace, workspace_spec

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
    "snapshot_workspace",
    "summarize_tool_output",
    "workspace_spec",
]
