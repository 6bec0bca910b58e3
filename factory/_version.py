"""The package version, kept in one place (read by pyproject at build time)."""

__version__ = "0.1.0"
