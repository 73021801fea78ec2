"""Declarative configuration: one mechanism for topic configs, client configs and Spark options.

A :class:`ConfigSchema` is a list of :class:`ConfigKey` declarations (name, type,
default, allowed values, range, a parser for values that arrive as text, a
validator, a line of documentation) plus checks that involve several keys.
``schema.validate(config)`` returns the normalized configuration with defaults
filled in, or raises :class:`~segment_format.errors.InvalidConfigError`:

* an unknown key names the key and every known one (unknown keys are looked
  for first: a misspelt key usually explains the other problems);
* a bad value names the key and the value as given, and says what is wrong
  (wrong type, not an allowed value, out of range, refused by the validator).

The messages come from two templates per schema, so that topic configs read
``topic config segment.bytes=-5 is below its minimum 1024`` while Spark options
read ``plog option 'maxOffsetsPerTrigger': '0' is below its minimum 1``. Keys may
be matched case-insensitively (Spark lower-cases option names); errors then use
the declared spelling.

No library: pydantic is not a dependency, and what plog needs fits in this module.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidConfigError

#: What a value of each declared type must be, as the error says it.
_TYPE_PROBLEMS: dict[type, str] = {
    int: "is not an integer",
    float: "is not a number",
    bool: "must be true or false",
    str: "is not a string",
}


def did_you_mean(given: Any, candidates: Iterable[Any]) -> str:
    """`` (did you mean 'x'?)`` for the candidate closest to a misspelt ``given`` (compared without case), or ""
    when none is close, as Spark's own errors suggest the nearest name."""
    by_folded = {str(c).lower(): str(c) for c in candidates}
    found = difflib.get_close_matches(str(given).strip().lower(), list(by_folded), n=1, cutoff=0.6)
    return f" (did you mean {by_folded[found[0]]!r}?)" if found else ""


def is_type(value: Any, kind: type) -> bool:
    """Whether ``value`` is of a config key's ``kind`` as JSON means it: a boolean is never a number."""
    if kind is object:
        return True
    if kind in (int, float) and isinstance(value, bool):  # True is an int to Python, never to a config
        return False
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


def integer_from_text(value: Any) -> int:
    """An integer given as an int, an integral float or a numeric string (command lines, Spark options)."""
    if isinstance(value, bool):
        raise ValueError("is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("is not an integer")
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError("is not an integer")


def boolean_from_text(value: Any) -> bool:
    """A boolean given as a bool or as the text ``true``/``false`` in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("must be true or false")


def lowercase_text(value: Any) -> str:
    """A string, stripped and lower-cased (for names compared case-insensitively)."""
    if not isinstance(value, str):
        raise ValueError("is not a string")
    return value.strip().lower()


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: what it accepts, its default, and a line saying what it means.

    ``parse`` turns a given value into the key's ``type`` (raising ``ValueError``
    or ``TypeError`` whose message is the problem, such as ``"is not a
    duration"``); ``validator`` returns the problem with a parsed value, or None.
    ``allowed``, ``minimum`` and ``maximum`` are checked on the parsed value.
    ``nullable`` accepts None as given (the default may be None regardless).
    """

    name: str
    type: type = object
    default: Any = None
    doc: str = ""
    allowed: tuple[Any, ...] | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    parse: Callable[[Any], Any] | None = None
    validator: Callable[[Any], str | None] | None = None
    nullable: bool = False

    def problem(self, value: Any) -> tuple[Any, str | None]:
        """(normalized value, None) if ``value`` is acceptable, else (value, what is wrong with it)."""
        if value is None and self.nullable:
            return None, None
        if self.parse is not None:
            try:
                value = self.parse(value)
            except (TypeError, ValueError) as exc:
                return value, str(exc) or _TYPE_PROBLEMS.get(self.type, "is not valid")
        if not is_type(value, self.type):
            return value, _TYPE_PROBLEMS.get(self.type, f"is not a {self.type.__name__}")
        if self.allowed is not None and value not in self.allowed:
            return value, f"is not one of {sorted(self.allowed, key=str)}{did_you_mean(value, self.allowed)}"
        if self.minimum is not None and value < self.minimum:
            return value, f"is below its minimum {self.minimum}"
        if self.maximum is not None and value > self.maximum:
            return value, f"is above its maximum {self.maximum}"
        if self.validator is not None:
            found = self.validator(value)
            if found:
                return value, found
        return value, None


class ConfigSchema:
    """A set of :class:`ConfigKey` and cross-key ``checks``: validates a config dict (module docstring).

    ``what`` names the configuration in messages ("topic config"). The two
    templates are ``str.format`` strings: ``value_message`` gets ``what``,
    ``key`` (the declared spelling), ``value`` (as given) and ``problem``;
    ``unknown_message`` gets ``what``, ``key`` (as given) and ``known`` (the
    sorted declared names). Each check receives the normalized config and the
    schema (for :meth:`error`) and raises when the combination is wrong.
    """

    def __init__(
        self,
        what: str,
        keys: Iterable[ConfigKey],
        *,
        case_insensitive: bool = False,
        checks: Sequence[Callable[[dict[str, Any], ConfigSchema], None]] = (),
        value_message: str = "{what} {key}={value!r} {problem}",
        unknown_message: str = "unknown {what} {key!r}; known: {known}",
    ) -> None:
        self.what = what
        self.case_insensitive = case_insensitive
        self.checks = tuple(checks)
        self.value_message = value_message
        self.unknown_message = unknown_message
        self._keys: dict[str, ConfigKey] = {}
        for key in keys:
            lookup = self._fold(key.name)
            if lookup in self._keys:
                raise ValueError(f"{what}: key {key.name!r} is declared twice")
            self._keys[lookup] = key

    def _fold(self, name: str) -> str:
        return name.lower() if self.case_insensitive else name

    def __iter__(self) -> Iterator[ConfigKey]:
        return iter(self._keys.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._fold(name) in self._keys

    def __getitem__(self, name: str) -> ConfigKey:
        return self._keys[self._fold(name)]

    def names(self) -> list[str]:
        """The declared key names, in declaration order."""
        return [key.name for key in self._keys.values()]

    def defaults(self) -> dict[str, Any]:
        """Every key with its default, by declared name."""
        return {key.name: key.default for key in self._keys.values()}

    def error(self, key: str, value: Any, problem: str) -> InvalidConfigError:
        """The error for a bad ``value`` of ``key`` (for checks that involve several keys, too)."""
        name = self[key].name if key in self else key
        return InvalidConfigError(self.value_message.format(what=self.what, key=name, value=value, problem=problem))

    def unknown(self, key: str) -> InvalidConfigError:
        """The error for a key the schema does not declare."""
        known = sorted(self.names())
        message = self.unknown_message.format(what=self.what, key=key, known=known)
        return InvalidConfigError(message + did_you_mean(key, known))

    def validate(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """The normalized config by declared name, every key not given at its default; then the checks run."""
        given = dict(config or {})
        for key in given:
            if not isinstance(key, str) or key not in self:
                raise self.unknown(key)
        out = self.defaults()
        for key, value in given.items():
            spec = self[key]
            normalized, problem = spec.problem(value)
            if problem is not None:
                raise self.error(key, value, problem)
            out[spec.name] = normalized
        for check in self.checks:
            check(out, self)
        return out
