"""``factory view --bundle DIR``: the viewer as a static site that opens from ``file://``, no server.

A browser does not let a page ``fetch()`` a ``file://`` URL, so every answer
the front end would ask the server for is written as a small script that
hands its JSON to the page (``window.factoryBundle.put(key, answer)``); the
page loads it with a ``<script>`` element, which ``file://`` allows. The
answers are :class:`~factory.view.ViewData`'s, for the requests the front end
makes with its default page sizes: every page of runs, of each run's tasks and
ranking, each task's branches in windows of :data:`~factory.view._data.SIDE_BY_SIDE`
with the diffs of every pair inside a window, each run's recorded outputs
(plots, power verdicts, exports, models: the PNGs copied into ``files/``),
and a search corpus per run (final answers and tool outputs) that the page
searches itself.

The site is written into a folder beside ``DIR`` and renamed into place
whole; an existing ``DIR`` is replaced only when it is an earlier bundle.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.outputs import staged_lock, staged_name, sweep_staged
from factory.view._app import asset
from factory.view._data import MAX_HITS, PAGE, SIDE_BY_SIDE, ViewData

__all__ = ["BUNDLE_MARKER", "bundle_key", "write_bundle"]

#: The file that marks a folder as a bundle this command wrote (and may therefore replace).
BUNDLE_MARKER = ".factory-view-bundle"
#: Tool outputs and answers in a run's search corpus, and the characters kept of each.
MAX_CORPUS = 20_000
CORPUS_TEXT = 2_000


def bundle_key(name: str, params: Mapping[str, Any]) -> str:
    """The key of one answer: ``name?k=v&...`` with parameters sorted and empty ones left out (as app.js builds it)."""
    parts = [f"{k}={params[k]}" for k in sorted(params) if params[k] not in (None, "")]
    return name + ("?" + "&".join(parts) if parts else "")


def _pages(total: int, size: int) -> range:
    return range(0, max(total, 1), size)


def _requests(data: ViewData) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every request the front end can make of a bundle, in the order the pages need them."""
    first = data.answer("runs", {})
    assert first is not None
    for offset in _pages(first["total"], PAGE["runs"]):
        page = data.answer("runs", {"offset": offset}) if offset else first
        yield "runs", {"offset": offset or None}
        for run in page["runs"] if page else []:
            run_id = run["run_id"]
            yield "run", {"run": run_id}
            tasks = data.answer("tasks", {"run": run_id})
            for t_offset in _pages(tasks["total"] if tasks else 0, PAGE["tasks"]):
                yield "tasks", {"run": run_id, "offset": t_offset or None}
                listed = data.answer("tasks", {"run": run_id, "offset": t_offset}) if t_offset else tasks
                for task in listed["tasks"] if listed else []:
                    indexes = [cell["branch_index"] for cell in task["cells"]]
                    for start in range(0, max(len(indexes), 1), SIDE_BY_SIDE):
                        window = indexes[start:start + SIDE_BY_SIDE]
                        branches = None if start == 0 else ",".join(str(i) for i in window)
                        yield "task", {"run": run_id, "task": task["task_id"], "branches": branches}
                        for a, b in itertools.permutations(window, 2):
                            yield "diff", {"run": run_id, "task": task["task_id"], "a": a, "b": b}
            rankings = data.answer("rankings", {"run": run_id})
            for r_offset in _pages(rankings["total"] if rankings else 0, PAGE["rankings"]):
                yield "rankings", {"run": run_id, "offset": r_offset or None}
            outputs = data.answer("outputs", {"run": run_id})
            for o_offset in _pages(outputs["total"] if outputs else 0, PAGE["outputs"]):
                yield "outputs", {"run": run_id, "offset": o_offset or None}
                listed = data.answer("outputs", {"run": run_id, "offset": o_offset}) if o_offset else outputs
                for output in listed["outputs"] if listed else []:
                    yield "output", {"run": run_id, "id": output["artifact_id"]}


def _images(answer: Any) -> Iterator[str]:
    """The image names an answer shows (its ``image`` fields, at any depth)."""
    if isinstance(answer, Mapping):
        for key, value in answer.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(answer, list):
        for value in answer:
            yield from _images(value)


def _corpus(data: ViewData, run_id: str) -> dict[str, Any]:
    """A run's searchable text: final answers and tool outputs, capped (the page searches it itself)."""
    entries = data.corpus(run_id, limit=MAX_CORPUS, chars=CORPUS_TEXT)
    return {"run_id": run_id, "entries": entries, "cut": len(entries) >= MAX_CORPUS, "limit": MAX_HITS}


def _script(key: str, answer: Any) -> str:
    # </script> cannot occur: json.dumps escapes nothing, so escape '<' to keep the text inert in any page
    payload = json.dumps(answer, ensure_ascii=False).replace("<", "\\u003c")
    return f"window.factoryBundle.put({json.dumps(key)}, {payload});\n"


def write_bundle(data: ViewData, folder: str | Path) -> dict[str, int]:
    """Write the viewer and every answer it needs as a static site in ``folder`` (opens from ``file://``).

    Args:
        data: What to show.
        folder: The site's folder; replaced whole if it is an earlier bundle, refused if it holds anything else.

    Returns:
        ``{"answers": ..., "bytes": ..., "images": ...}``: how many answers were written, their size, and how
        many recorded plots were copied into ``files/``.

    Raises:
        ConfigError: ``folder`` exists and is not an empty folder or an earlier bundle.
    """
    target = Path(folder)
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / BUNDLE_MARKER).exists())):
        raise ConfigError(f"refusing to write the bundle into {target}: it exists and is not an earlier bundle "
                          "(choose a new or empty folder)")
    if not target.parent.exists():
        raise ConfigError(f"cannot write {target}: folder {target.parent} does not exist")
    # The common staged name (.NAME.<pid>-<hex>.tmp), locked while this process lives: a bundle killed
    # mid-write leaves a folder the next staged writer into this folder sweeps (factory.outputs).
    sweep_staged(target.parent)
    staging = staged_name(target)
    staging.mkdir()
    lock = staged_lock(staging)
    try:
        (staging / "assets").mkdir()
        (staging / "data").mkdir()
        written = size = images = 0
        index: dict[str, str] = {}
        runs: list[str] = []
        for name, params in _requests(data):
            key = bundle_key(name, params)
            if key in index:
                continue
            answer = data.answer(name, params)
            if answer is None:
                continue
            if name == "run":
                runs.append(params["run"])
            file = f"data/{len(index):06d}.js"
            text = _script(key, answer)
            (staging / file).write_text(text, encoding="utf-8")
            index[key] = file
            written, size = written + 1, size + len(text)
            for image in _images(answer):  # the recorded plots it shows, copied (only while as recorded)
                copy = staging / "files" / image
                if not copy.exists():
                    png = data.image(image)
                    if png is not None:
                        copy.parent.mkdir(exist_ok=True)
                        copy.write_bytes(png)
                        images += 1
        for run_id in runs:
            key = bundle_key("corpus", {"run": run_id})
            file = f"data/{len(index):06d}.js"
            text = _script(key, _corpus(data, run_id))
            (staging / file).write_text(text, encoding="utf-8")
            index[key], written, size = file, written + 1, size + len(text)
        (staging / "data" / "index.js").write_text(
            "window.factoryBundle = {files: " + json.dumps(index).replace("<", "\\u003c") + ", answers: {}, "
            "put: function (key, answer) { this.answers[key] = answer; }};\n", encoding="utf-8")
        html = asset("index.html").replace("<!--bundle-->", '<script src="data/index.js"></script>')
        (staging / "index.html").write_text(html, encoding="utf-8")
        for name in ("app.js", "app.css"):
            (staging / "assets" / name).write_text(asset(name), encoding="utf-8")
        (staging / BUNDLE_MARKER).write_text("written by factory view --bundle\n", encoding="utf-8")
        if target.exists():
            old = staged_name(target)  # the earlier bundle, on its way out: swept too if this process dies now
            target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(lock)
    return {"answers": written, "bytes": size, "images": images}
