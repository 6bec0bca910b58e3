"""Host folders of sandboxes: one per run and process, removed once their process is gone.

Every host directory a sandbox makes (its workspace, the private copies of
read-only files, a tmpfs mount point, the channel between two sandboxes)
lives under ``<tmp>/factory-sandboxes/<run>-<pid>/`` (``adhoc`` outside a run:
see :func:`sandbox_owner`). The owning process holds an exclusive ``flock``
on that folder for as long as it lives, and the kernel lets go of it when
the process ends, however it ends (``kill -9`` included).

A sandbox removes its own directories when it closes, and a process its
folders when it exits; a process killed mid-run cannot. :func:`sweep_sandbox_folders`, run when a fork starts or
resumes, removes every folder whose lock it can take: its owner is gone.
The folders of a live process, this one included, keep their lock and are
never touched; no age is guessed.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from factory.errors import SandboxError

__all__ = ["folder_in_use", "sandbox_folder", "sandbox_owner", "sandbox_root", "sweep_sandbox_folders"]

_ROOT_NAME = "factory-sandboxes"
_ADHOC = "adhoc"
_O_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Who the sandboxes being made belong to: set around a run, inherited by the tasks and threads it starts.
_owner: ContextVar[str] = ContextVar("factory_sandbox_owner", default=_ADHOC)


@dataclass(frozen=True)
class _Held:
    folder: Path
    fd: int  # the open folder, flock'ed: closed only when the process ends
    pid: int


_held: dict[tuple[Path, str], _Held] = {}  # (root, owner) -> this process's locked folder
_held_lock = threading.Lock()
_release_at_exit: list[bool] = []  # registered once, on the first claim (never at import)


def sandbox_root() -> Path:
    """``<tmp>/factory-sandboxes``, where every process's sandbox folders are (``tempfile.gettempdir()``)."""
    return Path(tempfile.gettempdir()) / _ROOT_NAME


def _label(owner: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", owner)[:80].strip(".") or _ADHOC


@contextlib.contextmanager
def sandbox_owner(owner: str) -> Iterator[None]:
    """Within the block (and the tasks and threads it starts), sandboxes go in ``owner``'s folder.

    Args:
        owner: A run id; characters other than letters, digits, ``.``, ``_``
            and ``-`` become ``_``.
    """
    token = _owner.set(_label(owner))
    try:
        yield
    finally:
        _owner.reset(token)


def _root() -> Path:
    root = sandbox_root()
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(root)
    except OSError as exc:
        raise SandboxError(f"cannot make the sandbox folder {root}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(found.st_mode):
        raise SandboxError(f"{root} is not a directory (a link or a file is in the way): remove it")
    if found.st_uid == os.getuid() and stat.S_IMODE(found.st_mode) != 0o1777:
        # Every user's processes put their folders here; sticky, so none removes another's.
        os.chmod(root, 0o1777)
    elif found.st_uid not in (os.getuid(), 0) and not found.st_mode & stat.S_ISVTX:
        raise SandboxError(f"{root} belongs to another user and is not sticky: remove it, or set TMPDIR")
    return root


def _lock(path: Path, *, wait: bool) -> int | None:
    """An open, exclusively locked descriptor of the folder ``path``; None if its lock is held (or it is gone)."""
    try:
        fd = os.open(path, _O_FOLDER)
    except OSError:  # gone, a link, or another user's
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        # The folder at ``path`` must still be the one locked: a sweep may have removed it meanwhile.
        if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
            raise FileNotFoundError(path)
    except OSError:
        os.close(fd)
        return None
    return fd


def _claim(owner: str) -> _Held:
    root = _root()
    pid = os.getpid()
    for attempt in range(100):
        name = f"{owner}-{pid}" if attempt == 0 else f"{owner}-{pid}-{secrets.token_hex(3)}"
        folder = root / name
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            # Left by a dead process that had this pid: ours once its lock is free (a live one keeps it).
            fd = _lock(folder, wait=False)
            if fd is None:
                continue
            for entry in list(folder.iterdir()):
                _remove(entry)
            return _Held(folder, fd, pid)
        except OSError as exc:
            raise SandboxError(f"cannot make the sandbox folder {folder}: {exc.strerror or exc}") from exc
        # Waits only while a sweep that took the fresh folder's lock first removes it (then: try again).
        fd = _lock(folder, wait=True)
        if fd is not None:
            return _Held(folder, fd, pid)
    raise SandboxError(f"cannot claim a sandbox folder under {root}")


def sandbox_folder() -> Path:
    """This process's folder for the current owner (see :func:`sandbox_owner`), made and locked on first use.

    Raises:
        SandboxError: The folder cannot be made.
    """
    key = (sandbox_root(), _owner.get())
    with _held_lock:
        held = _held.get(key)
        # After os.fork() a child finds its parent's entry: the folder is the parent's, not its own.
        if held is None or held.pid != os.getpid() or not held.folder.is_dir():
            held = _held[key] = _claim(key[1])
            if not _release_at_exit:
                atexit.register(_release)
                _release_at_exit.append(True)
        return held.folder


def _release() -> None:
    """At exit, this process's folders go (its sandboxes are closed); a killed process's wait for the sweep."""
    with _held_lock:
        for key, held in list(_held.items()):
            if held.pid == os.getpid():
                shutil.rmtree(held.folder, ignore_errors=True)
                os.close(held.fd)
                del _held[key]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def folder_in_use(path: str | Path) -> bool:
    """Whether a live process still holds the sandbox folder ``path`` (False once it is gone or unlocked).

    What lives outside the host's filesystem (a docker container, say) names
    its folder, so that it can be told from what a dead process left behind.
    """
    folder = Path(path)
    fd = _lock(folder, wait=False)
    if fd is None:
        return folder.is_dir()  # locked by its (live) owner, this process included; or gone
    os.close(fd)
    return False


def sweep_sandbox_folders() -> list[Path]:
    """Remove the sandbox folders whose process is gone; return them.

    A folder goes when its lock can be taken: the process that held it has
    ended. A live process's folders (this one's included) are left alone.
    """
    root = sandbox_root()
    try:
        entries = list(os.scandir(root))
    except OSError:  # no folder yet: nothing to sweep
        return []
    removed = []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        fd = _lock(path, wait=False)
        if fd is None:
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(path)
    return removed
