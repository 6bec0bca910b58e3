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
import hashlib
import json
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.ranking import wilson_interval
from factory.store import RunBrowser, Store, file_status

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
    "outputs": ("run", "limit", "offset"),
    "output": ("run", "id"),
}
#: Page sizes: the defaults the front end asks for, and the most any request gets.
PAGE = {"runs": 50, "tasks": 50, "rankings": 100, "outputs": 20}
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
#: Rank plots shown on a run's ranking page (its newest).
RANK_PLOTS = 3
#: Characters of an export's dataset card shown with its manifest.
MAX_CARD = 20_000
#: An image the viewer serves: ``<artifact id>.png`` (the artifact's own file) or ``<id>-<n>.png`` (its n-th
#: companion file); never a path.
IMAGE_NAME = re.compile(r"([0-9a-f]{32})(?:-([0-9]{1,3}))?\.png")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
        plots, _ = self.browser.artifacts_page(run_id, limit=RANK_PLOTS, kind="rank_plot")
        return {"run_id": run_id, "rankings": rows, "total": total, "limit": limit, "offset": offset,
                "plots": [_artifact(row) for row in plots]}

    # --------------------------------------------------------------- outputs: plots, exports, models

    def _outputs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        run_id = _required(params, "run")
        limit = _int(params, "limit", PAGE["outputs"], low=1, high=MAX_PAGE)
        offset = _int(params, "offset", 0)
        rows, total = self.browser.artifacts_page(run_id, limit=limit, offset=offset)
        return {"run_id": run_id, "outputs": [_artifact(row) for row in rows], "total": total, "limit": limit,
                "offset": offset}

    def _output(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        run_id, artifact_id = _required(params, "run"), _required(params, "id")
        row = self.browser.artifact(artifact_id)
        if row is None or row["run_id"] != run_id:
            return None
        answer = _artifact(row)
        card = next((f for f in answer["files"] if f["role"] == "dataset card"), None)
        if card is not None and card["status"] == "matches":  # the recorded card, not whatever is there now
            with contextlib.suppress(OSError, UnicodeDecodeError), open(card["path"], encoding="utf-8") as handle:
                answer["card_text"] = handle.read(MAX_CARD)
        return answer

    def image(self, name: str) -> bytes | None:
        """The bytes of a recorded PNG, by its name in the viewer (see :data:`IMAGE_NAME`), or None.

        Served only when ``name`` names a recorded artifact (or one of its companion files) whose file is a
        PNG still holding exactly the recorded bytes (its sha256): never a path taken from a request.
        """
        match = IMAGE_NAME.fullmatch(name)
        if match is None:
            return None
        with self._reading() as browser:
            row = browser.artifact(match.group(1))
        if row is None:
            return None
        if match.group(2) is None:
            path, digest = row["path"], row["sha256"]
        else:
            files = (_json_cell(row["meta"]) or {}).get("files") or []
            index = int(match.group(2))
            if index >= len(files) or not isinstance(files[index], Mapping):
                return None
            path, digest = files[index].get("path"), files[index].get("sha256")
        if not path or not digest or not str(path).lower().endswith(".png"):
            return None
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            return None
        if not data.startswith(_PNG_MAGIC) or "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            return None
        return data


def _artifact(row: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded artifact as the viewer shows it: whether its files are still as recorded, and image names.

    ``status`` (and each companion's): ``matches``, ``changed``, ``missing`` or ``no file`` (a power verdict
    drawn without a plot). ``image``: the name the viewer serves the file under, for a PNG that matches.
    """
    meta = _json_cell(row["meta"]) or {}
    answer = {key: row[key] for key in ("artifact_id", "run_id", "kind", "path", "sha256", "created_at")}
    answer["status"] = file_status(row["path"], row["sha256"])
    answer["image"] = (f"{row['artifact_id']}.png" if answer["status"] == "matches"
                       and row["path"].lower().endswith(".png") else None)
    files = []
    for index, entry in enumerate(meta.pop("files", None) or []):
        if not isinstance(entry, Mapping):
            continue
        status = file_status(entry.get("path"), entry.get("sha256"))
        image = (f"{row['artifact_id']}-{index}.png" if status == "matches"
                 and str(entry.get("path") or "").lower().endswith(".png") else None)
        files.append({"role": entry.get("role"), "path": entry.get("path"), "sha256": entry.get("sha256"),
                      "status": status, "image": image})
    answer["files"], answer["meta"] = files, meta
    return answer
