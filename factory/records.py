"""The base of every typed, versioned record `factory` persists or exchanges.

The records themselves live with the layer that all their users can import:
run manifests, events, workspace snapshots, judge samples and branch rows in
:mod:`factory.store`, the verdict in :mod:`factory.verifiers`, the export
manifest in :mod:`factory.export`. This base sits below all of them and needs
only pydantic, so reading an export manifest imports neither the store nor
polars.

Each record declares ``schema_version: Literal[N] = N``. Reading goes through
:meth:`Record.from_stored`, which upgrades older shapes: a document with no
``schema_version`` was written before records were versioned (version 1 is
exactly that shape plus the key), so it is read as version 1 with keys the
schema does not know dropped; a version newer than this code knows is refused
with :class:`~factory.errors.RecordError` rather than guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import Self

from factory.errors import RecordError

__all__ = ["Record", "RecordPart", "describe_validation_error"]


class Record(BaseModel):
    """Base of every versioned record: frozen, no unknown fields, read through :meth:`from_stored`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Each record narrows this to ``Literal[N] = N``, its current version.
    schema_version: int

    @classmethod
    def current_version(cls) -> int:
        """The version this code writes."""
        return int(cls.model_fields["schema_version"].default)

    @classmethod
    def from_stored(cls, data: str | bytes | Mapping[str, Any]) -> Self:
        """Validate a stored record (JSON text or parsed), upgrading an older shape.

        Raises:
            RecordError: Not a JSON object, written by a newer factory, or not this record's shape.
        """
        try:
            raw = json.loads(data) if isinstance(data, str | bytes) else data
        except json.JSONDecodeError as exc:
            raise RecordError(f"stored {cls.__name__} is not JSON: {exc.msg}") from exc
        if not isinstance(raw, Mapping):
            raise RecordError(f"stored {cls.__name__} is not a JSON object")
        version = raw.get("schema_version")
        if version is None:
            raw = cls.upgrade_unversioned(dict(raw))
        elif not isinstance(version, int) or version > cls.current_version():
            raise RecordError(f"stored {cls.__name__} has schema_version {version!r}; this factory reads up to "
                              f"{cls.current_version()} (upgrade factory to read it)")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise RecordError(f"stored {cls.__name__} is not valid: {describe_validation_error(exc)}") from exc

    @classmethod
    def upgrade_unversioned(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A document written before versioning, as version 1 (keys this schema does not know dropped)."""
        known = {key: value for key, value in data.items() if key in cls.model_fields}
        return {**known, "schema_version": 1}


class RecordPart(BaseModel):
    """A nested part of a record: versioned by the record that holds it, so it has no version of its own."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def describe_validation_error(exc: ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message`` on one line."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "(record)"
    return f"{where}: {error['msg']}"
