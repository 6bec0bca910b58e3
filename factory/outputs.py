"""Output files: written whole or not at all, and never over the store or an input.

Every file a command writes (an export, its manifest and dataset card, a
plot, a training report) goes through :class:`OutputFiles`. Each target is
checked first: refused when it resolves (through symlinks, or as a hard link)
to a protected path, the store or an input of the command. It is then
written to a temporary file beside it, on the same filesystem, and renamed
into place only when every file of the set is complete. On any error the
temporary files (and the folders made for them) are removed, and each target
is as it was.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from factory.errors import ConfigError

__all__ = ["OutputFiles", "refuse_protected", "write_output"]

#: What a command must not write over: a description (``"the store (--db)"``) -> its path (None: not given).
_Protected = Mapping[str, "str | Path | None"]


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
    """

    def __init__(self, protected: _Protected | None = None):
        self._protected = dict(protected or {})
        self._staged: dict[Path, Path] = {}
        self._made: list[Path] = []  # folders made for targets, removed again when nothing is kept

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
        temporary = target.with_name(f".{target.stem}.{secrets.token_hex(4)}.tmp{target.suffix}")
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
        unwritten = [str(target) for target, temporary in self._staged.items() if not temporary.is_file()]
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

    def discard(self) -> None:
        """Remove every staged file (and the folders made for them); the targets stay as they were."""
        for temporary in self._staged.values():
            temporary.unlink(missing_ok=True)
        self._staged.clear()
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
            self.commit()
        else:
            self.discard()


def write_output(target: str | Path, write: Callable[[Path], object], protected: _Protected | None = None) -> Path:
    """Write one file atomically: ``write(path)`` writes a temporary file, renamed onto ``target`` when it returns.

    Raises:
        ConfigError: ``target`` is protected or a directory.
    """
    with OutputFiles(protected) as outputs:
        write(outputs.stage(target))
    return Path(target)
