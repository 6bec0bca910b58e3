"""Rollouts: the fork runner, agent loop, tools, models and sandbox backends."""

__all__: list[str] = []
