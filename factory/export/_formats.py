"""Export formats: a small protocol, implementations registered by name (``factory export FORMAT``).

Each format turns an :class:`~factory.export.ExportSource` into rows whose
columns are exactly what the matching TRL trainer reads, with no mapping:

======  ==========================================  ======================
format  columns TRL reads                           trainer
======  ==========================================  ======================
dpo     ``prompt``, ``chosen``, ``rejected``        ``DPOTrainer``
kto     ``prompt``, ``completion``, ``label``       ``KTOTrainer``
reward  ``prompt``, ``chosen``, ``rejected``,       ``RewardTrainer``
        ``margin`` (+ a scalar file)
sft     ``messages``                                ``SFTTrainer``
grpo    ``prompt`` + the task's verifier spec       ``GRPOTrainer`` (extra
                                                    columns reach reward
                                                    functions as kwargs)
======  ==========================================  ======================

Conversational rows (the default) hold message lists: ``prompt`` is the
system and user turns, completions the assistant and tool turns, tool calls
included, plus a ``tools`` column (JSON text of the tool schemas, which TRL
hands to the chat template; null for single-turn rows). ``--format standard``
writes plain strings instead. Every row carries provenance columns (run,
task, branch indexes, scores, verifier versions).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import polars as pl

from factory.errors import ConfigError, ExportError
from factory.export._columns import FORMAT_COLUMNS
from factory.export._pairs import PairOptions, build_pairs
from factory.export._source import ExportSource
from factory.export._stream import Deduper, ExportStream, LengthBias, numbered, regrouped
from factory.registry import Registry

__all__ = ["EXPORT_FORMATS", "ExportFormat", "ExportOptions", "ExportRows", "ExportStream", "create_format",
           "format_names", "kto_weights", "length_bias", "register_format", "render_text", "tool_schemas_json"]


@dataclass(frozen=True)
class ExportOptions:
    """Everything that shapes an export besides its runs.

    Attributes:
        pairs: Pair strategy and filters (dpo, reward).
        conversational: Message lists (True) or plain strings (False).
        length_balance: Drop pairs until as many have the longer completion chosen as rejected.
        top_confidence: Keep this top fraction of pairs by margin (0 < F <= 1).
        dedupe: Drop rows whose content repeats an earlier row's.
        sft_all_passing: SFT keeps every clean pass, not just each task's best-ranked one.
    """

    pairs: PairOptions = field(default_factory=PairOptions)
    conversational: bool = True
    length_balance: bool = False
    top_confidence: float | None = None
    dedupe: bool = False
    sft_all_passing: bool = False

    def __post_init__(self) -> None:
        if self.top_confidence is not None and not 0 < self.top_confidence <= 1:
            raise ConfigError(f"--top-confidence must be in (0, 1], got {self.top_confidence}")


@dataclass
class ExportRows:
    """What a format built: the rows, side files, and facts for the manifest.

    Attributes:
        rows: The main file's rows.
        extra: Side files, by suffix (``scalar`` -> the reward format's scalar rows).
        stats: Counts, length bias, class balance... merged into the manifest's ``counts``.
        manifest: Fields of :class:`~factory.export.ExportManifest` this format sets itself
            (the pair strategy, KTO's class balance), so the exporter need not know formats by name.
    """

    rows: pl.DataFrame
    extra: dict[str, pl.DataFrame] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


class ExportFormat(Protocol):
    """Builds one format's rows.

    Attributes:
        name: Registered name (``factory export NAME``).
        trainer: The TRL trainer that reads it as is.
        columns: Required columns -> kind (``messages|text``, ``bool``, ``number``).
    """

    name: str
    trainer: str
    columns: dict[str, str]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        """The rows of this format, all at once (``source.branches``: the whole frame)."""
        ...


# A format may also define ``stream(source, options) -> ExportStream``: the same rows, built slice by slice from
# ``source.batches()``, in the same order; the exporter then writes each slice's rows as they come (every built-in
# format does, so an export holds one slice at a time). Without it, the exporter writes what ``build`` returns.


# ------------------------------------------------------------------ helpers


def tool_schemas_json() -> str:
    """The agent tools' OpenAI-style schemas as JSON text (the ``tools`` column)."""
    from factory.rollouts import AGENT_TOOLS

    return json.dumps([tool.openai_schema() for tool in AGENT_TOOLS], sort_keys=True)


def render_text(messages: list[dict[str, Any]] | None, *, roles: bool = False) -> str:
    """A message list as plain text (``--format standard``): tool calls and results in tags.

    Args:
        messages: Messages as exported (tool-call arguments as JSON text).
        roles: Prefix each message with its role (for prompts of several turns).
    """
    parts = []
    for message in messages or []:
        text = message.get("content") or ""
        if message.get("role") == "tool":
            text = f"<tool_result name=\"{message.get('name') or ''}\">\n{text}\n</tool_result>"
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            text += (("\n" if text else "") + '<tool_call>{"name": ' + json.dumps(function.get("name") or "")
                     + ', "arguments": ' + (function.get("arguments") or "{}") + "}</tool_call>")
        parts.append(f"{message.get('role')}: {text}" if roles else text)
    return "\n\n".join(parts)


def _text(column: str, *, roles: bool = False) -> pl.Expr:
    return pl.col(column).map_elements(  # a list cell arrives as a Series
        lambda value: render_text(value.to_list() if isinstance(value, pl.Series) else value, roles=roles),
        return_dtype=pl.String)


def _tools(mode_column: str) -> pl.Expr:
    return pl.when(pl.col(mode_column) == "tools").then(pl.lit(tool_schemas_json())).otherwise(pl.lit(None))


def length_bias(pairs: pl.DataFrame) -> dict[str, Any]:
    """Share of pairs whose chosen completion is longer (characters), and the mean chosen/rejected ratio."""
    if pairs.is_empty():
        return {"pairs": 0, "chosen_longer_share": None, "chosen_shorter_share": None, "mean_length_ratio": None}
    chosen, rejected = pl.col("chosen_completion_chars"), pl.col("rejected_completion_chars")
    out = pairs.select(
        (chosen > rejected).mean().alias("longer"), (chosen < rejected).mean().alias("shorter"),
        (chosen.cast(pl.Float64) / rejected.cast(pl.Float64)).filter(rejected > 0).mean().alias("ratio"),
    ).row(0, named=True)
    return {"pairs": pairs.height, "chosen_longer_share": round(out["longer"], 4),
            "chosen_shorter_share": round(out["shorter"], 4),
            "mean_length_ratio": None if out["ratio"] is None else round(out["ratio"], 4)}


def _balance_lengths(pairs: pl.DataFrame) -> pl.DataFrame:
    """Drop the smallest-margin pairs of the majority side until chosen-longer and chosen-shorter are equal."""
    chosen, rejected = pl.col("chosen_completion_chars"), pl.col("rejected_completion_chars")
    side = pl.when(chosen > rejected).then(1).when(chosen < rejected).then(-1).otherwise(0)
    pairs = pairs.with_columns(side.alias("_side"), pl.int_range(pl.len()).alias("_order"))
    longer, shorter = (pairs["_side"] == 1).sum(), (pairs["_side"] == -1).sum()
    majority, excess = (1, longer - shorter) if longer > shorter else (-1, shorter - longer)
    if excess:
        dropped = (pairs.filter(pl.col("_side") == majority).sort(["margin", "_order"]).head(excess)["_order"])
        pairs = pairs.filter(~pl.col("_order").is_in(dropped.implode()))
    return pairs.sort("_order").drop("_side", "_order")


def _filter_pairs(pairs: pl.DataFrame, options: ExportOptions, stats: dict[str, Any]) -> pl.DataFrame:
    stats["pairs_built"] = pairs.height
    stats["length_bias_before_filters"] = length_bias(pairs)
    if options.top_confidence is not None and pairs.height:
        keep = max(1, math.ceil(options.top_confidence * pairs.height))
        pairs = (pairs.with_columns(pl.int_range(pl.len()).alias("_order"))
                 .sort(["margin", "_order"], descending=[True, False]).head(keep).sort("_order").drop("_order"))
        stats["after_top_confidence"] = pairs.height
    if options.length_balance:
        pairs = _balance_lengths(pairs)
        stats["after_length_balance"] = pairs.height
    stats["length_bias"] = length_bias(pairs)
    return pairs


def _dedupe(rows: pl.DataFrame, content: list[str], stats: dict[str, Any]) -> pl.DataFrame:
    before = rows.height
    key = pl.concat_str([pl.col(c).map_elements(lambda v: json.dumps(v.to_list() if isinstance(v, pl.Series) else v,
                                                                      sort_keys=True), return_dtype=pl.String)
                         for c in content], separator="\x1f")
    rows = rows.with_columns(key.alias("_key")).unique("_key", keep="first", maintain_order=True).drop("_key")
    stats["duplicates_removed"] = before - rows.height
    return rows


def _pair_provenance() -> list[pl.Expr]:
    return [
        pl.col("run_id"), pl.col("task_id"),
        pl.col("chosen_branch_index").alias("chosen_branch"), pl.col("rejected_branch_index").alias("rejected_branch"),
        pl.col("chosen_objective_score").alias("chosen_score"),
        pl.col("rejected_objective_score").alias("rejected_score"),
        pl.col("chosen_reward"), pl.col("rejected_reward"),
        pl.col("chosen_strength"), pl.col("rejected_strength"),
        pl.col("chosen_verifier_versions").list.concat("rejected_verifier_versions").list.unique().list.sort()
        .alias("verifier_versions"),
    ]


def _branch_provenance(*, reward: bool = True) -> list[pl.Expr]:
    return [pl.col("run_id"), pl.col("task_id"), pl.col("branch_index").alias("branch"),
            pl.col("objective_score").alias("score"), *([pl.col("reward")] if reward else []), pl.col("rank"),
            pl.col("verifier_versions")]


def _pair_columns(options: ExportOptions) -> list[pl.Expr]:
    if options.conversational:
        return [pl.col("prompt_messages").alias("prompt"), pl.col("chosen_completion_messages").alias("chosen"),
                pl.col("rejected_completion_messages").alias("rejected"), _tools("chosen_mode").alias("tools")]
    return [_text("prompt_messages", roles=True).alias("prompt"), _text("chosen_completion_messages").alias("chosen"),
            _text("rejected_completion_messages").alias("rejected")]


def _nothing(what: str, source: ExportSource) -> ExportError:
    return ExportError(f"nothing to export: no {what} in run(s) {', '.join(source.runs)} "
                       "(are the branches verified? see: factory verify RUN, factory rank RUN)")


def _require_rows(frame: pl.DataFrame, what: str, source: ExportSource) -> None:
    if frame.is_empty():
        raise _nothing(what, source)


# ------------------------------------------------------------------ formats


class DPOFormat:
    """Preference pairs for ``DPOTrainer``."""

    name = "dpo"
    trainer = "DPOTrainer"
    columns = FORMAT_COLUMNS["dpo"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        stats: dict[str, Any] = {"strategy": options.pairs.strategy}
        pairs = build_pairs(source.branches, options.pairs)
        _require_rows(pairs, "preference pairs", source)
        pairs = _filter_pairs(pairs, options, stats)
        if pairs.is_empty():
            raise ExportError(f"nothing to export: the filters dropped all {stats['pairs_built']} pairs "
                              f"(length bias before them: {stats['length_bias_before_filters']})")
        rows = pairs.select(*_pair_columns(options), pl.col("margin"), *_pair_provenance())
        if options.dedupe:
            rows = _dedupe(rows, ["prompt", "chosen", "rejected"], stats)
        stats["rows"] = rows.height
        return ExportRows(rows, stats=stats, manifest={"strategy": options.pairs.strategy})

    def stream(self, source: ExportSource, options: ExportOptions) -> ExportStream:
        """:meth:`build`'s rows slice by slice (pairs never cross tasks, so a slice of whole tasks pairs alone)."""
        stats: dict[str, Any] = {"strategy": options.pairs.strategy}
        return ExportStream(self._chunks(source, options, stats), stats, {"strategy": options.pairs.strategy})

    def _chunks(self, source: ExportSource, options: ExportOptions, stats: dict[str, Any]) -> Iterator[ExportRows]:
        kept = None
        if options.top_confidence is not None or options.length_balance:
            # these filters rank every pair against every other: a first pass keeps each pair's margin and lengths
            light = [pairs.select("margin", "chosen_completion_chars", "rejected_completion_chars", "_pair")
                     for pairs in numbered(source.batches(), lambda b: build_pairs(b, options.pairs))]
            light_pairs = pl.concat(light) if light else pl.DataFrame()
            _require_rows(light_pairs, "preference pairs", source)
            kept = _filter_pairs(light_pairs, options, stats)["_pair"]
            if kept.is_empty():
                raise ExportError(f"nothing to export: the filters dropped all {stats['pairs_built']} pairs "
                                  f"(length bias before them: {stats['length_bias_before_filters']})")
        bias, dedupe, rows_out, offset = LengthBias(), Deduper(["prompt", "chosen", "rejected"]), 0, 0
        for batch in source.batches():
            pairs = build_pairs(batch, options.pairs)
            if kept is None:
                bias.add(pairs)
            else:  # the pairs the first pass kept, by number
                built = pairs.height
                pairs = pairs.filter((pl.int_range(pl.len(), dtype=pl.UInt64) + offset).is_in(kept.implode()))
                offset += built
            rows = pairs.select(*_pair_columns(options), pl.col("margin"), *_pair_provenance())
            if options.dedupe:
                rows = dedupe(rows)
            rows_out += rows.height
            yield ExportRows(rows, extra=self._extra(batch, options))
        if kept is None:
            if not bias.pairs:
                raise _nothing("preference pairs", source)
            stats.update(pairs_built=bias.pairs, length_bias_before_filters=bias.result(), length_bias=bias.result())
        if options.dedupe:
            stats["duplicates_removed"] = dedupe.removed
        stats["rows"] = rows_out

    def _extra(self, batch: pl.DataFrame, options: ExportOptions) -> dict[str, pl.DataFrame]:
        """Side-file rows of a slice of branches (none here)."""
        return {}


class RewardFormat(DPOFormat):
    """Pairs with a ``margin`` for ``RewardTrainer``, plus scalar rewards (``FILE.scalar.EXT``)."""

    name = "reward"
    trainer = "RewardTrainer"
    columns = FORMAT_COLUMNS["reward"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        built = super().build(source, options)
        scalar = scalar_rows(source.branches, options)
        built.extra["scalar"] = scalar
        built.stats["scalar_rows"] = scalar.height
        return built

    def stream(self, source: ExportSource, options: ExportOptions) -> ExportStream:
        streamed = super().stream(source, options)

        def chunks() -> Iterator[ExportRows]:
            scalar = 0
            for chunk in streamed.chunks:
                scalar += chunk.extra["scalar"].height
                yield chunk
            streamed.stats["scalar_rows"] = scalar

        return ExportStream(chunks(), streamed.stats, streamed.manifest)

    def _extra(self, batch: pl.DataFrame, options: ExportOptions) -> dict[str, pl.DataFrame]:
        return {"scalar": scalar_rows(batch, options)}


def scalar_rows(branches: pl.DataFrame, options: ExportOptions) -> pl.DataFrame:
    """One row per verified branch: ``prompt``, ``completion``, its scalar ``reward`` and the reward's components."""
    scored = branches.filter(pl.col("objective_pass").is_not_null())
    prompt, completion = ((pl.col("prompt_messages"), pl.col("completion_messages")) if options.conversational
                          else (_text("prompt_messages", roles=True), _text("completion_messages")))
    return scored.select(
        prompt.alias("prompt"), completion.alias("completion"),
        pl.col("reward"),
        pl.struct(pl.col("objective_score").alias("objective"), pl.col("judge_score").alias("judge"),
                  pl.col("objective_pass"), pl.col("hack_detected"), pl.col("hack_suspected")
                  ).alias("components"),
        *_branch_provenance(reward=False))


class PPOFormat:
    """Prompt / completion / scalar reward rows: what a PPO- or RLOO-style (policy-gradient) trainer consumes.

    One row per verified branch (the rows of the reward format's scalar file, under their own name): the
    prompt, the completion the policy sampled, and the reward the ranking gave it (``components``: the
    objective score, the judge's, the pass and hack flags it came from). Offline, these train a value or
    reward-regression head, or weight a policy-gradient update by reward; TRL's own ``RLOOTrainer`` and PPO
    generate their completions online, so they read the ``prompt`` column as is and the stored ``completion``
    and ``reward`` reach their reward functions as keyword arguments.
    """

    name = "ppo"
    trainer = "RLOOTrainer"
    columns = FORMAT_COLUMNS["ppo"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        rows = scalar_rows(source.branches, options)
        _require_rows(rows, "verified branches", source)
        rows = self._check_rewards(rows)
        return ExportRows(rows, stats={"rows": rows.height})

    def stream(self, source: ExportSource, options: ExportOptions) -> ExportStream:
        stats: dict[str, Any] = {}

        def chunks() -> Iterator[ExportRows]:
            total = 0
            for batch in source.batches():
                rows = self._check_rewards(scalar_rows(batch, options))
                total += rows.height
                yield ExportRows(rows)
            if not total:
                raise _nothing("verified branches", source)
            stats["rows"] = total

        return ExportStream(chunks(), stats)

    @staticmethod
    def _check_rewards(rows: pl.DataFrame) -> pl.DataFrame:
        """Every row needs a reward: a verified branch of a run not ranked has none (rank the run first)."""
        missing = rows.filter(pl.col("reward").is_null() | pl.col("reward").is_nan())
        if missing.height:
            row = missing.row(0, named=True)
            raise ExportError(f"{missing.height} verified branch(es) have no reward, e.g. {row['run_id']} "
                              f"{row['task_id']} branch {row['branch']} (see: factory rank RUN)")
        return rows


#: KTO's label: a clean objective pass is desirable.
_KTO_LABEL = (pl.col("objective_pass") & ~pl.col("hack_detected") & ~pl.col("hack_suspected")).alias("label")


class KTOFormat:
    """Every verified branch, labelled desirable (clean objective pass) or not, for ``KTOTrainer``."""

    name = "kto"
    trainer = "KTOTrainer"
    columns = FORMAT_COLUMNS["kto"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        verified = source.branches.filter(pl.col("objective_pass").is_not_null())
        _require_rows(verified, "verified branches", source)
        label, content = _KTO_LABEL, self._content(options)
        # Interleave tasks (each task's first branch, then each one's second, ...): KTOTrainer estimates its KL
        # term from each row's batch neighbour's completion, which a neighbour of the same prompt would spoil.
        verified = (verified.sort(["run_id", "task_id", "branch_index"])
                    .with_columns(pl.int_range(pl.len()).over(["run_id", "task_id"]).alias("_turn"))
                    .sort(["_turn", "run_id", "task_id"]))
        rows = verified.select(*content, label, *_branch_provenance())
        stats: dict[str, Any] = {}
        if options.dedupe:
            rows = _dedupe(rows, ["prompt", "completion", "label"], stats)
        desirable = int(rows["label"].sum())
        return ExportRows(rows, stats=stats, manifest=self._balance(stats, rows.height, desirable))

    @staticmethod
    def _balance(stats: dict[str, Any], rows: int, desirable: int) -> dict[str, Any]:
        undesirable = rows - desirable
        stats.update(rows=rows, desirable=desirable, undesirable=undesirable,
                     desirable_share=round(desirable / rows, 4), **kto_weights(desirable, undesirable))
        return {"kto": {key: stats[key] for key in
                        ("desirable", "undesirable", "desirable_share", "desirable_weight", "undesirable_weight")}}

    def stream(self, source: ExportSource, options: ExportOptions) -> ExportStream:
        """:meth:`build`'s rows, interleaved the same way: one pass over the slices per turn.

        Row ``k`` of every task (its ``k``-th verified branch) comes before row ``k + 1`` of any: one pass
        over the slices sets each slice's rows aside by ``k`` (:func:`~factory.export._stream.regrouped`),
        then they go out ``k`` by ``k``.
        """
        stats: dict[str, Any] = {}
        manifest: dict[str, Any] = {}

        def turns() -> Iterator[pl.DataFrame]:
            for batch in source.batches():
                verified = (batch.filter(pl.col("objective_pass").is_not_null())
                            .sort(["run_id", "task_id", "branch_index"])
                            .with_columns(pl.int_range(pl.len()).over(["run_id", "task_id"]).alias("_turn")))
                yield verified.select(*self._content(options), _KTO_LABEL, *_branch_provenance(), "_turn")

        def chunks() -> Iterator[ExportRows]:
            dedupe, rows_out, desirable = Deduper(["prompt", "completion", "label"]), 0, 0
            for rows in regrouped(turns(), "_turn"):
                if options.dedupe:
                    rows = dedupe(rows)
                rows_out += rows.height
                desirable += int(rows["label"].sum())
                yield ExportRows(rows)
            if not rows_out:
                raise _nothing("verified branches", source)
            if options.dedupe:
                stats["duplicates_removed"] = dedupe.removed
            manifest.update(self._balance(stats, rows_out, desirable))

        return ExportStream(chunks(), stats, manifest)

    @staticmethod
    def _content(options: ExportOptions) -> list[pl.Expr]:
        if options.conversational:
            return [pl.col("prompt_messages").alias("prompt"), pl.col("completion_messages").alias("completion"),
                    _tools("mode").alias("tools")]
        return [_text("prompt_messages", roles=True).alias("prompt"),
                _text("completion_messages").alias("completion")]


def kto_weights(desirable: int, undesirable: int) -> dict[str, float]:
    """Class weights that give both classes equal total weight (TRL advises a ratio in [1, 4/3]).

    ``desirable_weight * desirable == undesirable_weight * undesirable``, with
    the larger class at weight 1. With an empty class both weights are 1 (the
    trainer cannot balance what is not there; the manifest shows the counts).
    """
    if not desirable or not undesirable:
        return {"desirable_weight": 1.0, "undesirable_weight": 1.0}
    if desirable >= undesirable:
        return {"desirable_weight": round(undesirable / desirable, 6), "undesirable_weight": 1.0}
    return {"desirable_weight": 1.0, "undesirable_weight": round(desirable / undesirable, 6)}


class SFTFormat:
    """The winners' whole conversations as ``messages``, for ``SFTTrainer`` (rejection-sampling fine-tuning)."""

    name = "sft"
    trainer = "SFTTrainer"
    columns = FORMAT_COLUMNS["sft"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        clean = self._clean(source.branches, options)
        _require_rows(clean, "clean objective passes", source)
        if not options.conversational:
            raise ConfigError("sft rows are conversations (messages); --format standard does not apply")
        rows = self._rows(clean)
        stats: dict[str, Any] = {"winners": "every clean pass" if options.sft_all_passing else "best-ranked per task"}
        if options.dedupe:
            rows = _dedupe(rows, ["messages"], stats)
        stats["rows"] = rows.height
        return ExportRows(rows, stats=stats)

    def stream(self, source: ExportSource, options: ExportOptions) -> ExportStream:
        if not options.conversational:
            raise ConfigError("sft rows are conversations (messages); --format standard does not apply")
        stats: dict[str, Any] = {"winners": "every clean pass" if options.sft_all_passing else "best-ranked per task"}
        return _per_slice(source, options, stats, lambda batch: self._rows(self._clean(batch, options)),
                          ["messages"], "clean objective passes")

    @staticmethod
    def _clean(branches: pl.DataFrame, options: ExportOptions) -> pl.DataFrame:
        clean = branches.filter(pl.col("objective_pass").fill_null(False) & ~pl.col("hack_detected")
                                & ~pl.col("hack_suspected") & pl.col("rank").is_not_null())
        if not options.sft_all_passing:
            clean = clean.filter(pl.col("rank") == pl.col("rank").min().over(["run_id", "task_id"]))
        return clean

    @staticmethod
    def _rows(clean: pl.DataFrame) -> pl.DataFrame:
        return clean.select(pl.col("prompt_messages").list.concat("completion_messages").alias("messages"),
                            _tools("mode").alias("tools"), *_branch_provenance())


class GRPOFormat:
    """Prompt-only rows carrying the task's verifier spec, for ``GRPOTrainer`` reward functions."""

    name = "grpo"
    trainer = "GRPOTrainer"
    columns = FORMAT_COLUMNS["grpo"]

    def build(self, source: ExportSource, options: ExportOptions) -> ExportRows:
        tasks = self._tasks(source.branches)
        _require_rows(tasks, "tasks", source)
        rows = self._rows(tasks, options)
        stats: dict[str, Any] = {}
        if options.dedupe:  # the same task in several runs: once
            rows = _dedupe(rows, ["task_spec"], stats)
        stats["rows"] = rows.height
        return ExportRows(rows, stats=stats)

    def stream(self, source: ExportSource, options: ExportOptions) -> ExportStream:
        return _per_slice(source, options, {}, lambda batch: self._rows(self._tasks(batch), options),
                          ["task_spec"], "tasks")

    @staticmethod
    def _tasks(branches: pl.DataFrame) -> pl.DataFrame:
        return (branches.sort(["run_id", "task_id", "branch_index"])
                .unique(["run_id", "task_id"], keep="first", maintain_order=True))

    @staticmethod
    def _rows(tasks: pl.DataFrame, options: ExportOptions) -> pl.DataFrame:
        # A task's reference solution is never exported (it is the answer key of the task's tests).
        spec = pl.col("task_spec").map_elements(_without_solution, return_dtype=pl.String)
        return tasks.select(
            pl.col("prompt_messages").alias("prompt") if options.conversational else
            _text("prompt_messages", roles=True).alias("prompt"),
            pl.col("task_id"), pl.col("run_id"),
            spec.str.json_path_match("$.answer").alias("answer"),
            spec.map_elements(lambda s: _spec_json(s, "tests"), return_dtype=pl.String).alias("tests"),
            spec.map_elements(lambda s: _spec_json(s, "files"), return_dtype=pl.String).alias("files"),
            spec.str.json_path_match("$.test_command").alias("test_command"),
            pl.col("task_verifiers").alias("verifiers"),
            spec.alias("task_spec"),
        )


def _per_slice(source: ExportSource, options: ExportOptions, stats: dict[str, Any],
               rows_of: Callable[[pl.DataFrame], pl.DataFrame], content: list[str], what: str) -> ExportStream:
    """A format whose rows of a slice of whole tasks depend on that slice alone: ``rows_of`` each, in order."""

    def chunks() -> Iterator[ExportRows]:
        dedupe, total = Deduper(content), 0
        for batch in source.batches():
            rows = rows_of(batch)
            if options.dedupe:
                rows = dedupe(rows)
            total += rows.height
            yield ExportRows(rows)
        if not total:
            raise _nothing(what, source)
        if options.dedupe:
            stats["duplicates_removed"] = dedupe.removed
        stats["rows"] = total

    return ExportStream(chunks(), stats)


def _without_solution(spec: str) -> str:
    data = json.loads(spec)
    if "solution" not in data:
        return spec
    data.pop("solution")
    return json.dumps(data)  # as the store wrote it (key order kept): the same task, the same spec text


def _spec_json(spec: str, key: str) -> str | None:
    value = json.loads(spec).get(key)
    return json.dumps(value, sort_keys=True) if value else None


#: Export formats by name (``factory export --format``); :func:`register_format` adds one.
EXPORT_FORMATS: Registry[Callable[[], ExportFormat]] = Registry("export format")
EXPORT_FORMATS.register("dpo", DPOFormat)
EXPORT_FORMATS.register("kto", KTOFormat)
EXPORT_FORMATS.register("reward", RewardFormat)
EXPORT_FORMATS.register("sft", SFTFormat)
EXPORT_FORMATS.register("grpo", GRPOFormat)
EXPORT_FORMATS.register("ppo", PPOFormat)


def _hints_format() -> ExportFormat:
    from factory.export._feedback import HintsFormat  # it imports this module: resolved on first use

    return HintsFormat()


def _spans_format() -> ExportFormat:
    from factory.export._feedback import SpansFormat

    return SpansFormat()


EXPORT_FORMATS.register("hints", _hints_format)
EXPORT_FORMATS.register("spans", _spans_format)


def register_format(name: str, factory: Callable[[], ExportFormat]) -> None:
    """Register an export format under ``name``."""
    EXPORT_FORMATS.register(name, factory)


def format_names() -> list[str]:
    """Registered format names."""
    return EXPORT_FORMATS.names()


def create_format(name: str) -> ExportFormat:
    """The format registered as ``name``.

    Raises:
        ConfigError: Unknown format.
    """
    return EXPORT_FORMATS.get(name)()
