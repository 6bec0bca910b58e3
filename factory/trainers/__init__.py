"""Trainers: TRL-based training on exported data."""

__all__: list[str] = []
