"""A click group whose subcommands are imported only when used.

``factory --help`` lists every command with its short help, which click reads
from each command object, so command modules must stay cheap to import: heavy
libraries (torch, trl, vllm, ray, llama_cpp) are imported inside the command
functions that need them.
"""

from __future__ import annotations

import importlib

import click

from factory.errors import FactoryError
from factory.outputs import disk_full

__all__ = ["LazyGroup"]


class LazyGroup(click.Group):
    """A group mapping command names to ``"module:attribute"`` strings.

    It also turns :class:`FactoryError` into a one-line message on stderr and
    the error's exit code: a user error never prints a traceback. A bad
    option or argument (click's usage error) is one such line too, naming the
    option, with exit code 2.
    """

    def __init__(self, *args: object, lazy_subcommands: dict[str, str] | None = None, **kwargs: object):
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            module_name, attribute = self.lazy_subcommands[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{module_name}:{attribute} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except FactoryError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except click.exceptions.NoArgsIsHelpError:
            raise  # a group named alone: click shows its help
        except click.UsageError as exc:
            where = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            click.echo(f"error: {exc.format_message()}{where}", err=True)
            ctx.exit(exc.exit_code)
        except Exception as exc:
            # A full disk where no writer of ours said so (a library writing on its own): still one line.
            why = disk_full(exc)
            if why is None:
                raise
            path = getattr(exc, "filename", None)
            click.echo(f"error: {ctx.invoked_subcommand or ctx.info_name}: {why}"
                       + (f" writing {path}" if path else "") + " (free some space and run it again)", err=True)
            ctx.exit(1)
