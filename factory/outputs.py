"""Output files: written whole or not at all, and never over the store or an input.

Every file a command writes (an export, its manifest and dataset card, a
plot, a training report) goes through :class:`OutputFiles`. Each target is
checked first: refused when it resolves (through symlinks, or as a hard link)
to a protected path, the store or an input of the command. It is then
written to a temporary file beside it, on the same filesystem, and renamed
into place only when every file of the set is complete. On any error the
temporary files (and the folders made for them) are removed, and each target
is as it was.

A disk (or quota) that fills mid-write is an :class:`~factory.errors.OutputSpaceError`
naming the operation and the path, raised once the staged files are gone.
A process killed mid-write cannot remove its staged files: each is named
``.NAME.<pid>-<hex>.tmp.EXT`` and held under an exclusive ``flock`` while
its writer lives (the kernel lets go however the process ends, ``kill -9``
included), so the next writer into that folder removes every staged file
whose lock it can take (:func:`sweep_staged`) and never a live one's; no age
is guessed, as with the sandboxes' folders (``factory.sandbox._scratch``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from factory.errors import ConfigError, OutputSpaceError

__all__ = ["TRAINED_MARKER", "OutputFiles", "disk_full", "is_staged", "refuse_protected", "staged_lock",
           "staged_name", "sweep_staged", "unfinished_training", "write_output"]

#: A staged file or folder: ``.NAME.<pid>-<8 hex>.tmp`` and the target's extension, if any.
_STAGED = re.compile(r"^\..+\.\d+-[0-9a-f]{8}\.tmp(\.[^.]*)?$")
_FULL_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file too large for the filesystem"}
# What libraries that wrap the OS error in their own exception (DuckDB, safetensors, polars) say instead.
_FULL_TEXTS = {"no space left on device": "no space left on device", "os error 28": "no space left on device",
               "disk quota exceeded": "disk quota exceeded", "file too large": "file too large for the filesystem"}

#: What a command must not write over: a description (``"the store (--db)"``) -> its path (None: not given).
_Protected = Mapping[str, "str | Path | None"]


def disk_full(exc: BaseException | None) -> str | None:
    """Why ``exc`` (or an exception it came from) is a full disk or quota, in words; None if it is not.

    Libraries that wrap the OS's ``ENOSPC`` in their own exception (DuckDB's
    ``IOException``, safetensors' ``SafetensorError``, polars) are told by their message.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return _FULL_ERRNOS[exc.errno]
        text = str(exc).lower()
        for needle, words in _FULL_TEXTS.items():
            if needle in text:
                return words
        exc = exc.__cause__ or exc.__context__
    return None


def is_staged(path: str | Path) -> bool:
    """Whether ``path`` or a folder above it is a staged (not yet complete) output."""
    return any(_STAGED.match(part) for part in Path(path).parts)


#: An empty file ``factory train`` puts in the model folders it writes: they are finished only beside a
#: ``train_result.json`` (written last), which is how a model loader tells a training killed while saving.
TRAINED_MARKER = ".factory-trained"
#: The report ``factory train`` writes last into its output folder.
_TRAIN_RESULT = "train_result.json"


def unfinished_training(folder: str | Path) -> str | None:
    """Why ``folder`` is a model that ``factory train`` never finished writing; None if it is not one.

    It is one inside a staged folder (a training still saving, or killed
    while saving), or a folder ``factory train`` wrote with no
    ``train_result.json`` beside it (killed between the two).
    """
    path = Path(folder).expanduser()
    resolved = path.resolve()
    if is_staged(resolved):
        return f"{path} is not a finished training output (a staged folder: its training was still saving or killed)"
    if (path / TRAINED_MARKER).exists() and not (resolved.parent / _TRAIN_RESULT).is_file():
        return (f"{path} is not a finished training output: no {_TRAIN_RESULT} beside it (its training was "
                "interrupted while saving); train again")
    return None


def staged_lock(path: Path) -> int:
    """An open descriptor of the staged file or folder ``path``, exclusively ``flock``'ed: its owner is alive.

    Raises:
        OSError: It cannot be opened or locked.
    """
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY if path.is_dir() else os.O_RDONLY) | os.O_CLOEXEC
                 | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def sweep_staged(folder: str | Path) -> list[Path]:
    """Remove the staged files and folders in ``folder`` whose writer is gone; return them.

    One goes when its lock can be taken: the process that staged it has
    ended (killed mid-write, say). A live writer's, this process's included, are left alone.
    """
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no folder yet: nothing to sweep
        return []
    removed = []
    for entry in entries:
        if not _STAGED.match(entry.name) or entry.is_symlink():
            continue
        path = Path(entry.path)
        try:
            fd = staged_lock(path)
        except OSError:  # held by a live writer, or gone meanwhile
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        removed.append(path)
    return removed


def staged_name(target: Path) -> Path:
    """A fresh staged path beside ``target``: ``.STEM.<pid>-<hex>.tmp`` and its extension (libraries go by it)."""
    return target.with_name(f".{target.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{target.suffix}")


def _same_file(target: Path, other: Path) -> bool:
    if target.resolve() == other.resolve():
        return True
    try:
        return os.path.samefile(target, other)  # a hard link, or another path to the same file
    except OSError:  # one of them does not exist
        return False


def refuse_protected(target: str | Path, protected: _Protected) -> Path:
    """Check that ``target`` is none of the ``protected`` paths, symlinks and hard links resolved.

    Returns:
        ``target`` as a Path.

    Raises:
        ConfigError: It is one of them (naming which).
    """
    target = Path(target)
    for description, path in protected.items():
        if path is not None and _same_file(target, Path(path)):
            raise ConfigError(f"refusing to write {target}: it is {description} ({path})")
    return target


class OutputFiles:
    """A set of output files renamed into place together, once all are complete.

    Use as a context manager: :meth:`stage` each target and write the path it
    returns; leaving the block without an error renames every staged file
    onto its target, an error removes them all.

    Args:
        protected: Paths no target may be (see :func:`refuse_protected`).
        operation: What is being written, for the message of a full disk (``export``, ``rank plot``).

    Raises:
        OutputSpaceError: The disk filled while writing (leaving the block): the staged files are removed.
    """

    def __init__(self, protected: _Protected | None = None, operation: str = "write"):
        self._protected = dict(protected or {})
        self.operation = operation
        self._staged: dict[Path, Path] = {}
        self._locks: dict[Path, tuple[int, int]] = {}  # staged path -> (its locked descriptor, its mtime when made)
        self._made: list[Path] = []  # folders made for targets, removed again when nothing is kept
        self._swept: set[Path] = set()

    def check(self, target: str | Path) -> Path:
        """Refuse ``target`` now, before any work: protected (see :func:`refuse_protected`) or a directory.

        Raises:
            ConfigError: ``target`` is protected or a directory.
        """
        target = refuse_protected(target, self._protected)
        if target.is_dir():
            raise ConfigError(f"refusing to write {target}: it is a directory")
        return target

    def stage(self, target: str | Path) -> Path:
        """The temporary path to write ``target``'s content to (beside it, same extension).

        Raises:
            ConfigError: ``target`` is protected or a directory.
        """
        target = self.check(target)
        if target in self._staged:
            return self._staged[target]
        missing = [parent for parent in [target.parent, *target.parent.parents] if not parent.exists()]
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigError(f"cannot create {folder} for {target}: {exc.strerror or exc}") from exc
            self._made.append(folder)
        if target.parent not in self._swept:  # what writers killed here earlier left (ours are locked)
            sweep_staged(target.parent)
            self._swept.add(target.parent)
        temporary = staged_name(target)
        try:  # made now and locked while this process lives: a sweep tells it from a dead writer's
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            fd = staged_lock(temporary)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            self.discard()
            if disk_full(exc):
                raise OutputSpaceError(self.operation, str(target), disk_full(exc) or "") from exc
            raise ConfigError(f"cannot write {target}: {exc.strerror or exc}") from exc
        self._locks[temporary] = (fd, os.fstat(fd).st_mtime_ns)
        self._staged[target] = temporary
        return temporary

    def staged(self, target: str | Path) -> Path:
        """The temporary path already staged for ``target``."""
        return self._staged[Path(target)]

    def commit(self) -> list[Path]:
        """Rename every staged file onto its target; return the targets.

        Raises:
            ConfigError: A staged file was never written.
        """
        unwritten = [str(target) for target, temporary in self._staged.items() if not self._written(temporary)]
        if unwritten:
            self.discard()
            raise ConfigError(f"nothing was written for {', '.join(unwritten)}")
        targets = list(self._staged)
        try:
            for target in targets:
                os.replace(self._staged[target], target)
                del self._staged[target]
        finally:
            self.discard()  # what a failed rename left staged; the folders made now hold the targets
        return targets

    def _written(self, temporary: Path) -> bool:
        try:
            found = os.stat(temporary)
        except OSError:
            return False
        made = self._locks.get(temporary)
        return made is None or found.st_size > 0 or found.st_mtime_ns != made[1]

    def _unlock(self) -> None:
        for fd, _ in self._locks.values():
            os.close(fd)
        self._locks.clear()

    def discard(self) -> None:
        """Remove every staged file (and the folders made for them); the targets stay as they were."""
        for temporary in self._staged.values():
            temporary.unlink(missing_ok=True)
        self._staged.clear()
        self._unlock()
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:  # something else was put there meanwhile: not ours to remove
                pass
        self._made.clear()

    def __enter__(self) -> OutputFiles:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc_type is None:
            try:
                self.commit()
            except OSError as error:  # the renames: a full disk is one line too
                self._raise_if_full(error)
                raise
        else:
            inner = exc.path if isinstance(exc, OutputSpaceError) else None  # a nested writer's, on our staged file
            named = self._target_of(inner or getattr(exc, "filename", None))
            ours = inner is not None and any(str(t) == inner for t in self._staged.values())
            self.discard()
            if ours:
                raise OutputSpaceError(self.operation, str(named), exc.detail) from exc
            self._raise_if_full(exc, named)

    def _target_of(self, filename: object) -> str | None:
        """The target whose staged file ``filename`` is (an OSError names the file it failed on)."""
        if filename:
            for target, temporary in self._staged.items():
                if str(temporary) == str(filename) or Path(str(filename)) == target:
                    return str(target)
        return str(next(iter(self._staged))) if self._staged else None

    def _raise_if_full(self, exc: BaseException | None, named: str | None = None) -> None:
        why = disk_full(exc)
        if why is not None and not isinstance(exc, OutputSpaceError):
            path = named or getattr(exc, "filename", None) or "the output"
            raise OutputSpaceError(self.operation, str(path), why) from exc


def write_output(target: str | Path, write: Callable[[Path], object], protected: _Protected | None = None,
                 operation: str = "write") -> Path:
    """Write one file atomically: ``write(path)`` writes a temporary file, renamed onto ``target`` when it returns.

    Raises:
        ConfigError: ``target`` is protected or a directory.
        OutputSpaceError: The disk filled (nothing was replaced; the staged file is removed).
    """
    with OutputFiles(protected, operation) as outputs:
        write(outputs.stage(target))
    return Path(target)
