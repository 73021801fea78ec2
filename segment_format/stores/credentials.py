"""Which storage options are credentials, and how to keep their values out of messages.

Storage options go to fsspec as they are, so plog cannot know every backend's
credential names. It treats a name as a credential when it looks like one
(:data:`CREDENTIAL_NAME`): s3fs's ``key``, ``secret``, ``token``; gcsfs's
``token``; adlfs's ``account_key``, ``connection_string``, ``sas_token``,
``client_secret``, ``credential``; a ``password`` anywhere; and the same names
inside a structured value (s3fs's ``client_kwargs={"aws_secret_access_key": ...}``).
A false positive costs a user one renamed option; a false negative could print
a secret, so the pattern is wide.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

#: Option names (and keys inside structured option values) that hold credentials. Case-insensitive, so
#: it also catches botocore's ``aws_secret_access_key`` or ``SSECustomerKey`` spelled in any case.
CREDENTIAL_NAME = re.compile(
    r"key|secret|token|passw|credential|sas|signature|connection_?string|private|passphrase", re.IGNORECASE
)

#: What replaces a credential's value in a message.
HIDDEN = "***"

#: Values shorter than this are not scrubbed from messages: a one-character "secret" would turn every
#: message to noise, and is no secret.
_MIN_SCRUBBED = 4


def is_credential_name(name: str) -> bool:
    """Whether an option (or a key inside an option's value) named ``name`` looks like it holds a credential."""
    return CREDENTIAL_NAME.search(name) is not None


def credential_keys(value: Any) -> list[str]:
    """The credential-like keys found at any depth of a structured option value (dicts inside dicts or lists)."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if is_credential_name(str(key)):
                found.append(str(key))
            found.extend(credential_keys(inner))
    elif isinstance(value, (list, tuple)):
        for inner in value:
            found.extend(credential_keys(inner))
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for inner in value.values():
            yield from _strings(inner)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            yield from _strings(inner)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def credential_values(options: Mapping[str, Any]) -> list[str]:
    """Every value in ``options`` that is, or may be part of, a credential, longest first.

    All the strings under a credential-like name (a structured ``token`` is a credential as a whole), and the
    values of credential-like keys inside other options' structured values.
    """
    values: set[str] = set()

    def walk(name: str, value: Any) -> None:
        if is_credential_name(name):
            values.update(_strings(value))
        elif isinstance(value, Mapping):
            for key, inner in value.items():
                walk(str(key), inner)
        elif isinstance(value, (list, tuple)):
            for inner in value:
                walk(name, inner)

    for name, value in options.items():
        walk(str(name), value)
    return sorted((v for v in values if len(v) >= _MIN_SCRUBBED), key=len, reverse=True)


def scrub(text: str, options: Mapping[str, Any] | None) -> str:
    """``text`` with every credential value of ``options`` replaced by ``***``.

    For messages built from a backend's exceptions, which may quote what they were given (a malformed
    connection string, a token file's contents).
    """
    for value in credential_values(options or {}):
        text = text.replace(value, HIDDEN)
    return text
