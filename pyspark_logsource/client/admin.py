"""``LogStore``: topic administration on a plog root (kafka-python's admin, simplified)."""

from __future__ import annotations

from typing import Any

from coordinator.keys import lease_prefix, maintainer_lease_name
from coordinator.transactions import TransactionCoordinator
from segment_format.root import LogRoot
from segment_format.topic import TopicMetadata


class LogStore:
    """Create, list, describe and delete topics under ``url`` (any fsspec URL or a local path)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.root = LogRoot(url, storage_options)

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, Any] | None = None) -> TopicMetadata:
        """Create a topic with ``partitions`` partitions and Kafka-named ``config`` overrides."""
        return self.root.catalog.create(name, partitions, config)

    def list_topics(self) -> list[str]:
        """Names of all topics, sorted."""
        return self.root.catalog.names()

    def describe_topic(self, name: str) -> dict[str, Any]:
        """Topic id, config, and per partition: start and end offsets, bytes and segment count."""
        meta = self.root.topic(name, refresh=True)
        partitions = []
        for p in range(meta.partitions):
            view = self.root.partition(name, p, meta).view()
            partitions.append(
                {
                    "partition": p,
                    "start_offset": view.start_offset,
                    "end_offset": view.end_offset,
                    "bytes": sum(s.size for s in view.segments),
                    "segments": len(view.segments),
                }
            )
        return {
            "name": meta.name,
            "topic_id": meta.topic_id,
            "partitions": partitions,
            "config": dict(meta.config),
        }

    def delete_topic(self, name: str) -> None:
        """Delete the topic and all its data, and its maintainer lease (PROTOCOL.md 10.1)."""
        self.root.catalog.delete(name)
        self.root.forget_topic(name)
        # The lease only paces maintenance: a topic created again under the name starts without one.
        self.root.store.delete_prefix(lease_prefix(maintainer_lease_name(name)))

    def create_partitions(self, name: str, total: int) -> TopicMetadata:
        """Grow ``name`` to ``total`` partitions (never fewer)."""
        meta = self.root.catalog.update(name, partitions=total)
        self.root.forget_topic(name)
        return meta

    def alter_config(self, name: str, config: dict[str, Any]) -> TopicMetadata:
        """Change topic config keys; the rest keep their values."""
        meta = self.root.catalog.update(name, config=config)
        self.root.forget_topic(name)
        return meta

    def delete_records(self, name: str, before: dict[int, int]) -> dict[int, int]:
        """Move each partition's log start offset to the given offset; returns the new starts."""
        return {p: self.root.partition(name, p).delete_records(offset) for p, offset in before.items()}

    def maintain(self, name: str | None = None) -> dict[str, int]:
        """Compact compacted topics when due, merge small segment objects, apply retention and delete
        garbage (all topics if none named)."""
        transactions = TransactionCoordinator(self.root.store)
        return self.root.maintain(name, transactions.resolve, transactions.decided_ms)

    def close(self) -> None:
        """Release the store."""
        self.root.close()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
