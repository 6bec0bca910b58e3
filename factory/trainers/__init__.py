"""Trainers: TRL-based training on exported data.

Importing this package stays light: torch, transformers and TRL are imported inside the functions that use them.
"""

from factory.trainers._tiny import CHAT_TEMPLATE, build_tiny_model

__all__ = ["CHAT_TEMPLATE", "build_tiny_model"]
