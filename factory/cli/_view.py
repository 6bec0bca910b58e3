"""``factory view``: browse the store in a web browser, or write a static copy to share."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import db_option, resolve_db

__all__ = ["view"]


@click.command()
@db_option
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="TCP port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Loopback by default; any other address exposes the store to the "
                   "network and must be given explicitly.")
@click.option("--bundle", "bundle", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Write a static site (HTML + data files) to this folder instead of serving; it opens from "
                   "file:// with no server. An existing folder is replaced only if it is an earlier bundle.")
def view(db: Path | None, port: int, host: str, bundle: Path | None) -> None:
    """Browse runs in a web browser: read-only, paged, on loopback unless --host says otherwise.

    \b
    Views: runs (filters, pass rates with Wilson intervals, infrastructure
    failures and boundary-limited branches counted apart, cost), a run's
    task x branch grid coloured by verdict with hacks marked, a task's
    branches side by side (trajectory, verdict details, rank, reward,
    strength), a diff of two branches' final workspaces, the stored ranking,
    and search over final answers and tool outputs. Every view has a link
    (#/run/R/task/T/branch/B); j/k move, Enter opens, u goes up, / searches.
    The store is opened read-only. Needs the `view` extra (starlette,
    uvicorn) to serve; --bundle needs neither.
    """
    from factory.errors import ConfigError
    from factory.store import Store
    from factory.view import ViewData, is_loopback, serve, write_bundle

    path = resolve_db(db)
    if bundle is not None:
        with Store.open(path, read_only=True) as store:
            written = write_bundle(ViewData(store), bundle)
        click.echo(f"wrote {bundle}: {written['answers']} data files, {written['bytes'] / 1e6:.1f} MB, "
                   f"{written['images']} plot(s); "
                   f"open {bundle.resolve() / 'index.html'} in a browser (file:// works, no server)")
        return
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"factory view needs the `view` extra ({exc.name} is missing): "
                          "pip install 'factory-rlaif[view]' (or write a static copy with --bundle DIR)") from None
    # opened now to fail early on a missing or unreadable store, then per burst of requests (a fork may be writing)
    Store.open(path, read_only=True).close()
    if not is_loopback(host):
        click.echo(f"warning: listening on {host}: anyone who can reach it can read this store", err=True)
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    click.echo(f"factory view: http://{shown}:{port}/  (store {path}, read-only; Ctrl-C stops)")
    serve(ViewData(path=path), host=host, port=port)
