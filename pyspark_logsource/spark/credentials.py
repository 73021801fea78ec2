"""Credentials in Spark options: only under names Spark redacts.

Spark prints a data source's options in its plans (the ``StreamingRelationV2``
of ``readStream...load()`` in ``explain``, a streaming query's error, the event
log), hiding the value of an option only when its name or value matches
``spark.redaction.regex`` (default ``(?i)secret|password|token|access[.]?key``)
or ``spark.sql.redaction.options.regex`` (default ``(?i)url``). ``storage.key``
or ``storage.account_key`` match neither, so their values would be printed.

The rule: a storage option that looks like a credential (its fsspec name, or a key
inside its JSON value, matches :data:`~segment_format.stores.credentials.CREDENTIAL_NAME`)
is accepted only under a name Spark's default pattern redacts. ``storage.secret.<name>``
always is, and hands ``<name>`` to fsspec: ``option("storage.secret.key", K)`` gives
s3fs ``key=K``. Any other spelling is refused by :func:`check_storage_option` with
plog's ``InvalidConfigError`` naming the option and its safe spelling, when the options
are first parsed (``load()`` asks the source for its schema, which parses them; a
sink parses them when its query starts), before Spark has a plan to print.

Checked against Spark's *default* pattern, not the session's ``spark.redaction.regex``:
the check runs in the data source's own Python process (a planner worker of the driver,
or a Spark Connect server's), which has no SparkSession to read the conf from, and a fixed
pattern makes the same options work or fail in every session. A session that narrows
``spark.redaction.regex`` so that ``secret`` no longer matches prints every
``storage.secret.*`` value too; that is its owner's choice, and plog cannot see it.

Spark Connect: the server's ``SparkListenerConnectOperationStarted`` event carries the
request's plan as text redacted only by ``spark.sql.redaction.string.regex`` (unset by
default), so on Connect *any* option value reaches the server's event log and its Connect
UI tab. There the safe way is credentials the filesystem finds itself (environment
variables, instance or workload identity, a credentials file), not options at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from segment_format.errors import InvalidConfigError
from segment_format.stores.credentials import credential_keys, is_credential_name

#: Spark's default ``spark.redaction.regex`` (``org.apache.spark.internal.config.SECRET_REDACTION_PATTERN``),
#: the same in Spark 3.x and 4.x. Spark applies it to an option's name and to its value.
SPARK_DEFAULT_REDACTION = re.compile(r"(?i)secret|password|token|access[.]?key")

STORAGE_PREFIX = "storage."
#: The spelling for credentials: ``storage.secret.<fsspec name>``; ``secret`` makes Spark redact the value.
SECRET_PREFIX = "storage.secret."

ErrorFactory = Callable[[str, str], InvalidConfigError]


def spark_redacts(option: str) -> bool:
    """Whether Spark's default redaction hides the value of an option named ``option`` in plans and logs."""
    return SPARK_DEFAULT_REDACTION.search(option) is not None


def storage_name(option: str) -> str:
    """The fsspec name of a lower-cased ``storage.*`` option: ``storage.secret.key`` and ``storage.key`` -> ``key``.

    ``storage.secret`` alone is s3fs's ``secret``.
    """
    if option.startswith(SECRET_PREFIX):
        return option[len(SECRET_PREFIX) :]
    return option[len(STORAGE_PREFIX) :]


def check_storage_option(option: str, value: Any, error: ErrorFactory) -> None:
    """Refuse a credential-like ``storage.*`` option (``value`` decoded) whose value Spark would print.

    The message names the option and its safe spelling, never the value.
    """
    if spark_redacts(option):
        return
    name = storage_name(option)
    if is_credential_name(name):
        why = f"'{name}' looks like a credential"
    else:
        keys = credential_keys(value)
        if not keys:
            return
        names = sorted(set(keys))
        why = f"its value holds {', '.join(repr(k) for k in names)}, which look{'s' * (len(names) == 1)} like "
        why += "a credential" if len(names) == 1 else "credentials"
    raise error(
        option,
        f"{why}, and Spark would show this option's value in query plans, errors and event logs; "
        f"give it as '{SECRET_PREFIX}{name}' (plog passes it to fsspec as '{name}'; Spark redacts it), "
        "or leave it out and let the filesystem find its credentials (environment variables, "
        "instance identity, a credentials file)",
    )


def check_root_url(option: str, url: str | None, error: ErrorFactory) -> None:
    """Refuse a plog root URL with a password in it (``s3://user:pass@bucket``); the message omits the URL."""
    if not url or "://" not in url:
        return
    try:
        password = urlsplit(url).password
    except ValueError:
        return  # not a URL plog could open either; the store reports it
    if password:
        raise error(
            option,
            "the URL holds a password, which Spark would show in query plans and event logs; "
            f"remove it from the URL and give it as '{SECRET_PREFIX}password'",
        )


def spark_storage_options(storage_options: Mapping[str, Any]) -> dict[str, str]:
    """The Spark options that give fsspec ``storage_options`` (as the Python client takes them).

    A credential-like option becomes ``storage.secret.<name>``, any other ``storage.<name>``; values that are
    not strings travel as JSON, which the plog options decode: ``{"key": K, "anon": False}`` ->
    ``{"storage.secret.key": K, "storage.anon": "false"}``.
    """
    out: dict[str, str] = {}
    for name, value in storage_options.items():
        plain = STORAGE_PREFIX + name
        hidden = is_credential_name(name) or bool(credential_keys(value))
        option = SECRET_PREFIX + name if hidden and not spark_redacts(plain) else plain
        out[option] = value if isinstance(value, str) else json.dumps(value)
    return out
