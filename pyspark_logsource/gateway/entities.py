"""Building kio's entities for any version from plain values.

Kafka's messages change field by field between versions, and kio generates a
class per version. Handlers describe a response once, as plain Python values
(ints, strings, lists of dicts for nested entities), and :func:`make` builds
the entity of whatever version the client asked for: fields that version lacks
are dropped, fields it has but the handler did not give take kio's defaults,
integers become kio's error codes and durations where the schema says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode


@cache
def _hints(entity: type) -> dict[str, Any]:
    return typing.get_type_hints(entity)


def _entity_of(hint: Any) -> type | None:
    """The kio entity class a field holds (directly, in a tuple, or optional), else None."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        return _entity_of(args[0]) if args else None
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            found = _entity_of(arg)
            if found is not None:
                return found
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    return None


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    entity = _entity_of(hint)
    if entity is not None:
        if isinstance(value, dict):
            return make(entity, **value)
        if isinstance(value, (list, tuple)):
            return tuple(make(entity, **v) if isinstance(v, dict) else v for v in value)
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is tuple and isinstance(value, (list, tuple)):
        return tuple(_convert(args[0], v) for v in value) if args else tuple(value)
    if origin in (typing.Union, types.UnionType):
        concrete = [a for a in args if a is not type(None)]
        return _convert(concrete[0], value) if len(concrete) == 1 else value
    if hint is ErrorCode or (isinstance(hint, type) and issubclass(hint, ErrorCode)):
        return ErrorCode(int(value))
    if isinstance(hint, type) and issubclass(hint, datetime.timedelta) and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if hint is uuid.UUID and isinstance(value, str):
        return uuid.UUID(value)
    if isinstance(hint, type) and issubclass(hint, datetime.datetime) and isinstance(value, int):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.timezone.utc)
    return value


def make(entity: type, **values: Any) -> Any:
    """An instance of kio's ``entity`` from plain values; keys the entity's version lacks are ignored."""
    hints = _hints(entity)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(entity):
        if f.name in values:
            kwargs[f.name] = _convert(hints[f.name], values[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hints[f.name])
    return entity(**kwargs)


def _zero(hint: Any) -> Any:
    """A neutral value for a required field the handler did not give (a field of a version it ignores)."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        return ()
    if origin in (typing.Union, types.UnionType):
        return None
    if hint is ErrorCode:
        return ErrorCode.none
    if isinstance(hint, type):
        if issubclass(hint, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(hint, bool):
            return False
        if issubclass(hint, int):
            return hint(0)
        if issubclass(hint, str):
            return ""
        if issubclass(hint, bytes):
            return b""
        if hint is uuid.UUID:
            return uuid.UUID(int=0)
    return None


def has_field(entity: Any, name: str) -> bool:
    """Whether a request's version has a field (handlers read newer fields only when present)."""
    return any(f.name == name for f in dataclasses.fields(entity))


@cache
def _null_rules(entity: type) -> tuple[tuple[str, bool, bool], ...]:
    """(field name, may be None, may hold entities) for each field of a kio entity class."""
    rules = []
    for f in dataclasses.fields(entity):
        hint = _hints(entity)[f.name]
        nullable = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
        rules.append((f.name, nullable, _entity_of(hint) is not None))
    return tuple(rules)


def null_violation(entity: Any, path: str = "") -> str | None:
    """The dotted path of the first field that holds None although its schema does not allow it, else None.

    kio's reader decodes a length of -1 as None for every array and string, nullable or not; Kafka's own parser
    refuses a null where the schema has no ``nullableVersions``. A decoded request is checked with this before
    a handler, which trusts the schema, iterates a None.
    """
    entity_type: type = type(entity)
    for name, nullable, nested in _null_rules(entity_type):
        value = getattr(entity, name)
        where = f"{path}.{name}" if path else name
        if value is None:
            if not nullable:
                return where
            continue
        if not nested:
            continue
        children = value if isinstance(value, tuple) else (value,)
        for i, child in enumerate(children):
            if dataclasses.is_dataclass(child):
                found = null_violation(child, f"{where}[{i}]" if isinstance(value, tuple) else where)
                if found is not None:
                    return found
    return None


def one_code_per_partition(response_type: type, topics: Any, code: int) -> Any:
    """A response whose ``topics`` answer every requested partition with ``code`` (OffsetCommit,
    TxnOffsetCommit: a denial or an outcome that holds for the whole request)."""
    return make(
        response_type,
        throttle_time=0,
        topics=[
            {
                "name": t.name,
                "partitions": [{"partition_index": p.partition_index, "error_code": code} for p in t.partitions],
            }
            for t in topics
        ],
    )
