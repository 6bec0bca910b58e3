"""Command-line interface (``factory``).

Besides :func:`main`, the shared options and printers are public so that a
plugin command looks and behaves like the built-in ones.
"""

from factory.cli._lazy import LazyGroup
from factory.cli._main import COMMANDS, main
from factory.cli._options import db_option, dump_json, json_option, memory_backend_option, render_frame, resolve_db

__all__ = ["COMMANDS", "LazyGroup", "db_option", "dump_json", "json_option", "main", "memory_backend_option",
           "render_frame", "resolve_db"]
