"""Values between Python and the two drivers, both ways, written once.

A result row becomes a model by its field names and types (:func:`from_row`): the queries
name their columns after the model's fields.  The dialects differ only in how a timestamp
and a JSON payload travel through the driver, which the :class:`Codec` of each says.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from schedlock.core.payloads import MAX_PAYLOAD_BYTES, PayloadError, parse_payload, payload_too_big

Row = Mapping[str, Any]
Params = Mapping[str, Any]
M = TypeVar("M")

# SQLite stores timestamps as this fixed-width UTC text, so they compare correctly as strings.
SQLITE_TIMESTAMP = "%Y-%m-%dT%H:%M:%S.%f+00:00"


def iso(value: datetime) -> str:
    """A timestamp as SQLite stores it (and as both dialects read it inside JSON)."""
    return value.astimezone(UTC).strftime(SQLITE_TIMESTAMP)


@dataclass(frozen=True)
class Codec:
    """How one driver carries timestamps, JSON and enums."""

    timestamp: Callable[[Any], datetime]
    payload: Callable[[Any], dict[str, Any]]
    dump_timestamp: Callable[[datetime], Any]
    dump_json: Callable[[Any], Any]

    def encode(self, params: Params) -> dict[str, Any]:
        """Query parameters as this driver takes them."""
        return {name: self._dump(value) for name, value in params.items()}

    def _dump(self, value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, datetime):
            return self.dump_timestamp(value)
        if isinstance(value, dict | list):
            return self.dump_json(value)
        return value

    def decode(self, hint: Any, value: Any) -> Any:
        """A column value as the model field typed ``hint`` holds it."""
        if value is None:
            return None
        kind = _base(hint)
        if kind is datetime:
            return self.timestamp(value)
        if kind is dict:
            return self.payload(value)
        if kind is tuple:
            return tuple(value)
        if kind in (int, float, bool, str):
            return kind(value)
        return value


def _base(hint: Any) -> Any:
    """``int | None`` -> int, ``dict[str, Any]`` -> dict, ``tuple[str, ...]`` -> tuple."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.get_origin(hint) or hint


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def from_row(cls: type[M], row: Row, codec: Codec) -> M:
    """The model ``cls`` from a row whose columns are named after its fields (a field the row
    lacks keeps its default).

    A row is the unit of failure: a payload that cannot be decoded (too big, too deep, not
    JSON: :func:`schedlock.core.payloads.parse_payload`) fails that row alone.  A model with a
    ``problem`` field gets the reason there and an empty payload (the leader ends such a row
    ``failed``); any other raises PayloadError for that row only.  A query that may leave an
    oversized payload out (claims) says its size in ``payload_bytes``.
    """
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in row:
            continue
        try:
            values[f.name] = codec.decode(hints[f.name], row[f.name])
        except PayloadError as exc:
            if f.name != "payload" or "problem" not in hints:
                raise
            values[f.name], values["problem"] = {}, str(exc)
    if "problem" in hints and row.get("payload_bytes") is not None:
        size = int(row["payload_bytes"])
        if size > MAX_PAYLOAD_BYTES:  # the query left the payload out: too big to fetch
            values["payload"], values["problem"] = {}, str(payload_too_big(size))
    return cls(**values)


def fields_of(model: Any) -> dict[str, Any]:
    """A model's fields as query parameters (shallow: a payload stays one parameter)."""
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}


def stored_payload(value: Any) -> dict[str, Any]:
    """A payload column as both dialects hand it over: the database's own JSON text (the
    PostgreSQL connector loads json/jsonb as text, see ``schedlock.store.postgres``), decoded
    here with its bounds checked, one row at a time."""
    return parse_payload(value, stored=True)


def text_timestamp(value: Any) -> datetime:
    return datetime.fromisoformat(str(value)).astimezone(UTC)
