"""Verifiers: objective checks and the k-of-N LLM judge, composed into a pipeline."""

__all__: list[str] = []
