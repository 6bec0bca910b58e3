"""Ranking: Bradley-Terry strengths with Wilson / McNemar power checks."""

__all__: list[str] = []
