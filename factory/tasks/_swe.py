"""The ``swe`` format: SWE-bench-style instances as tests tasks.

A row is an instance in the SWE-bench layout (``instance_id``,
``problem_statement``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``,
``PASS_TO_PASS``; the two lists may be JSON-encoded strings, as SWE-bench
stores them). The repository at ``base_commit`` comes from a snapshot beside
the instances: ``<repos>/<instance_id>/`` (a folder) or
``<repos>/<instance_id>.tar.gz`` / ``.tgz`` / ``.tar`` / ``.zip`` (an archive;
one top-level folder in it is stripped, as in a forge's archive), with
``repos`` defaulting to the ``repos`` folder beside the instances file.

The task:

- ``files``: the snapshot, unfixed (text files; binary ones are listed in
  ``metadata.binary_files_skipped``);
- ``hidden_tests``: every file the test patch adds or changes, patched;
  ``tests``: the snapshot's other test files the listed ids run in, and its
  ``conftest.py`` files, so the agent's copies never decide them;
- ``test_command``: pytest on exactly the FAIL_TO_PASS and PASS_TO_PASS ids
  (an id that names no file or no test of the patched snapshot is an import
  error naming it);
- ``solution``: the files the gold patch changes, patched (the reference,
  never shown to the agent).

Patches are applied here, in Python, strictly (every context and removed line
must match; a hunk may move, as ``patch`` allows, but never fuzz), so an
import needs no git and never runs anything from the repository.
"""

from __future__ import annotations

import ast
import hashlib
import re
import shlex
import tarfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from factory.tasks._formats import top_level_names
from factory.tasks._importers import TASK_IMPORTERS, Importer, RowError, list_field, safe_id, text_field
from factory.tasks._sources import Source, iter_text_files

__all__ = ["PatchError", "SWEImporter", "apply_patch"]

_ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")
_MAX_SNAPSHOT_BYTES = 512 * 1024 * 1024


class PatchError(ValueError):
    """A unified diff that does not parse or does not apply."""


@dataclass
class _FilePatch:
    old: str | None  # None: the file is new
    new: str | None  # None: the file is deleted
    hunks: list[tuple[int, list[str]]]


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _path(header: str) -> str | None:
    name = header.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    if name.startswith(('"',)):
        raise PatchError(f"quoted file names are not supported: {name}")
    return name[2:] if name[:2] in ("a/", "b/") else name


def _parse_patch(text: str) -> list[_FilePatch]:
    lines = text.splitlines(keepends=True)
    patches: list[_FilePatch] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("GIT binary patch") or line.startswith("Binary files"):
            raise PatchError("binary patches are not supported")
        if line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            current = _FilePatch(_path(line[4:]), _path(lines[index + 1][4:]), [])
            patches.append(current)
            index += 2
            while index < len(lines) and lines[index].startswith("@@"):
                match = _HUNK.match(lines[index])
                if not match:
                    raise PatchError(f"bad hunk header: {lines[index].strip()}")
                old_count = int(match[2]) if match[2] is not None else 1
                new_count = int(match[4]) if match[4] is not None else 1
                body: list[str] = []
                index += 1
                seen_old = seen_new = 0
                while index < len(lines) and (seen_old < old_count or seen_new < new_count):
                    hunk_line = lines[index]
                    tag = hunk_line[:1]
                    if tag == "\\":  # "\ No newline at end of file": the line before has no newline
                        body[-1] = body[-1].rstrip("\n")
                    elif tag in (" ", "-", "+") or hunk_line in ("\n",):
                        tag = tag if tag in (" ", "-", "+") else " "
                        text_part = hunk_line[1:] if hunk_line != "\n" else "\n"
                        body.append(tag + text_part)
                        seen_old += tag in (" ", "-")
                        seen_new += tag in (" ", "+")
                    else:
                        raise PatchError(f"unexpected line in a hunk of {current.new or current.old}: "
                                         f"{hunk_line[:60]!r}")
                    index += 1
                if index < len(lines) and lines[index].startswith("\\"):
                    body[-1] = body[-1].rstrip("\n")
                    index += 1
                if seen_old != old_count or seen_new != new_count:
                    raise PatchError(f"a hunk of {current.new or current.old} ends early")
                current.hunks.append((int(match[1]), body))
            continue
        index += 1
    if not patches:
        raise PatchError("no file changes in the patch")
    return patches


def _apply_hunks(original: str, hunks: list[tuple[int, list[str]]], name: str) -> str:
    lines = original.splitlines(keepends=True)
    offset = 0
    for start, body in hunks:
        old = [line[1:] for line in body if line[0] in (" ", "-")]
        new = [line[1:] for line in body if line[0] in (" ", "+")]
        at = max(start - 1, 0) + offset if old else start + offset - (1 if start else 0)
        if lines[at:at + len(old)] != old:
            # like patch: the hunk may have moved, never changed
            candidates = [i for i in range(len(lines) - len(old) + 1) if lines[i:i + len(old)] == old]
            if not candidates:
                raise PatchError(f"{name}: a hunk at line {start} does not apply")
            at = min(candidates, key=lambda i: abs(i - at))
        lines[at:at + len(old)] = new
        offset += len(new) - len(old)
    return "".join(lines)


def apply_patch(files: Mapping[str, str], patch: str) -> tuple[dict[str, str], set[str], set[str]]:
    """Apply a unified (git) diff to text files.

    Returns:
        ``(files after, paths added or changed, paths deleted)``.

    Raises:
        PatchError: The patch does not parse, is binary, or a hunk's context is not in the file.
    """
    result = dict(files)
    changed: set[str] = set()
    deleted: set[str] = set()
    for file_patch in _parse_patch(patch):
        if file_patch.old is not None and file_patch.old not in result:
            raise PatchError(f"{file_patch.old}: the patch changes a file the snapshot does not have")
        original = result.get(file_patch.old, "") if file_patch.old is not None else ""
        if file_patch.old is None and file_patch.new in result:
            raise PatchError(f"{file_patch.new}: the patch creates a file the snapshot already has")
        updated = _apply_hunks(original, file_patch.hunks, file_patch.new or file_patch.old or "?")
        if file_patch.new is None:
            result.pop(file_patch.old, None)
            deleted.add(file_patch.old)
            continue
        if file_patch.old is not None and file_patch.old != file_patch.new:
            result.pop(file_patch.old, None)
            deleted.add(file_patch.old)
        result[file_patch.new] = updated
        changed.add(file_patch.new)
    return result, changed, deleted


def _strip_single_root(members: dict[str, bytes]) -> dict[str, bytes]:
    roots = {PurePosixPath(name).parts[0] for name in members}
    if len(roots) == 1 and all(len(PurePosixPath(name).parts) > 1 for name in members):
        return {str(PurePosixPath(*PurePosixPath(name).parts[1:])): data for name, data in members.items()}
    return members


def _read_archive(path: Path) -> dict[str, bytes]:
    """Regular files of a tar or zip archive, in memory (nothing is extracted to disk)."""
    members: dict[str, bytes] = {}
    total = 0
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                total += info.file_size
                if total > _MAX_SNAPSHOT_BYTES:
                    raise RowError(None, f"{path}: the snapshot is larger than {_MAX_SNAPSHOT_BYTES >> 20} MiB")
                members[info.filename] = archive.read(info)
    else:
        with tarfile.open(path) as archive:
            for info in archive:
                if not info.isreg():
                    continue
                total += info.size
                if total > _MAX_SNAPSHOT_BYTES:
                    raise RowError(None, f"{path}: the snapshot is larger than {_MAX_SNAPSHOT_BYTES >> 20} MiB")
                handle = archive.extractfile(info)
                members[info.name] = handle.read() if handle else b""
    cleaned = {}
    for name, data in members.items():
        pure = PurePosixPath(name.lstrip("./") if name.startswith("./") else name)
        if pure.is_absolute() or ".." in pure.parts:
            raise RowError(None, f"{path}: archive member {name!r} would leave the snapshot")
        if ".git" in pure.parts:
            continue
        cleaned[str(pure)] = data
    return _strip_single_root(cleaned)


def _decode(members: dict[str, bytes]) -> tuple[dict[str, str], list[str]]:
    text, binary = {}, []
    for name, data in sorted(members.items()):
        try:
            text[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary.append(name)
            continue
        if "\x00" in text[name]:
            binary.append(name)
            del text[name]
    return text, binary


def _check_test_id(test_id: str, files: Mapping[str, str], column: str) -> str:
    """The file a pytest node id runs in, or a :class:`RowError` naming the id."""
    if "::" not in test_id:
        if test_id in files:
            return test_id
        raise RowError(column, f"test id {test_id!r} is not a pytest node id (path::name) of this repository")
    path, *names = test_id.split("::")
    if path not in files:
        raise RowError(column, f"test id {test_id!r}: no file {path!r} in the snapshot with the test patch applied")
    try:
        scope: ast.AST = ast.parse(files[path])
    except SyntaxError as exc:
        raise RowError(column, f"test id {test_id!r}: {path} is not valid Python ({exc.msg}, line {exc.lineno})") \
            from exc
    for depth, name in enumerate(names):
        bare = name.split("[", 1)[0]
        body = scope.body if isinstance(scope, (ast.Module, ast.ClassDef)) else []
        found = top_level_names(ast.Module(body=body, type_ignores=[])).get(bare)
        if found is None:
            inherited = isinstance(scope, ast.ClassDef) and scope.bases and depth == len(names) - 1
            if inherited:  # a test method may come from a base class defined elsewhere
                return path
            raise RowError(column, f"test id {test_id!r}: {path} defines no {bare!r}")
        scope = found
    return path


@TASK_IMPORTERS.register("swe")
class SWEImporter(Importer):
    """SWE-bench-style instances with repository snapshots (see the module docstring)."""

    name = "swe"
    columns = ("instance_id", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")

    def prepare(self, source: Source) -> None:
        repos = self.options.get("repos")
        base = source.path.parent if source.path.is_file() else source.path
        self.repos = Path(repos) if repos is not None else base / "repos"

    def source_id(self, row: Mapping[str, Any], number: int) -> str | None:
        return str(row.get("instance_id"))

    def _snapshot(self, instance_id: str) -> tuple[dict[str, bytes], str]:
        folder = self.repos / instance_id
        if folder.is_dir():
            members = {}
            for relative, file in iter_text_files(folder):
                if file.is_symlink():
                    continue
                members[relative] = file.read_bytes()
            return members, str(folder)
        for suffix in _ARCHIVES:
            archive = self.repos / f"{instance_id}{suffix}"
            if archive.is_file():
                try:
                    return _read_archive(archive), str(archive)
                except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
                    raise RowError("instance_id", f"cannot read the snapshot {archive}: {exc}") from exc
        raise RowError("instance_id", f"no snapshot of {instance_id!r}: expected the folder {folder} or "
                                      f"{folder}.tar.gz/.tgz/.tar/.zip (--repos DIR)")

    def convert(self, row: Mapping[str, Any], number: int) -> dict[str, Any]:
        instance_id = text_field(row, "instance_id").strip()
        statement = text_field(row, "problem_statement")
        gold = text_field(row, "patch")
        test_patch = text_field(row, "test_patch")
        fail_to_pass = list_field(row, "FAIL_TO_PASS")
        pass_to_pass = list_field(row, "PASS_TO_PASS")
        if not fail_to_pass:
            raise RowError("FAIL_TO_PASS", "no test: an instance needs at least one test the fix makes pass")
        members, where = self._snapshot(instance_id)
        snapshot, binary = _decode(members)
        try:
            tested, test_changed, test_deleted = apply_patch(snapshot, test_patch)
        except PatchError as exc:
            raise RowError("test_patch", f"does not apply to the snapshot: {exc}") from exc
        try:
            fixed, fix_changed, fix_deleted = apply_patch(snapshot, gold)
        except PatchError as exc:
            raise RowError("patch", f"does not apply to the snapshot: {exc}") from exc
        if fix_deleted:
            raise RowError("patch", f"deletes {', '.join(sorted(fix_deleted))}: a reference solution can only "
                                    "add or change files")
        if test_deleted:
            raise RowError("test_patch", f"deletes {', '.join(sorted(test_deleted))}: hidden tests can only be "
                                         "added or changed")
        if fix_changed & test_changed:
            raise RowError("patch", f"changes test files the test patch also changes: "
                                    f"{', '.join(sorted(fix_changed & test_changed))}")
        run_in: set[str] = set()
        for column, ids in (("FAIL_TO_PASS", fail_to_pass), ("PASS_TO_PASS", pass_to_pass)):
            for test_id in ids:
                run_in.add(_check_test_id(test_id, tested, column))
        hidden = {path: tested[path] for path in sorted(test_changed)}
        visible = {path: snapshot[path] for path in sorted(snapshot)
                   if path not in hidden and (path in run_in or PurePosixPath(path).name == "conftest.py")}
        files = {path: text for path, text in snapshot.items() if path not in hidden and path not in visible}
        solution = {path: fixed[path] for path in sorted(fix_changed)}
        if set(solution) & set(visible):
            raise RowError("patch", f"changes test files: {', '.join(sorted(set(solution) & set(visible)))}")
        command = "python -m pytest -q " + " ".join(shlex.quote(t) for t in [*fail_to_pass, *pass_to_pass])
        digest = hashlib.sha256()
        for path in sorted(members):
            digest.update(path.encode() + b"\0" + hashlib.sha256(members[path]).hexdigest().encode() + b"\n")
        metadata: dict[str, Any] = {
            "instance_id": instance_id, "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass,
            "snapshot_sha256": "sha256:" + digest.hexdigest(),
        }
        for column in ("repo", "base_commit", "version", "created_at"):
            if isinstance(row.get(column), str):
                metadata[column] = row[column]
        if binary:
            metadata["binary_files_skipped"] = binary
        return {
            "id": safe_id(instance_id),
            "prompt": (f"{statement.strip()}\n\nThe repository is in your working directory. Change its code so "
                       "that this issue is resolved. Tests that check the fix are hidden; the repository's "
                       "existing tests must keep passing."),
            "files": files,
            "tests": visible,
            "hidden_tests": hidden,
            "test_command": command,
            "solution": solution,
            "metadata": metadata,
        }

