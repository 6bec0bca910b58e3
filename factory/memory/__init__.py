"""Memory: winning branches, embedded and retrieved to prime later runs."""

__all__: list[str] = []
