"""Collection of the root's coordinator objects (PROTOCOL.md 11.1-11.4)."""

from .transactions import TransactionCollection, TransactionHistoryCollector

__all__ = ["TransactionCollection", "TransactionHistoryCollector"]
