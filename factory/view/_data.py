"""What the viewer shows, as JSON-ready dicts: one answer per API request, for the server and the bundle alike.

:class:`ViewData` turns a request (a name such as ``run`` and its parameters)
into the JSON object the front end renders. The web app serves it over
HTTP; :func:`~factory.view.write_bundle` calls the same method for every page
a static site needs and writes the answers as data files, so both show the
same thing from one definition.

Counts and pass rates follow the store's definitions: infrastructure failures
(branches that are not outcomes) and branches an objective verifier could not
judge are counted apart, never as failures; a pass rate is passed of verified,
with its Wilson interval (:func:`factory.ranking.wilson_interval`); branches
limited by the isolation boundary are counted apart as well.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.ranking import wilson_interval
from factory.store import RunBrowser, Store

__all__ = ["ENDPOINTS", "ViewData", "final_workspace", "pass_rate", "workspace_diff"]

#: Requests the front end makes (``/api/<name>``), each with its parameters.
ENDPOINTS: dict[str, tuple[str, ...]] = {
    "runs": ("limit", "offset", "status", "model", "q"),
    "run": ("run",),
    "tasks": ("run", "limit", "offset", "q"),
    "task": ("run", "task", "branches"),
    "diff": ("run", "task", "a", "b"),
    "search": ("run", "q"),
    "rankings": ("run", "limit", "offset"),
}
#: Page sizes: the defaults the front end asks for, and the most any request gets.
PAGE = {"runs": 50, "tasks": 50, "rankings": 100}
MAX_PAGE = 500
#: Branches shown side by side when none are chosen, and the most one request returns.
SIDE_BY_SIDE = 4
MAX_SIDE_BY_SIDE = 12
#: Events returned per branch (a longer trajectory says how many more there are).
MAX_EVENTS = 400
#: Search hits per place (final answers, tool outputs), and the snippet's length around a hit.
MAX_HITS = 100
SNIPPET = 160
#: Lines of a diff returned (a longer one says it was cut).
MAX_DIFF_LINES = 4000


def _plain(value: Any) -> Any:
    """A value as JSON can carry it: times as ISO text, non-finite floats as None."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _json_cell(text: Any) -> Any:
    """A stored JSON column's value parsed (None stays None; text that is not JSON is returned as text)."""
    if text is None or not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def pass_rate(passed: int, verified: int) -> dict[str, Any]:
    """``passed`` of ``verified`` with its 95 % Wilson interval (rate None when nothing was verified)."""
    low, high = wilson_interval(passed, verified)
    return {"passed": passed, "verified": verified, "rate": passed / verified if verified else None,
            "low": float(low), "high": float(high)}


def final_workspace(workspace: Any, spec: Any) -> dict[str, str]:
    """A branch's final files: its task's files with the stored change set applied.

    Args:
        workspace: The branch's ``workspace`` (a :class:`~factory.store.WorkspaceSnapshot` as JSON text or
            dict; None when the branch recorded none).
        spec: The task's ``spec`` (JSON text or dict): its ``files`` are the starting workspace.

    Returns:
        Path -> text, sorted by path. Deleted files are gone; skipped files, symlinks and special files are
        shown as one marker line each, since their contents were never stored.
    """
    snapshot = _json_cell(workspace) or {}
    task = _json_cell(spec) or {}
    files: dict[str, str] = dict(task.get("files") or {})
    files.update(snapshot.get("files") or {})
    for path in snapshot.get("deleted") or []:
        files.pop(path, None)
    for path in snapshot.get("skipped") or []:
        files[path] = "[changed, not stored: too large or binary]\n"
    for path, target in (snapshot.get("symlinks") or {}).items():
        files[path] = f"[symlink -> {target}]\n"
    for path, kind in (snapshot.get("special") or {}).items():
        files[path] = f"[{kind}]\n"
    return dict(sorted(files.items()))


def workspace_diff(a: Mapping[str, str], b: Mapping[str, str]) -> list[dict[str, Any]]:
    """Unified diffs of two final workspaces, one entry per file that differs (in path order).

    Returns:
        ``{"path", "change": "added" | "removed" | "modified", "lines": [...]}`` per differing file; ``lines``
        are the unified diff's lines without the ``---``/``+++`` header.
    """
    out: list[dict[str, Any]] = []
    for path in sorted(set(a) | set(b)):
        old, new = a.get(path), b.get(path)
        if old == new:
            continue
        change = "added" if old is None else "removed" if new is None else "modified"
        lines = list(difflib.unified_diff((old or "").splitlines(), (new or "").splitlines(), lineterm="", n=3))
        out.append({"path": path, "change": change, "lines": lines[2:]})
    return out


def _snippet(text: str, needle: str) -> str:
    at = text.lower().find(needle.lower())
    if at < 0:
        return text[:SNIPPET]
    start = max(0, at - SNIPPET // 2)
    return ("…" if start else "") + text[start:start + SNIPPET] + ("…" if start + SNIPPET < len(text) else "")


def _int(params: Mapping[str, Any], name: str, default: int, *, low: int = 0, high: int | None = None) -> int:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{name} must be between {low} and {high}, not {value}" if high is not None
                          else f"{name} must be at least {low}, not {value}")
    return value


def _required(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    if not value:
        raise ConfigError(f"the {name} parameter is required")
    return str(value)


class ViewData:
    """The viewer's answers, read from one store through bounded queries.

    Give it an open ``store`` (a bundle, a test), or the store's ``path``: then each request opens the
    store read-only and the connection is closed once no request came for ``hold_s`` seconds, so a
    viewer left open never keeps a fork from writing (a store's writer lets readers in between its
    writes and waits for them to leave: see :mod:`factory.store`).

    Args:
        store: An open store (read-only for ``factory view``).
        path: The store's file, opened read-only per burst of requests (instead of ``store``).
        hold_s: With ``path``: idle seconds after which the connection is closed.
        opinions: Verifiers whose verdicts are opinions, not checks (default:
            :func:`factory.verifiers.opinion_verifiers`).

    Raises:
        ConfigError: Both or neither of ``store`` and ``path`` given.
    """

    def __init__(self, store: Store | None = None, *, path: str | Path | None = None, hold_s: float = 1.0,
                 opinions: Sequence[str] | None = None):
        if (store is None) == (path is None):
            raise ConfigError("ViewData needs exactly one of an open store or a store path (not both, not neither)")
        if opinions is None:
            from factory.verifiers import opinion_verifiers

            opinions = opinion_verifiers()
        self.opinions = list(opinions)
        self.path = None if path is None else Path(path)
        self.hold_s = hold_s
        self._store = store
        self._lock = threading.RLock()  # one request at a time: they share the connection
        self._closer: threading.Timer | None = None
        self.browser = RunBrowser(store, opinions=self.opinions) if store is not None else None
        # run id -> (fingerprint, counts): counting a large run's verdicts is the slowest read, and a finished
        # run's counts never change; a run being written changes its fingerprint, which recounts it
        self._counts: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    @contextlib.contextmanager
    def _reading(self) -> Iterator[RunBrowser]:
        with self._lock:
            if self.path is None:
                assert self.browser is not None
                yield self.browser
                return
            if self._closer is not None:
                self._closer.cancel()
            if self.browser is None:
                self._store = Store.open(self.path, read_only=True)
                self.browser = RunBrowser(self._store, opinions=self.opinions)
            try:
                yield self.browser
            finally:
                self._closer = threading.Timer(self.hold_s, self.release)
                self._closer.daemon = True
                self._closer.start()

    def release(self) -> None:
        """With a store path: close the connection now (the next request opens it again). Thread-safe."""
        with self._lock:
            if self.path is not None and self._store is not None:
                self._store.close()
                self._store, self.browser = None, None

    def run_counts(self, run_id: str) -> dict[str, Any] | None:
        """A run's row and counts (:meth:`factory.store.RunBrowser.run_counts`), recounted only when it changed."""
        with self._reading():
            return self._run_counts(run_id)

    def corpus(self, run_id: str, *, limit: int, chars: int) -> list[dict[str, Any]]:
        """A run's final answers and tool outputs (at most ``limit`` of each, ``chars`` characters each)."""
        with self._reading() as browser:
            # an empty needle matches every final answer and tool output
            return [{**row, "text": (row["text"] or "")[:chars]} for row in browser.search(run_id, "", limit=limit)]

    def _run_counts(self, run_id: str) -> dict[str, Any] | None:
        fingerprint = self.browser.run_fingerprint(run_id)
        cached = self._counts.get(run_id)
        if cached is not None and cached[0] == fingerprint:
            return dict(cached[1])
        counts = self.browser.run_counts(run_id)
        if counts is not None:
            self._counts[run_id] = (fingerprint, counts)
        return None if counts is None else dict(counts)

    def answer(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The JSON object for one request.

        Args:
            name: One of :data:`ENDPOINTS`.
            params: Its parameters (text, as a query string carries them).

        Returns:
            The answer, ready for ``json.dumps``; None when the run, task or branch does not exist.

        Raises:
            ConfigError: An unknown request, or a parameter out of range (a client's error).
        """
        if name not in ENDPOINTS:
            raise ConfigError(f"unknown request {name!r} (known: {', '.join(ENDPOINTS)})")
        with self._reading():
            answer = getattr(self, f"_{name}")(params)
        return None if answer is None else _plain(answer)

    # --------------------------------------------------------------- runs

    def _runs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        limit = _int(params, "limit", PAGE["runs"], low=1, high=MAX_PAGE)
        offset = _int(params, "offset", 0)
        rows, total = self.browser.runs_page(limit=limit, offset=offset, status=params.get("status"),
                                             model=params.get("model"), text=params.get("q"), with_counts=False)
        for row in rows:
            counts = self._run_counts(row["run_id"]) or {}
            row.update({key: counts.get(key, 0) for key in ("branches", "infra_failures", "verified", "passed",
                                                             "hacks", "boundary_limited")})
            row["cost_usd"] = counts.get("cost_usd")
            row["pass_rate"] = pass_rate(int(row["passed"]), int(row["verified"]))
        return {"runs": rows, "total": total, "limit": limit, "offset": offset,
                "filters": self.browser.run_filter_values()}

    def _run(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        run = self._run_counts(_required(params, "run"))
        if run is None:
            return None
        run["config"] = _json_cell(run.get("config"))
        run["pass_rate"] = pass_rate(int(run["passed"]), int(run["verified"]))
        _, rankings = self.browser.rankings_page(run["run_id"], limit=1)
        run["ranked_rows"] = rankings
        return run

    def _tasks(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        run_id = _required(params, "run")
        limit = _int(params, "limit", PAGE["tasks"], low=1, high=MAX_PAGE)
        offset = _int(params, "offset", 0)
        rows, total = self.browser.tasks_page(run_id, limit=limit, offset=offset, text=params.get("q"))
        for row in rows:
            outcomes = [c for c in row["cells"] if c["objective_pass"] is not None]
            row["pass_rate"] = pass_rate(sum(bool(c["objective_pass"]) for c in outcomes), len(outcomes))
        return {"run_id": run_id, "tasks": rows, "total": total, "limit": limit, "offset": offset}

    # --------------------------------------------------------------- one task

    def _task(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        run_id, task_id = _required(params, "run"), _required(params, "task")
        task = self.browser.task(run_id, task_id)
        if task is None:
            return None
        chosen = self._branch_list(params.get("branches"), task["branch_indexes"])
        branches = self.browser.branches(run_id, task_id, chosen, max_events=MAX_EVENTS)
        for branch in branches:
            branch["workspace"] = _json_cell(branch["workspace"])
            branch["components"] = _json_cell(branch["components"])
            for event in branch["events"]:
                event["payload"] = _json_cell(event["payload"])
            for verdict in branch["verdicts"]:
                verdict["details"] = _json_cell(verdict["details"])
        spec = _json_cell(task.pop("spec")) or {}
        # the reference solution is the grader's, not something a viewer of a shared bundle should carry
        spec.pop("solution", None)
        return {"run_id": run_id, "task": {**task, "spec": spec}, "shown": chosen, "branches": branches,
                "judgments": self.browser.judgments(run_id, task_id, chosen), "max_events": MAX_EVENTS}

    @staticmethod
    def _branch_list(raw: Any, stored: Sequence[int]) -> list[int]:
        if raw in (None, ""):
            return list(stored[:SIDE_BY_SIDE])
        try:
            chosen = sorted({int(part) for part in str(raw).split(",") if part.strip()})
        except ValueError:
            raise ConfigError(f"branches must be comma-separated branch indexes, not {raw!r}") from None
        if len(chosen) > MAX_SIDE_BY_SIDE:
            raise ConfigError(f"at most {MAX_SIDE_BY_SIDE} branches side by side, not {len(chosen)}")
        return chosen

    def _diff(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        run_id, task_id = _required(params, "run"), _required(params, "task")
        a, b = _int(params, "a", 0), _int(params, "b", 1)
        left, right = self.browser.workspace(run_id, task_id, a), self.browser.workspace(run_id, task_id, b)
        if left is None or right is None:
            return None
        files = workspace_diff(final_workspace(*left), final_workspace(*right))
        shown, cut = [], False
        budget = MAX_DIFF_LINES
        for entry in files:
            if budget <= 0:
                cut = True
                break
            if len(entry["lines"]) > budget:
                entry["lines"], cut = entry["lines"][:budget], True
            budget -= len(entry["lines"])
            shown.append(entry)
        return {"run_id": run_id, "task_id": task_id, "a": a, "b": b, "files": shown, "cut": cut,
                "recorded": {"a": left[0] is not None, "b": right[0] is not None}}

    # --------------------------------------------------------------- search and ranking

    def _search(self, params: Mapping[str, Any]) -> dict[str, Any]:
        run_id, text = _required(params, "run"), str(params.get("q") or "").strip()
        if len(text) < 2:
            return {"run_id": run_id, "q": text, "hits": [], "limit": MAX_HITS}
        hits = self.browser.search(run_id, text, limit=MAX_HITS)
        for hit in hits:
            hit["text"] = _snippet(hit["text"] or "", text)
        return {"run_id": run_id, "q": text, "hits": hits, "limit": MAX_HITS}

    def _rankings(self, params: Mapping[str, Any]) -> dict[str, Any]:
        run_id = _required(params, "run")
        limit = _int(params, "limit", PAGE["rankings"], low=1, high=MAX_PAGE)
        offset = _int(params, "offset", 0)
        rows, total = self.browser.rankings_page(run_id, limit=limit, offset=offset)
        for row in rows:
            row["components"] = _json_cell(row["components"])
        return {"run_id": run_id, "rankings": rows, "total": total, "limit": limit, "offset": offset,
                "plots": None}
