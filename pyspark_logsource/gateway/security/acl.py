"""ACLs by principal, read from a JSON file (``plog serve --acls FILE``), with Kafka's semantics.

The file is a JSON list of rules::

    [{"principal": "User:alice", "resource": "topic", "name": "orders", "pattern": "literal",
      "operations": ["read", "describe"], "permission": "allow"},
     {"principal": "User:*", "resource": "group", "name": "etl-", "pattern": "prefixed",
      "operations": ["read"], "permission": "allow"}]

- ``principal``: ``"User:<name>"`` or ``"User:*"`` (every user).
- ``resource``: ``topic``, ``group``, ``cluster`` or ``transactional_id``.
- ``name``: the resource's name, or ``"*"`` for every name (with the literal pattern). For ``cluster`` it may
  be left out; Kafka's cluster resource is called ``kafka-cluster``.
- ``pattern``: ``literal`` (the default; the exact name, or ``*``) or ``prefixed`` (every name that starts
  with ``name``).
- ``operations``: among those Kafka allows for the resource (below), or ``all``.
- ``permission``: ``allow`` or ``deny``.

As in Kafka: a matching deny wins over any allow; no matching allow means denied; an allow of ``read``,
``write``, ``delete`` or ``alter`` implies ``describe``, and an allow of ``alter_configs`` implies
``describe_configs`` (a deny implies nothing but itself, except that a deny of ``all`` denies everything).
Kafka's rule that a ``write`` on any topic grants ``idempotent_write`` on the cluster is about a request, not
about one resource, so the server applies it where it handles InitProducerId, with :meth:`Authorizer.allowed_on_any`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark_logsource.gateway.errors import AuthorizationDeniedError
from pyspark_logsource.gateway.security.errors import InvalidAclFileError

TOPIC = "topic"
GROUP = "group"
CLUSTER = "cluster"
TRANSACTIONAL_ID = "transactional_id"
#: The one cluster resource's name, as Kafka calls it.
CLUSTER_NAME = "kafka-cluster"

#: The operations Kafka accepts in an ACL on each resource type (Kafka's AclEntry.supportedOperations).
OPERATIONS: Mapping[str, frozenset[str]] = {
    TOPIC: frozenset({"read", "write", "create", "delete", "alter", "describe", "describe_configs", "alter_configs"}),
    GROUP: frozenset({"read", "describe", "delete"}),
    CLUSTER: frozenset(
        {"create", "cluster_action", "describe_configs", "alter_configs", "idempotent_write", "alter", "describe"}
    ),
    TRANSACTIONAL_ID: frozenset({"describe", "write"}),
}
ALL = "all"

#: An allow of the key implies an allow of these too (Kafka's AclAuthorizer).
_IMPLIED_BY_ALLOW: Mapping[str, frozenset[str]] = {
    "describe": frozenset({"read", "write", "delete", "alter"}),
    "describe_configs": frozenset({"alter_configs"}),
}

#: Kafka's error code for a denial, by resource type.
_DENIAL_CODES: Mapping[str, int] = {
    TOPIC: 29,  # TOPIC_AUTHORIZATION_FAILED
    GROUP: 30,  # GROUP_AUTHORIZATION_FAILED
    CLUSTER: 31,  # CLUSTER_AUTHORIZATION_FAILED
    TRANSACTIONAL_ID: 53,  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
}

_RULE_KEYS = frozenset({"principal", "resource", "name", "pattern", "operations", "permission"})


def denial_error_code(resource: str) -> int:
    """Kafka's error code for a denied operation on a resource of type ``resource``: topic 29, group 30,
    cluster 31, transactional_id 53. Raise InvalidAclFileError for an unknown resource type."""
    try:
        return _DENIAL_CODES[resource]
    except KeyError:
        known = sorted(_DENIAL_CODES)
        raise InvalidAclFileError(f"unknown resource type {resource!r}; expected one of {known}") from None


@dataclass(frozen=True)
class AclRule:
    """One ACL: who (``principal``), what (``resource``, ``name``, ``pattern``), which operations, allow or deny."""

    principal: str
    resource: str
    name: str
    pattern: str
    operations: frozenset[str]
    permission: str

    def matches(self, principal: str, resource: str, name: str) -> bool:
        """True if the rule is about this principal and this resource (whatever its operations)."""
        if self.resource != resource:
            return False
        if not _principal_matches(self.principal, principal):
            return False
        if self.pattern == "prefixed":
            return name.startswith(self.name)
        return self.name in ("*", name)


def _principal_matches(rule_principal: str, principal: str) -> bool:
    return rule_principal == principal or (rule_principal == "User:*" and principal.startswith("User:"))


def _covers(deny: AclRule, allow: AclRule) -> bool:
    """Whether a deny rule takes away every name an allow rule names (for :meth:`Authorizer.allowed_on_any`)."""
    if deny.pattern == "literal" and deny.name == "*":
        return True
    if deny.pattern == "prefixed":
        return allow.name != "*" and allow.name.startswith(deny.name)
    return allow.pattern == "literal" and allow.name == deny.name


def _check_operation(resource: str, operation: str) -> None:
    if resource not in OPERATIONS:
        raise InvalidAclFileError(f"unknown resource type {resource!r}; expected one of {sorted(OPERATIONS)}")
    if operation not in OPERATIONS[resource]:
        raise InvalidAclFileError(
            f"operation {operation!r} does not apply to a {resource}; expected one of {sorted(OPERATIONS[resource])}"
        )


class Authorizer:
    """Answers whether a principal may perform an operation on a resource, by the rules of an ACL file."""

    def __init__(self, rules: Iterable[AclRule], *, allow_everything: bool = False) -> None:
        self.rules: tuple[AclRule, ...] = tuple(rules)
        self.allow_everything = allow_everything
        # Rules by resource type: a check looks at the rules of its own type only.
        self._by_resource: dict[str, list[AclRule]] = {}
        for rule in self.rules:
            self._by_resource.setdefault(rule.resource, []).append(rule)

    def __repr__(self) -> str:
        if self.allow_everything:
            return "Authorizer.allow_all()"
        return f"Authorizer(rules={len(self.rules)})"

    @classmethod
    def allow_all(cls) -> Authorizer:
        """An authorizer that allows everything (``plog serve`` without ``--acls``)."""
        return cls((), allow_everything=True)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Authorizer:
        """Read an ACL file; raise InvalidAclFileError naming the file and the rule index if it is bad."""
        path = Path(path)
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidAclFileError(f"cannot read ACL file {str(path)!r}: {e}") from e
        except json.JSONDecodeError as e:
            raise InvalidAclFileError(f"ACL file {str(path)!r} is not JSON: {e}") from e
        try:
            return cls.from_rules(document)
        except InvalidAclFileError as e:
            raise InvalidAclFileError(f"ACL file {str(path)!r}: {e}") from e

    @classmethod
    def from_rules(cls, document: Any) -> Authorizer:
        """An authorizer from the parsed JSON of an ACL file (a list of rule objects); raise InvalidAclFileError
        naming the rule index of a bad rule."""
        if not isinstance(document, list):
            raise InvalidAclFileError("the top level must be a JSON list of rules")
        return cls(_parse_rule(i, rule) for i, rule in enumerate(document))

    def allowed(self, principal: str, resource: str, name: str, operation: str) -> bool:
        """True if ``principal`` (``"User:alice"``) may perform ``operation`` on the ``resource`` (``"topic"``,
        ``"group"``, ``"cluster"``, ``"transactional_id"``) called ``name``. Raise InvalidAclFileError for an
        operation that does not apply to the resource type (a caller's mistake, never a denial)."""
        _check_operation(resource, operation)
        if self.allow_everything:
            return True
        matching = [r for r in self._by_resource.get(resource, ()) if r.matches(principal, resource, name)]
        if any(r.permission == "deny" and (operation in r.operations or ALL in r.operations) for r in matching):
            return False
        granting = {operation, ALL} | _IMPLIED_BY_ALLOW.get(operation, frozenset())
        return any(r.permission == "allow" and not granting.isdisjoint(r.operations) for r in matching)

    def allowed_on_any(self, principal: str, resource: str, operation: str) -> bool:
        """True if ``principal`` may perform ``operation`` on at least one ``resource`` of the type, whatever its
        name (Kafka's ``authorizeByResourceType``): some allow rule grants it, and no deny rule covers every name
        that allow names. A deny on ``*`` covers everything; a literal deny covers the same literal allow; a
        prefixed deny covers the allows whose name starts with its prefix. Used for Kafka's rule that a ``write``
        on any topic grants an idempotent producer id."""
        _check_operation(resource, operation)
        if self.allow_everything:
            return True
        rules = [r for r in self._by_resource.get(resource, ()) if _principal_matches(r.principal, principal)]
        denies = [r for r in rules if r.permission == "deny" and (operation in r.operations or ALL in r.operations)]
        granting = {operation, ALL} | _IMPLIED_BY_ALLOW.get(operation, frozenset())
        return any(
            r.permission == "allow" and not granting.isdisjoint(r.operations) and not any(_covers(d, r) for d in denies)
            for r in rules
        )

    def authorize(self, principal: str, resource: str, name: str, operation: str) -> None:
        """Raise AuthorizationDeniedError, carrying :func:`denial_error_code` of the resource type and naming
        the principal, operation and resource, unless :meth:`allowed`."""
        if not self.allowed(principal, resource, name, operation):
            raise AuthorizationDeniedError(
                f"{principal} is not allowed to {operation} {resource} {name!r}", denial_error_code(resource)
            )


def _parse_rule(index: int, rule: Any) -> AclRule:
    def bad(what: str) -> InvalidAclFileError:
        return InvalidAclFileError(f"rule {index}: {what}")

    if not isinstance(rule, dict):
        raise bad("must be a JSON object")
    unknown = set(rule) - _RULE_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}; a rule has {sorted(_RULE_KEYS)}")
    for key in ("principal", "resource", "operations", "permission"):
        if key not in rule:
            raise bad(f"missing {key!r}")

    principal = rule["principal"]
    if not isinstance(principal, str) or not principal.startswith("User:") or len(principal) == len("User:"):
        raise bad(f"principal {principal!r} must be 'User:<name>' or 'User:*'")

    resource = rule["resource"]
    if resource not in OPERATIONS:
        raise bad(f"resource {resource!r} must be one of {sorted(OPERATIONS)}")

    name = rule.get("name", CLUSTER_NAME if resource == CLUSTER else None)
    if not isinstance(name, str) or not name:
        raise bad(f"name {name!r} must be a non-empty string ('*' for every {resource})")

    pattern = rule.get("pattern", "literal")
    if pattern not in ("literal", "prefixed"):
        raise bad(f"pattern {pattern!r} must be 'literal' or 'prefixed'")
    if pattern == "prefixed" and name == "*":
        raise bad("a prefixed pattern cannot have the name '*'; use the literal '*' for every name")

    operations = rule["operations"]
    if not isinstance(operations, list) or not operations or not all(isinstance(op, str) for op in operations):
        raise bad("operations must be a non-empty list of strings")
    for op in operations:
        if op != ALL and op not in OPERATIONS[resource]:
            expected = sorted(OPERATIONS[resource])
            raise bad(f"operation {op!r} does not apply to a {resource}; expected {expected} or 'all'")

    permission = rule["permission"]
    if permission not in ("allow", "deny"):
        raise bad(f"permission {permission!r} must be 'allow' or 'deny'")

    return AclRule(principal, resource, name, pattern, frozenset(operations), permission)
