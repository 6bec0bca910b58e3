"""Command-line interface (``factory``).

:func:`main` is the ``factory`` console script; :data:`COMMANDS` maps each
command to the module that defines it, imported only when the command runs.
The shared options and printers stay private to the commands.
"""

from factory.cli._main import COMMANDS, main

__all__ = ["COMMANDS", "main"]
