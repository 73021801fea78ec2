"""The Kafka APIs the gateway serves, one module per concern; :func:`all_apis` gathers them."""

from __future__ import annotations

import importlib

from ..context import Api

#: Modules that define ``APIS: list[Api]``.
_MODULES = ("cluster", "sasl", "produce", "fetch", "offsets", "groups", "group_offsets", "transactions", "admin")


def all_apis() -> dict[int, Api]:
    """Every API the gateway serves, by key."""
    apis: dict[int, Api] = {}
    for name in _MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            continue  # a concern not built into this version
        for api in module.APIS:
            if api.key in apis:
                raise RuntimeError(f"API key {api.key} ({api.name}) is defined twice")
            apis[api.key] = api
    return apis
