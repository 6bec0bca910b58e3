"""``export()``: runs in the store -> one format's file, its manifest and the folder's dataset card.

Beside ``FILE`` it writes ``FILE.manifest.json`` (what the rows depend on and
what was done to them) and regenerates ``README.md``, a Hugging Face dataset
card describing every export in the folder (one ``configs`` entry each).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from factory.errors import ConfigError, RecordError
from factory.export._files import MANIFEST_SUFFIX, file_kind, side_path
from factory.export._formats import ExportFormat, ExportOptions, ExportRows, create_format
from factory.export._manifest import ExportedRun, ExportManifest
from factory.export._source import BATCH_BRANCHES, ExportSource, load_source
from factory.export._stream import ExportStream
from factory.export._writers import RowWriter
from factory.outputs import OutputFiles, write_output
from factory.provenance import content_hash, git_sha, package_version
from factory.store import Store, utc_now

__all__ = ["ExportResult", "export", "judge_objective_agreement", "write_dataset_card"]

_CARD_MARK = "<!-- written by factory export: regenerated from the *.manifest.json files in this folder -->"


@dataclass
class ExportResult:
    """What an export wrote.

    Attributes:
        path: The data file.
        manifest_path: ``FILE.manifest.json``.
        card_path: The folder's ``README.md``.
        extra_paths: Side files (the reward format's scalar file).
        manifest: The manifest, as written to ``manifest_path``.
    """

    path: Path
    manifest_path: Path
    card_path: Path
    extra_paths: dict[str, Path]
    manifest: ExportManifest


def judge_objective_agreement(branches: pl.DataFrame) -> dict[str, Any]:
    """How the judge's scores agree with the objective verdicts on the branches that have both.

    ``agreement``: share of branches where (judge score >= 0.5) equals
    objective pass; ``auc``: probability that a passing branch out-scores a
    failing one (ties half); None where there is nothing to compare.
    """
    from factory.verifiers import judge_auc

    both = branches.filter(pl.col("judge_score").is_not_null() & pl.col("objective_pass").is_not_null())
    if both.is_empty():
        return {"n": 0, "agreement": None, "auc": None}
    scores, passed = both["judge_score"].to_list(), both["objective_pass"].to_list()
    agree = sum((s >= 0.5) == p for s, p in zip(scores, passed)) / len(scores)
    auc = judge_auc(scores, passed)
    return {"n": len(scores), "agreement": round(agree, 4), "auc": None if auc is None else round(auc, 4)}


def _runs_section(source: ExportSource) -> list[ExportedRun]:
    return [ExportedRun(run_id=run_id, dataset_hash=info["dataset_hash"], config_hash=info["config_hash"],
                        model=info["model"], ranked_at_export=run_id in source.ranked_here,
                        ranking=source.ranking_stats.get(run_id))
            for run_id, info in source.runs.items()]


def export(store: Store, format_name: str, run_ids: Sequence[str], out: str | Path,
           options: ExportOptions | None = None, *, rolling: int | None = None,
           batch_branches: int | None = BATCH_BRANCHES) -> ExportResult:
    """Export runs as one format's file, with its manifest and the folder's dataset card.

    The rows stream: read from the store in slices of whole tasks, built and written slice by slice
    (formats with a ``stream`` method: every built-in one), the file's sha256 taken as its bytes go out,
    so what the export holds at once does not grow with its size.

    Args:
        store: The store holding the runs.
        format_name: A registered format (``dpo``, ``kto``, ``reward``, ``sft``, ``grpo``).
        run_ids: Runs to draw from, oldest iteration first.
        out: The data file (``.jsonl`` or ``.parquet``).
        options: Strategy and filters.
        rolling: Keep only the last ``rolling`` runs of ``run_ids`` (iterative DPO).
        batch_branches: Branches per slice (whole tasks; None: the whole export at once). The file is
            the same whatever the slice.

    Raises:
        ExportError: No such run, or nothing to export.
        ConfigError: Bad options or file extension.
    """
    options = options or ExportOptions()
    out = Path(out)
    fmt = create_format(format_name)
    # Nothing lands before everything is written, and nothing lands on the store.
    outputs = OutputFiles({"the store (--db)": store.path}, f"export {format_name}")
    manifest_path = out.with_name(out.name + MANIFEST_SUFFIX)
    file_kind(out)
    for target in (out, manifest_path):
        outputs.check(target)
    run_ids = list(run_ids)
    if not run_ids:
        raise ConfigError("give at least one run (--run RUN or --runs R1,R2)")
    if rolling is not None:
        if rolling < 1:
            raise ConfigError(f"--rolling must be >= 1, got {rolling}")
        run_ids = run_ids[-rolling:]
    with store.memory_capped():  # DuckDB's block cache would otherwise grow with the store
        source = load_source(store, run_ids, batch_branches=batch_branches)
        streamed = _stream_of(fmt, source, options)
        with outputs:
            return _write_export(fmt, streamed, source, out, manifest_path, options, run_ids, rolling, outputs)


def _stream_of(fmt: ExportFormat, source: ExportSource, options: ExportOptions) -> ExportStream:
    """The format's stream, or, for a format that only builds, its whole rows as one chunk."""
    stream = getattr(fmt, "stream", None)
    if stream is not None:
        return stream(source, options)
    built = fmt.build(source, options)
    return ExportStream([built], built.stats, built.manifest)


def _write_chunks(streamed: ExportStream, out: Path, outputs: OutputFiles
                  ) -> tuple[RowWriter, dict[str, tuple[Path, RowWriter]], dict[RowWriter, str]]:
    """Write every chunk to the staged main and side files as it comes; the writers and their sha256s."""
    kind = file_kind(out)
    main = RowWriter(outputs.stage(out), kind)
    sides: dict[str, tuple[Path, RowWriter]] = {}

    def write(chunk: ExportRows) -> None:
        main.write(chunk.rows)
        for tag, frame in chunk.extra.items():
            if tag not in sides:
                path = side_path(out, tag)
                sides[tag] = (path, RowWriter(outputs.stage(path), kind))
            sides[tag][1].write(frame)

    # One chunk is written (serialized, hashed: off the GIL) while the next is built: at most two are held.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="export-write")
    writing: Future[None] | None = None
    try:
        for chunk in streamed.chunks:
            if writing is not None:
                writing.result()
            writing = pool.submit(write, chunk)
            del chunk
        if writing is not None:
            writing.result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        for writer in (main, *(w for _, w in sides.values())):
            writer.abort()
        raise
    pool.shutdown(wait=True)
    return main, sides, {writer: writer.close() for writer in (main, *(w for _, w in sides.values()))}


def _write_export(fmt: ExportFormat, streamed: ExportStream, source: ExportSource, out: Path,
                  manifest_path: Path, options: ExportOptions, run_ids: list[str], rolling: int | None,
                  outputs: OutputFiles) -> ExportResult:
    """Stage the data file, its side files, its manifest and the folder's card in ``outputs``."""
    main, sides, digests = _write_chunks(streamed, out, outputs)
    extra_paths = {tag: path for tag, (path, _) in sides.items()}

    from factory.ranking import describe_evidence

    powered = [stats.get("powered", False) for stats in source.ranking_stats.values()]
    evidence = [stats.get("evidence", False) for stats in source.ranking_stats.values()]
    run_info = list(source.runs.values())
    options_dict = asdict(options)
    manifest = ExportManifest(
        format=fmt.name,
        trainer=fmt.trainer if fmt.trainer.startswith("factory ") else f"trl.{fmt.trainer}",  # ours: a command
        file=out.name,
        file_sha256="sha256:" + digests[main],
        files={tag: {"file": path.name, "sha256": "sha256:" + digests[writer]}
               for tag, (path, writer) in sides.items()},
        rows=main.rows,
        columns=main.columns or [],
        conversational=options.conversational,
        filters={k: v for k, v in options_dict.items() if k != "conversational"} | {"rolling": rolling},
        options_hash=content_hash({"format": fmt.name, **options_dict, "rolling": rolling}),
        runs=_runs_section(source),
        run_ids=run_ids,
        dataset_hash=run_info[0]["dataset_hash"] if len({r["dataset_hash"] for r in run_info}) == 1 else None,
        dataset_hashes=sorted({r["dataset_hash"] for r in run_info if r["dataset_hash"]}),
        config_hash=run_info[0]["config_hash"] if len(run_info) == 1 else None,
        config_hashes=[r["config_hash"] for r in run_info],
        counts={"branches": source.n_branches,
                "tasks": source.n_tasks,
                # left out of every row, never a rejected side or an undesirable label
                "excluded_infra_failures": sum(e["infra_failures"] for e in source.excluded.values()),
                **streamed.stats},
        length_bias=streamed.stats.get("length_bias"),
        judge_objective_agreement=judge_objective_agreement(source.judge_objective()),
        # evidence only from a test the ranking did not decide: the judge against the objective (DESIGN: statistics)
        powered=bool(powered) and all(powered),
        evidence=bool(evidence) and all(evidence),
        evidence_tests=[f"{run_id}: {describe_evidence(stats)}" for run_id, stats in source.ranking_stats.items()],
        created_at=utc_now().isoformat() + "Z",
        factory_version=package_version(),
        git_sha=git_sha(Path(__file__).resolve().parent),
        **streamed.manifest,  # what the format sets itself: its pair strategy, KTO's class balance
    )
    outputs.stage(manifest_path).write_text(json.dumps(manifest.document(), indent=2, sort_keys=False) + "\n",
                                            encoding="utf-8")
    card_path = write_dataset_card(out.parent, adding={manifest_path.name: manifest}, outputs=outputs)
    return ExportResult(out, manifest_path, card_path, extra_paths, manifest)


def write_dataset_card(folder: Path, *, adding: Mapping[str, ExportManifest] | None = None,
                       outputs: OutputFiles | None = None) -> Path:
    """(Re)write ``folder/README.md`` from every export manifest in the folder.

    A README.md that factory did not write is left alone; the card then goes
    to ``DATASET_CARD.md``.

    Args:
        folder: The export folder.
        adding: Manifests not yet in the folder, by file name (they replace
            any there of the same name): the export being written.
        outputs: Stage the card in this set (default: write it at once, atomically).
    """
    found: dict[str, ExportManifest] = {}
    for path in sorted(folder.glob(f"*{MANIFEST_SUFFIX}")):
        try:
            found[path.name] = ExportManifest.from_stored(path.read_text(encoding="utf-8"))
        except (OSError, RecordError):  # not ours to describe
            continue
    found.update(adding or {})
    manifests = [found[name] for name in sorted(found)]
    card = folder / "README.md"
    if card.exists() and (not card.is_file() or _CARD_MARK not in card.read_text(encoding="utf-8", errors="replace")):
        card = folder / "DATASET_CARD.md"
    configs, tags = [], {"factory", "rlaif", "trl"}
    manifests = [m for m in manifests if m.file]  # a manifest naming no file describes nothing to load
    for m in manifests:
        name = Path(m.file).stem.replace(".", "-")
        configs.append(f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {m.file}")
        tags.add(m.format)
    lines = ["---", "configs:", *configs, "tags:", *[f"- {t}" for t in sorted(tags)],
             "task_categories:", "- text-generation", "---", _CARD_MARK, "", "# factory export", "",
             "Training data exported by `factory export` from verified, ranked agent rollouts. "
             "Each file loads with `datasets.load_dataset(\"json\" or \"parquet\", data_files=FILE)` and trains "
             "with the TRL trainer named below without any column mapping. Every row carries its provenance "
             "(run, task, branch indexes, scores, verifier versions); each file's `.manifest.json` holds the rest.",
             ""]
    for m in manifests:
        bias = m.length_bias or {}
        agreement = m.judge_objective_agreement
        lines += [
            f"## `{m.file}`", "",
            "| | |", "|---|---|",
            f"| format | {m.format} ({'conversational' if m.conversational else 'standard'}) |",
            f"| trainer | `{m.trainer}` |",
            f"| rows | {m.rows} |",
            f"| strategy | {m.strategy or '-'} |",
            f"| runs | {', '.join(m.run_ids)} |",
            f"| dataset hash | `{m.dataset_hash or ', '.join(m.dataset_hashes)}` |",
            f"| config hash | `{m.config_hash or ', '.join(filter(None, m.config_hashes))}` |",
            f"| chosen longer / mean length ratio | {bias.get('chosen_longer_share', '-')} / "
            f"{bias.get('mean_length_ratio', '-')} |",
            f"| judge–objective agreement | {agreement.get('agreement', '-')} (AUC {agreement.get('auc', '-')}, "
            f"n {agreement.get('n', 0)}) |",
            f"| ranking powered / evidence | {m.powered} / {m.evidence} |",
            f"| evidence test | {'; '.join(m.evidence_tests) or '-'} |",
            "",
        ]
        if m.kto is not None:
            lines += [f"KTO class balance: {m.kto.desirable} desirable, {m.kto.undesirable} undesirable; "
                      f"`desirable_weight={m.kto.desirable_weight}`, "
                      f"`undesirable_weight={m.kto.undesirable_weight}`.", ""]
    if outputs is None:
        write_output(card, lambda path: path.write_text("\n".join(lines), encoding="utf-8"))
    else:
        outputs.stage(card).write_text("\n".join(lines), encoding="utf-8")
    return card
