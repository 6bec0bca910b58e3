"""``factory memory``: add a run's winners, search, stats, reindex, clear."""

from __future__ import annotations

from pathlib import Path

import click

from factory.cli._options import db_option, dump_json, json_option, memory_backend_option, resolve_db

__all__ = ["memory"]

_embedder_option = click.option("--embedder", default=None,
                                help="minilm (default when installed) or hashing; must match the stored memories.")


def _open(store, embedder: str | None, backend_spec: str | None):
    from factory.memory import RolloutMemoryStore, create_embedder, create_memory_backend

    backend = create_memory_backend(backend_spec, store)
    if embedder is None and backend.count():  # use what the memory already holds
        embedder = sorted(backend.spaces())[0][0]
    return RolloutMemoryStore(backend, create_embedder(embedder), store=store)


@click.group()
def memory() -> None:
    """The memory of winning branches that primes later runs (fork --memory)."""


@memory.command()
@click.argument("run_id")
@db_option
@_embedder_option
@memory_backend_option
@json_option
def add(run_id: str, db: Path | None, embedder: str | None, backend_spec: str | None, as_json: bool) -> None:
    """Store RUN_ID's clean winners (objective score 1, no hack); count the rest."""
    from factory.errors import ConfigError
    from factory.memory import candidates_from_run
    from factory.store import Store

    with Store.open(resolve_db(db), create=False) as store:
        if store.run(run_id) is None:
            raise ConfigError(f"no run {run_id} in {store.path}")
        mem = _open(store, embedder, backend_spec)
        report = mem.upsert(candidates_from_run(store, run_id))
        stats = mem.stats()
    data = {"run_id": run_id, "stored": report.stored, "duplicates": report.duplicates,
            "discarded": report.discarded, "reasons": report.reasons, **stats}
    if as_json:
        click.echo(dump_json(data))
    else:
        click.echo(f"stored {report.stored} winner(s) of {run_id}, {report.duplicates} duplicate(s), "
                   f"{report.discarded} discarded {report.reasons or ''}; {stats['memories']} memories in total")


@memory.command()
@click.argument("text")
@click.option("-k", "k", type=click.IntRange(min=1), default=3, show_default=True, help="How many memories.")
@db_option
@_embedder_option
@memory_backend_option
@json_option
def search(text: str, k: int, db: Path | None, embedder: str | None, backend_spec: str | None,
           as_json: bool) -> None:
    """Show the k memories most similar to TEXT."""
    from factory.store import Store

    with Store.open(resolve_db(db), read_only=True) as store:
        found = _open(store, embedder, backend_spec).retrieve(text, k)
    if as_json:
        click.echo(dump_json([vars(m) for m in found]))
        return
    if not found:
        click.echo("no memories")
    for m in found:
        click.echo(f"{m.similarity:.3f}  {m.task_id} (run {m.run_id}, b{m.branch_index})  "
                   f"{' '.join((m.final_answer or '').split())[:80]}")


@memory.command()
@db_option
@memory_backend_option
@json_option
def stats(db: Path | None, backend_spec: str | None, as_json: bool) -> None:
    """Memories stored, discards by reason, embedders."""
    from factory.memory import HashingEmbedder, RolloutMemoryStore, create_memory_backend
    from factory.store import Store

    with Store.open(resolve_db(db), read_only=True) as store:
        # stats embed nothing: any embedder will do
        data = RolloutMemoryStore(create_memory_backend(backend_spec, store), HashingEmbedder(), store=store).stats()
    if as_json:
        click.echo(dump_json(data))
    else:
        click.echo(f"{data['memories']} memories ({', '.join(data['embedders']) or 'none'}); "
                   f"{data['discarded']} discarded {data['discards'] or ''}")


@memory.command()
@db_option
@json_option
def reindex(db: Path | None, as_json: bool) -> None:
    """Rebuild the ANN index of the store's memories (the memory-ann extra) and write it beside the store.

    Searches build or catch up the index by themselves from 100,000 memories
    on; this rebuilds it now, from any size (after changing faiss, or to pay
    the build before a run rather than on its first search).
    """
    from factory.memory import DuckDBMemoryBackend
    from factory.store import Store

    with Store.open(resolve_db(db), create=False) as store:
        data = DuckDBMemoryBackend(store).reindex()
    if as_json:
        click.echo(dump_json(data))
        return
    if not data["indexes"]:
        click.echo("no memories: nothing to index")
    for built in data["indexes"]:
        click.echo(f"indexed {built['memories']} memories ({built['embedder']}, dim {built['dim']}) "
                   f"-> {built['path']}{'' if built['saved'] else ' (not written: see the warning)'}")


@memory.command()
@db_option
@memory_backend_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(db: Path | None, backend_spec: str | None, yes: bool) -> None:
    """Delete every memory (and the discard counts)."""
    from factory.memory import create_memory_backend
    from factory.store import Store

    if not yes:
        click.confirm("delete every memory?", abort=True)
    with Store.open(resolve_db(db), create=False) as store:
        removed = create_memory_backend(backend_spec, store).clear()
        store.clear_memory_discards()
    click.echo(f"deleted {removed} memories")
