"""Typed JSON documents: one codec for every small JSON object plog stores.

Topic metadata, segment metadata, group heartbeats and generations, transaction
decisions, epochs and leases are all small immutable JSON objects. Each is a
frozen (or plain) dataclass deriving from :class:`JsonDocument`; the field list
*is* the document's schema (PROTOCOL.md's field tables list the same names),
and this module is the only place that turns one into bytes and back.

The rules, which are the protocol's rules for every JSON document:

* a document is a JSON object whose keys are the dataclass's field names
  (or the name given by ``field(metadata={"json": "other.name"})``);
* readers ignore keys they do not know (newer writers may add optional fields);
* a missing required field, a value of the wrong type or bytes that are not a
  JSON object make the document corrupt: :class:`CorruptRecordError` naming
  the document and the field;
* optional fields (those with defaults) may be absent and take their default.

Tuples are written as JSON arrays; a field whose value needs more than that
(a mapping keyed by tuples, say) declares its own pair of functions with
``field(metadata={"encode": f, "decode": g})``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from functools import cache
from typing import Any, ClassVar, TypeVar, cast

from .errors import CorruptRecordError

D = TypeVar("D", bound="JsonDocument")


class JsonDocument:
    """Base of the dataclasses that plog stores as JSON objects (see the module docstring)."""

    #: ``json.dumps`` separators; compact by default, a subclass may keep an older spacing.
    json_separators: ClassVar[tuple[str, str]] = (",", ":")

    def to_dict(self) -> dict[str, Any]:
        """The document as a JSON-ready dict (field names as the protocol names them)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            encode = f.metadata.get("encode")
            out[f.metadata.get("json", f.name)] = encode(value) if encode else _plain(value)
        return out

    def to_json(self) -> bytes:
        """The document's bytes: sorted keys, UTF-8."""
        return json.dumps(self.to_dict(), separators=self.json_separators, sort_keys=True).encode()

    @classmethod
    def from_dict(cls: type[D], doc: Any, *, what: str = "") -> D:
        """Build the document from a parsed JSON value, checking each field's type."""
        name = what or cls.__name__
        if not isinstance(doc, dict):
            raise CorruptRecordError(f"{name}: expected a JSON object, got {type(doc).__name__}")
        kwargs: dict[str, Any] = {}
        for attr, key, required, convert in _plan(cast(Hashable, cls)):
            if key not in doc:
                if required:
                    raise CorruptRecordError(f"{name}: required field {key!r} is missing")
                continue
            try:
                kwargs[attr] = convert(doc[key])
            except (TypeError, ValueError, KeyError, IndexError) as exc:
                raise CorruptRecordError(f"{name}: field {key!r} has an invalid value {doc[key]!r}: {exc}") from exc
        return cls(**kwargs)

    @classmethod
    def from_json(cls: type[D], data: bytes | str, *, what: str = "", keyed: Mapping[str, Any] | None = None) -> D:
        """Parse a document's bytes (see the module docstring for what is corrupt).

        ``keyed``: the fields, by their JSON names, that repeat what the object's key
        (``what``) says, with the key's values. The key is authoritative (PROTOCOL.md
        3.1): a document saying otherwise is another object's bytes, and corrupt here.
        """
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(f"{what or cls.__name__}: not valid JSON: {exc}") from exc
        out = cls.from_dict(doc, what=what)
        if keyed:
            attrs = {key: attr for attr, key, _required, _convert in _plan(cast(Hashable, cls))}
            for key, expected in keyed.items():
                found = getattr(out, attrs[key])
                if found != expected:
                    raise CorruptRecordError(
                        f"{what}: field {key!r} is {found!r}, its key says {expected!r}", key=what or None
                    )
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


#: One field's decoding step: (attribute name, JSON key, required, value -> checked value).
_FieldPlan = tuple[str, str, bool, Callable[[Any], Any]]


@cache
def _plan(cls: Any) -> tuple[_FieldPlan, ...]:
    """Each field's checker, built once per class: documents are parsed on hot paths (every index read)."""
    hints = typing.get_type_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        convert = f.metadata.get("decode") or _checker(hints[f.name])
        plan.append((f.name, f.metadata.get("json", f.name), required, convert))
    return tuple(plan)


def _checker(hint: Any) -> Callable[[Any], Any]:
    """A function that checks a JSON value against a field's annotation; tuples come back from JSON arrays."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        options = [_checker(arg) for arg in args if arg is not type(None)]

        def union(value: Any) -> Any:
            if value is None and nullable:
                return None
            for option in options:
                try:
                    return option(value)
                except (TypeError, ValueError):
                    continue
            raise TypeError(f"expected {hint}")

        return union
    if hint is Any:
        return _identity
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            each = _checker(args[0])
            return lambda value: tuple(each(v) for v in _array(value))
        items = [_checker(a) for a in args]
        return lambda value: tuple(c(v) for v, c in zip(_array(value), items, strict=True))
    if origin in (list, collections.abc.Sequence):  # a JSON array, whichever of the two the field is annotated as
        if not args:
            return lambda value: list(_array(value))
        each = _checker(args[0])
        return lambda value: [each(v) for v in _array(value)]
    if origin in (dict, collections.abc.Mapping):  # a JSON object, likewise
        if not args:
            return lambda value: dict(_object(value))
        each = _checker(args[1])
        return lambda value: {k: each(v) for k, v in _object(value).items()}
    if hint is dict:
        return _object
    return _SCALARS.get(hint, _identity)


def _identity(value: Any) -> Any:
    return value


def _array(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("expected an array")
    return value


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    return value


#: The range of a JSON integer (PROTOCOL.md 3.1): values go into int64 index columns and Arrow arrays,
#: where a larger one would raise OverflowError far from the document that held it.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("expected an integer")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("expected an integer within int64")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("expected a number")
    return float(value)


_SCALARS: dict[Any, Callable[[Any], Any]] = {int: _int, str: _str, bool: _bool, float: _float}
