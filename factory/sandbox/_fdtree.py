"""Link-safe file operations on a directory tree, from a descriptor of its root.

The standard library only, and no import of the package, on purpose: the
host's :class:`~factory.sandbox._host.HostWorkspace` builds on :class:`FdTree`,
and the docker backend runs this module's own source inside its containers
(``python -I -c``), so that the host and a container apply one set of rules to
a tree the sandbox's processes write: every path is walked one component at a
time from a directory descriptor, no symlink is ever followed (not even one
pointing inside), and only regular files are opened (never a FIFO or a device,
which would block or act).
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator, Sequence
from typing import NamedTuple

__all__ = ["Collected", "FdTree", "PathRefused", "is_exact_path", "workspace_parts"]

READ_CAP = 4_000_000  # bytes read_file returns at most
_READ_CAP = READ_CAP
_MAX_DEPTH = 64  # directory levels walked below the workspace root
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class PathRefused(Exception):
    """A path the tree refuses: outside it, a link or special file in the way, missing, or read-only."""


class Collected(NamedTuple):
    """Everything a tree holds (see :class:`~factory.sandbox.WorkspaceFiles`, which the host builds from it)."""

    files: dict[str, bytes]
    symlinks: dict[str, str]
    special: dict[str, str]
    oversized: tuple[str, ...]
    truncated: bool


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else bytes(content)


def _kind(mode: int) -> str:
    """What a non-regular file is, as collected workspaces and error messages name it."""
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char-device"), (stat.S_ISBLK, "block-device")):
        if test(mode):
            return name
    return "unknown" if not stat.S_ISREG(mode) else "file"


def workspace_parts(rel: str, error: type[Exception] = PathRefused) -> list[str]:
    """A workspace-relative path as its components, normalized lexically (``[]``: the root).

    Lexical ``..`` handling is exact here because no symlink is ever followed.

    Raises:
        error: For absolute paths, NUL bytes, or ``..`` escapes.
    """
    text = str(rel).strip()
    if text.startswith("/workspace/"):
        text = text[len("/workspace/"):]
    elif text == "/workspace":
        text = "."
    if not text or "\x00" in text or text.startswith("/"):
        raise error(f"path {rel!r} must be relative to the workspace")
    norm = posixpath.normpath(text)
    if norm == ".." or norm.startswith("../"):
        raise error(f"path {rel!r} is outside the workspace")
    return [] if norm == "." else norm.split("/")


def is_exact_path(name: str) -> bool:
    """Whether ``name`` is a workspace path exactly as a walk names one, needing no stripping or normalizing.

    A collected workspace keeps every name as it is (``'main.py '`` is not
    ``main.py``); one that is not exact cannot be written back into a sandbox as itself.
    """
    try:
        return bool(name) and workspace_parts(name) == name.split("/")
    except PathRefused:
        return False

class FdTree:
    """File operations confined to the tree below a directory descriptor.

    Attributes:
        error: The exception type every refusal raises (the host's backends use ``SandboxPathError``).
        readonly: Tree-relative paths :meth:`write` refuses.
    """

    error: type[Exception] = PathRefused

    def __init__(self, root_fd: int | None = None):
        self._root_fd = root_fd
        self.readonly: dict[str, object] = {}

    def _root(self) -> int:
        if self._root_fd is None:
            raise self.error("the tree is not open")
        return self._root_fd


    def _open_dir(self, parts: Sequence[str], rel: str, create: bool = False, owner: int | None = None) -> int:
        """A descriptor of the directory ``parts`` (each component a real directory, never a link)."""
        fd = os.dup(self._root())
        try:
            for name in parts:
                try:
                    child = os.open(name, _O_DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise self.error(f"no such directory: {rel}") from None
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                        if owner is not None:
                            os.chown(name, owner, owner, dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        pass
                    except OSError as exc:
                        raise self.error(f"cannot create {rel}: {exc.strerror or exc}") from exc
                    child = os.open(name, _O_DIR, dir_fd=fd)
                except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
                    raise self.error(
                        f"{rel}: {name!r} is not a directory (links are never followed)") from exc
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _lstat(self, dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _open_regular(self, dir_fd: int, name: str, rel: str, flags: int = _O_READ) -> int:
        """Open a regular file: refuse links and special files, and never block on one."""
        found = self._lstat(dir_fd, name)
        if found is None:
            raise self.error(f"no such file: {rel}")
        if not stat.S_ISREG(found.st_mode):
            raise self.error(f"{rel} is a {_kind(found.st_mode)}, not a regular file")
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:  # swapped for a link (ELOOP) or a FIFO without a reader (ENXIO) meanwhile
            raise self.error(f"cannot open {rel}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self.error(f"{rel} is not a regular file")
        return fd

    def _walk(self, dir_fd: int, prefix: str, depth: int = 0,
              cut: list[str] | None = None) -> Iterator[tuple[str, int, os.stat_result]]:
        """(path, parent fd, lstat) of every entry below ``dir_fd``, depth first, links not followed.

        Folders deeper than the walk goes are not entered; their paths are appended to ``cut``.
        """
        with os.scandir(dir_fd) as entries:
            listed = sorted(entries, key=lambda entry: entry.name)
        for entry in listed:
            path = prefix + entry.name
            try:
                found = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield path, dir_fd, found
            if stat.S_ISDIR(found.st_mode) and depth >= _MAX_DEPTH and cut is not None:
                cut.append(path)
            if stat.S_ISDIR(found.st_mode) and depth < _MAX_DEPTH:
                try:
                    child = os.open(entry.name, _O_DIR, dir_fd=dir_fd)
                except OSError:  # swapped meanwhile
                    continue
                try:
                    yield from self._walk(child, path + "/", depth + 1, cut)
                finally:
                    os.close(child)

    # ------------------------------------------------------------ operations

    def write(self, rel: str, content: str | bytes, owner: int | None = None, mode: int = 0o644,
              chown_file: bool = True) -> None:
        """Create or replace a regular file (parents made, owned by ``owner``).

        Raises:
            SandboxPathError: Read-only, outside the workspace, a link or special file in the way.
        """
        parts = workspace_parts(rel, self.error)
        if not parts or "/".join(parts) in self.readonly:
            raise self.error(f"{rel} is read-only")
        data = _as_bytes(content)
        dir_fd = self._open_dir(parts[:-1], rel, create=True, owner=owner)
        try:
            name = parts[-1]
            existing = self._lstat(dir_fd, name)
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                raise self.error(f"{rel} is a {_kind(existing.st_mode)}; only regular files are written")
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                             | os.O_NOCTTY | (os.O_EXCL if existing is None else 0), mode, dir_fd=dir_fd)
            except OSError as exc:
                raise self.error(f"cannot write {rel}: {exc.strerror or exc}") from exc
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise self.error(f"{rel} is not a regular file")
                os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if existing is None:
                    os.fchmod(fd, mode)  # whatever the umask
                    if owner is not None and chown_file:
                        os.fchown(fd, owner, owner)
            except OSError as exc:  # ENOSPC past the quota, EFBIG, ...
                raise self.error(f"cannot write {rel}: {exc.strerror or exc}") from exc
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)

    def read_bytes(self, rel: str, cap: int = _READ_CAP) -> bytes:
        """Up to ``cap`` + 1 bytes of a regular file (one more than ``cap`` says it is longer)."""
        parts = workspace_parts(rel, self.error)
        if not parts:
            raise self.error(f"{rel} is a directory")
        dir_fd = self._open_dir(parts[:-1], rel)
        try:
            fd = self._open_regular(dir_fd, parts[-1], rel)
        finally:
            os.close(dir_fd)
        try:
            chunks, size = [], 0
            while size <= cap:
                chunk = os.read(fd, min(1 << 20, cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read(self, rel: str) -> str:
        """A regular file as text (undecodable bytes replaced, capped)."""
        data = self.read_bytes(rel)
        text = data[:_READ_CAP].decode("utf-8", errors="replace")
        return text + ("\n[... file truncated ...]" if len(data) > _READ_CAP else "")

    def list(self, rel: str = ".") -> list[str]:
        """Regular files under ``rel`` (``__pycache__`` left out), sorted; links and special files are not listed."""
        parts = workspace_parts(rel, self.error)
        base = "/".join(parts)
        if parts:
            parent = self._open_dir(parts[:-1], rel)
            try:
                found = self._lstat(parent, parts[-1])
                if found is not None and stat.S_ISREG(found.st_mode):
                    return [base]
            finally:
                os.close(parent)
        dir_fd = self._open_dir(parts, rel)
        try:
            return [path for path, _, found in self._walk(dir_fd, base + "/" if base else "")
                    if stat.S_ISREG(found.st_mode) and "__pycache__" not in path.split("/")]
        finally:
            os.close(dir_fd)

    def collect(self, max_bytes: int, max_entries: int = 100_000) -> Collected:
        """Everything under the root: regular files read up to ``max_bytes`` in all, links and special files named."""
        files: dict[str, bytes] = {}
        symlinks: dict[str, str] = {}
        special: dict[str, str] = {}
        oversized: list[str] = []
        total = entries = 0
        truncated = False
        cut: list[str] = []  # folders too deep to enter: what they hold is not collected
        root = os.dup(self._root())
        try:
            for path, dir_fd, found in self._walk(root, "", cut=cut):
                entries += 1
                if entries > max_entries:
                    truncated = True
                    break
                name = path.rsplit("/", 1)[-1]
                mode = found.st_mode
                if stat.S_ISDIR(mode):
                    continue
                if stat.S_ISLNK(mode):
                    try:
                        symlinks[path] = os.readlink(name, dir_fd=dir_fd)
                    except OSError:
                        continue
                elif not stat.S_ISREG(mode):
                    special[path] = _kind(mode)
                elif total + found.st_size > max_bytes:
                    oversized.append(path)
                else:
                    try:
                        fd = self._open_regular(dir_fd, name, path)
                    except self.error:  # swapped meanwhile
                        continue
                    with os.fdopen(fd, "rb") as handle:
                        data = handle.read(max_bytes - total + 1)
                    if total + len(data) > max_bytes:  # it grew meanwhile
                        oversized.append(path)
                        continue
                    files[path] = data
                    total += len(data)
        finally:
            os.close(root)
        return Collected(files, symlinks, special, tuple(oversized), truncated or bool(cut))
