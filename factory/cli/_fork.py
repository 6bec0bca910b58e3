"""``factory fork``: sample N branches per task, each an agent run in its own sandbox."""

from __future__ import annotations

import asyncio
import functools
import math
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import click

from factory.cli._options import (
    FiniteFloat,
    base_url_option,
    db_option,
    dump_json,
    json_option,
    memory_backend_option,
    request_timeout_option,
    resolve_db,
    warnings_shown,
)

__all__ = ["fork", "parse_temperatures"]


def parse_temperatures(text: str | None, branches: int) -> tuple[float, ...] | None:
    """``0.5,0.7,0.9`` (a list, cycled) or ``0.5:0.9`` (evenly spread over the branches).

    Raises:
        ConfigError: Not a list or range of finite numbers >= 0, or more of them than branches.
    """
    from factory.errors import ConfigError

    if not text:
        return None
    spread = ":" in text
    try:
        if spread:
            low, high = (float(part) for part in text.split(":"))
            values: tuple[float, ...] = (low, high)
        else:
            values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(
            f"--temperatures: expected a list like 0.5,0.7 or a range like 0.5:0.9, got {text!r}") from None
    if not values or not all(math.isfinite(t) and t >= 0 for t in values):
        raise ConfigError(f"--temperatures: each temperature must be a finite number >= 0, got {text!r}")
    if spread:
        if branches == 1:
            return (low,)
        return tuple(round(low + (high - low) * b / (branches - 1), 6) for b in range(branches))
    if len(values) > branches:
        raise ConfigError(f"--temperatures: {len(values)} temperatures for {branches} branch(es) (--branches)")
    return values


@click.command()
@click.argument("tasks_file", metavar="TASKS", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--branches", "-n", type=click.IntRange(min=1), default=4, show_default=True, help="Branches per task.")
@click.option("--model", "model_spec", default=None,
              help="Policy: local (default), local:FILE.gguf, hf:DIR, openai:MODEL, anthropic:MODEL, vllm:PATH, "
                   "replay:FILE; with --resume, the run's own model.")
@base_url_option
@request_timeout_option
@click.option("--sandbox", default=None, help="Sandbox backend: bwrap (default on Linux), docker, none.")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=8, show_default=True,
              help="Branches running at once.")
@click.option("--backend", "backend_name", default=None,
              help="Where branches run: local (this process, the default) or ray (a Ray cluster's workers; the "
                   "ray extra); with --resume, the run's own.")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="With --backend ray: the cluster (HOST:PORT of its head, or ray://HOST:10001) [default: "
                   "RAY_ADDRESS, else join or start a cluster on this host].")
@click.option("--ray-workers", type=click.IntRange(min=1), default=None,
              help="With --backend ray: worker processes [default: one per CPU of the cluster].")
@click.option("--temperatures", default=None, help="Per-branch temperatures: 0.5,0.6,0.7,0.8 or a range 0.5:0.9.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed; branch b uses seed + b.")
@click.option("--max-turns", type=click.IntRange(min=1), default=8, show_default=True, help="Model calls per branch.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=512, show_default=True, help="Tokens per model call.")
@click.option("--timeout", "command_timeout", type=FiniteFloat(min=0, min_open=True), default=60.0, show_default=True,
              help="Wall-clock seconds per sandbox command.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for in-process models (local, hf).")
@click.option("--no-verify", is_flag=True, help="Do not run verifiers as branches finish.")
@click.option("--memory", "use_memory", is_flag=True,
              help="Prime branches with similar past winners, and store this run's winners afterwards.")
@click.option("--memory-k", type=click.IntRange(min=1), default=3, show_default=True,
              help="Memories retrieved per task (with --memory).")
@click.option("--embedder", default=None, help="Memory embedder: minilm (default when installed) or hashing.")
@memory_backend_option
@click.option("--judge", "judge_spec", default=None,
              help="LLM judge model for tasks with a rubric (a different model from the policy).")
@click.option("--judge-samples", type=click.IntRange(min=1), default=3, show_default=True,
              help="Independent judge samples per branch (median aggregated).")
@click.option("--planner", "planner_spec", default=None,
              help="Planner model of the browser verifier (front-end tasks) [default: the judge].")
@click.option("--hack-penalty", type=FiniteFloat(0, 1), default=0.4, show_default=True,
              help="Subtracted from the tests score when tampering is detected (floored at 0).")
@click.option("--judge-budget", type=click.IntRange(min=0), default=None,
              help="Cap on judge calls in this run; samples past it score a neutral 5 (budget_exhausted).")
@db_option
@click.option("--run-id", default=None, help="Id for a new run [default: generated].")
@click.option("--resume", "resume_id", default=None, metavar="RUN_ID",
              help="Run only the unfinished branches of RUN_ID.")
@click.option("--retry-errors", is_flag=True, help="With --resume, also re-run branches that ended in error.")
@click.option("--record", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Append every model response to FILE (replay it with --model replay:FILE).")
@json_option
def fork(tasks_file: Path | None, branches: int, model_spec: str | None, base_url: str | None,
         request_timeout_s: float, sandbox: str | None, concurrency: int, temperatures: str | None, seed: int,
         max_turns: int, max_tokens: int,
         command_timeout: float, threads: int | None, no_verify: bool, use_memory: bool, memory_k: int,
         embedder: str | None, backend_spec: str | None, judge_spec: str | None,
         judge_samples: int, planner_spec: str | None, hack_penalty: float, judge_budget: int | None, db: Path | None,
         backend_name: str | None, ray_address: str | None, ray_workers: int | None,
         run_id: str | None, resume_id: str | None, retry_errors: bool, record: Path | None, as_json: bool) -> None:
    """Sample N branches per task from TASKS, each an agent run in its own sandbox.

    Every branch and its events are stored in the DuckDB file as they finish.
    Ctrl-C stops cleanly, keeping what finished; --resume RUN_ID continues.
    """
    from factory.errors import ConfigError, OutputSpaceError, RunAbortedError
    from factory.models import (
        AdaptiveLimiter,
        CircuitBreaker,
        ModelOptions,
        RecordingModel,
        ResilientModel,
    )
    from factory.outputs import refuse_protected
    from factory.rollouts import (
        AgentConfig,
        BackendOptions,
        ForkConfig,
        RolloutForkRunner,
        StoredRun,
        create_backend,
        fork_summary,
    )
    from factory.sandbox import NoSandboxWarning, SandboxLimits, default_sandbox_name, sandbox_names
    from factory.store import Store
    from factory.tasks import load_tasks
    from factory.verifiers import JudgeSameAsPolicyWarning, build_pipeline

    if tasks_file is None and resume_id is None:
        raise ConfigError("give a TASKS file, or --resume RUN_ID")
    if run_id and resume_id:
        raise ConfigError("--run-id and --resume are exclusive")
    sandbox = sandbox or default_sandbox_name()
    if sandbox not in sandbox_names():
        raise ConfigError(f"unknown sandbox '{sandbox}' (choose from: {', '.join(sandbox_names())})")
    task_set = load_tasks(tasks_file) if tasks_file is not None else None  # bad files fail before any branch

    err = sys.stderr
    path = resolve_db(db)
    if record is not None:  # appended to as the run goes: never the store or an input
        replayed = model_spec[len("replay:"):] if model_spec and model_spec.startswith("replay:") else None
        refuse_protected(record, {"the store (--db)": path, "the tasks file": tasks_file,
                                  "the replay file (--model)": replayed})
    created = not path.exists()
    store = Store.open(path, create=resume_id is None)  # --resume continues a store that must exist
    try:
        stored = None
        if resume_id is not None:
            stored = StoredRun.load(store, resume_id, concurrency=concurrency)
            config, model_spec = stored.config, model_spec or stored.model
        else:
            config = ForkConfig(
                branches=branches, concurrency=concurrency,
                temperatures=parse_temperatures(temperatures, branches) or (0.7,), base_seed=seed, sandbox=sandbox,
                limits=SandboxLimits(timeout_s=command_timeout),
                agent=AgentConfig(max_turns=max_turns, max_tokens=max_tokens, tool_timeout_s=command_timeout))
            model_spec = model_spec or "local"
        config.sampling()  # validate before starting anything
        if config.sandbox == "none":
            click.secho("WARNING: sandbox 'none' runs model-written code with NO isolation "
                        "(network, host files and processes are reachable).", fg="red", bold=True, err=True)
            warnings.simplefilter("ignore", NoSandboxWarning)

        recorded = stored.backend if stored is not None else {}  # a resume runs where its run ran, unless told
        backend_name = backend_name or recorded.get("name") or "local"
        if record is not None and backend_name != "local":
            raise ConfigError(f"--record works with --backend local only (the {backend_name} backend's "
                              "workers call the model, not this process)")
        if backend_name == "ray" and ray_address is None and recorded.get("address") not in (None, "local"):
            ray_address = recorded["address"]
        recipes: list[functools.partial] = []  # how the pipeline was built: a remote worker builds its own
        build_kept = _keeping_recipe(recipes, build_pipeline)
        options = ModelOptions(base_url=base_url, threads=threads, timeout_s=request_timeout_s)
        backend = create_backend(backend_name, BackendOptions(
            address=ray_address, model_options=options, workers=ray_workers))
        model = backend.model(model_spec)
        if record is not None:
            model = RecordingModel(model, record)
        model = ResilientModel(model, limiter=AdaptiveLimiter(concurrency),
                               breaker=CircuitBreaker(endpoint=base_url or model.spec))
        pipeline = None
        if not no_verify:
            with warnings_shown(JudgeSameAsPolicyWarning):
                pipeline = build_kept(config.sandbox, config.limits, policy_spec=model.spec,
                                          judge_spec=judge_spec, judge_samples=judge_samples,
                                          judge_budget=judge_budget, hack_penalty=hack_penalty,
                                          request_timeout_s=request_timeout_s, planner_spec=planner_spec,
                                          artifact_dir=store.path.with_name(f"{store.path.stem}-artifacts"))
        memory = None
        if use_memory or (stored is not None and config.memory_k):
            from factory.memory import RolloutMemoryStore, create_embedder, create_memory_backend

            recorded = stored.primer if stored is not None else {}  # a resume reopens the run's own memory
            memory = RolloutMemoryStore(create_memory_backend(backend_spec or recorded.get("backend"), store),
                                        create_embedder(embedder or recorded.get("embedder")), store=store)
            if stored is None:
                config = replace(config, memory_k=memory_k)
        backend.options = replace(backend.options, pipeline=recipes[0] if recipes else None)
        runner = RolloutForkRunner(model, store, config, run_id=resume_id or run_id, pipeline=pipeline,
                                   memory=memory, backend=backend)
        if stored is not None:
            tasks = list(task_set) if task_set is not None else stored.tasks
            already = store.branches(runner.run_id).height
            results = runner.resume(tasks, retry_errors=retry_errors)
        else:
            tasks, already = list(task_set or ()), 0
            results = runner.run(tasks, task_file=str(tasks_file))
        started = time.monotonic()
        try:
            asyncio.run(_drive(results, len(tasks) * config.branches, already, model, pipeline, err, backend))
        except RunAbortedError as exc:  # the provider is gone: one line, and how to go on once it is back
            raise RunAbortedError(f"{exc} --db {store.path}", run_id=exc.run_id, cause=exc.cause) from None
        except OutputSpaceError as exc:  # the disk filled mid-run: what was committed stays, and the run goes on
            if store.run(runner.run_id) is None:
                raise
            raise OutputSpaceError(exc.operation, exc.path, exc.detail, remedy=(
                "what was committed is kept; free some space, then: "
                f"factory fork --resume {runner.run_id} --db {store.path}")) from exc
        except KeyboardInterrupt:
            summary = fork_summary(store, runner.run_id, time.monotonic() - started)
            click.echo(f"\ninterrupted: {summary['branches']} branch(es) of run {runner.run_id} are stored. "
                       f"Resume with: factory fork --resume {runner.run_id} --db {store.path}", err=True)
            sys.exit(130)
        summary = fork_summary(store, runner.run_id, time.monotonic() - started)
        if memory is not None:
            from factory.memory import candidates_from_run

            added = memory.upsert(candidates_from_run(store, runner.run_id))
            summary["memory"] = {"stored": added.stored, "duplicates": added.duplicates,
                                 "discarded": added.discarded, **memory.stats()}
        if backend.name != "local":  # where the branches of this invocation ran
            summary["backend"] = backend.name
            summary["nodes"] = dict(sorted(backend.node_counts.items()))
        summary["retries"] = model.retries
        summary["rate_limited"] = model.rate_limited
        budget = getattr(pipeline.verifiers.get("judge"), "budget", None) if pipeline else None
        summary["judge_budget_exhausted"] = getattr(budget, "exhausted", 0)
    except BaseException:
        if created:
            _discard_if_empty(store)
        raise
    finally:
        store.close()
    if as_json:
        click.echo(dump_json(summary))
    else:
        _print_summary(summary)


def _discard_if_empty(store) -> None:
    """Remove a store this command created when it failed before its run began: no empty store is left behind."""
    from factory.errors import FactoryError

    try:
        if store.runs().height:
            return
    except FactoryError:  # unreadable now: keep it, whatever it holds
        return
    store.close()
    for leftover in (store.path, store.path.with_name(store.path.name + ".wal")):
        leftover.unlink(missing_ok=True)


def _keeping_recipe(recipes: list, build):
    """``build``, which also keeps how it was called in ``recipes`` (a ``functools.partial``, picklable)."""
    def call(*args, **kwargs):
        recipes.append(functools.partial(build, *args, **kwargs))
        return recipes[-1]()
    return call


async def _drive(results, total, already, model, pipeline, err, backend) -> None:
    """Run the fork with a progress bar; the models' clients and the backend close in the same event loop."""
    try:
        await _progress(results, total, already, err)
    finally:
        await model.aclose()
        if pipeline is not None:
            await pipeline.aclose()
        await backend.aclose()


async def _progress(results, total: int, already: int, err) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=err)
    columns = [TextColumn("[bold]fork[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("pass {task.fields[passed]}/{task.fields[verified]} · errors {task.fields[errors]} · "
                          "tokens {task.fields[tokens]:,}")]
    with Progress(*columns, console=console, disable=not err.isatty()) as progress:
        bar = progress.add_task("fork", total=total, completed=already, errors=0, tokens=0, passed=0, verified=0)
        errors = tokens = passed = verified = 0
        async for result in results:
            errors += result.status == "error"
            tokens += result.usage.input_tokens + result.usage.output_tokens
            if result.objective_pass is not None:
                verified += 1
                passed += result.objective_pass
            progress.update(bar, advance=1, errors=errors, tokens=tokens, passed=passed, verified=verified)


def _print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {summary['run_id']} · {summary['model']} · sandbox {summary['sandbox']}")
    for column in ("task", "branches", "ok", "max_turns", "errors", "passed", "hacks", "tokens in", "tokens out"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for row in summary["per_task"]:
        table.add_row(row["task_id"], str(row["branches"]), str(row["ok"]), str(row["max_turns"]),
                      str(row["errors"]), f"{row['passed']}/{row['verified']}", str(row["hacks"]),
                      f"{row['input_tokens']:,}", f"{row['output_tokens']:,}")
    table.add_row("[bold]total[/]", str(summary["branches"]), str(summary["ok"]), str(summary["max_turns"]),
                  str(summary["errors"]), f"{summary['passed']}/{summary['verified']}", str(summary["hacks"]),
                  f"{summary['input_tokens']:,}", f"{summary['output_tokens']:,}")
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    cost = f"${summary['cost_usd']:.4f}" if summary.get("cost_usd") is not None else "unknown"
    click.echo(f"{summary['status']} in {summary.get('elapsed_s', 0):.1f}s "
               f"({summary.get('branches_per_s') or 0:.2f} branches/s), cost {cost}, "
               f"retries {summary['retries']}; stored in {summary['db']}")
    if summary.get("nodes"):
        click.echo(f"{summary['backend']}: " + ", ".join(f"{node} {count}" for node, count in summary["nodes"].items())
                   + " branch(es) per node")
    if summary.get("memory"):
        mem = summary["memory"]
        click.echo(f"memory: stored {mem['stored']} winner(s), {mem['duplicates']} duplicate(s), "
                   f"{mem['discarded']} discarded; {mem['memories']} memories in total")
    if summary.get("boundary_limited"):
        tasks = ", ".join(f"{row['task_id']} {row['boundary_limited']}" for row in summary["per_task"]
                          if row["boundary_limited"])
        click.echo(f"boundary-limited: {summary['boundary_limited']} branch(es) failed a test only because something "
                   f"could not cross the isolation boundary ({tasks}); `factory tasks check TASKS` shows which "
                   "tasks pass bare but not isolated")
    if summary.get("judge_budget_exhausted"):
        click.echo(f"judge budget exhausted for {summary['judge_budget_exhausted']} sample(s) (scored a neutral 5)")
