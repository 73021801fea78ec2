"""``LogStore``: topic administration on a plog root (kafka-python's admin, simplified)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from coordinator.collection import collect
from coordinator.keys import lease_prefix, maintainer_lease_name
from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.client.metrics import counting_root
from pyspark_logsource.client.table_reader import READ_CHUNK_BYTES, Offsets, read_topic_from_root
from segment_format.log.reader import READ_COMMITTED
from segment_format.topic import TopicMetadata
from segment_format.typed.schema_import import value_schema_from


def _schema_description(meta: TopicMetadata) -> dict[str, Any]:
    """A typed topic's value schema, its compatibility mode and its history (nothing for an untyped topic)."""
    history = meta.schema_history
    if history is None:
        return {}
    return {
        "value_schema": history.current.schema,
        "value_schema_version": history.current.version,
        "value_schema_compatibility": history.compatibility,
        "value_schema_history": [
            {"version": e.version, "created_ms": e.created_ms, "schema": e.schema} for e in history.entries
        ],
    }


class LogStore:
    """Create, list, describe and delete topics under ``url`` (any fsspec URL or a local path)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.root = counting_root(url, storage_options)  # its store requests: plog top, maintain's metrics

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, Any] | None = None,
        *,
        value_schema: Any = None,
        value_schema_compatibility: str | None = None,
    ) -> TopicMetadata:
        """Create a topic with ``partitions`` partitions and Kafka-named ``config`` overrides.

        ``value_schema`` makes it a typed topic (PROTOCOL.md 11.8): a pyarrow schema, a Spark DDL string
        (``"user string, ts timestamp"``), an Avro or JSON Schema document, or a file holding one. Its
        records' values are then rows of that schema, checked on write and stored as columns;
        ``value_schema_compatibility`` (``BACKWARD`` by default, Confluent's modes) governs how it evolves.
        """
        schema = None if value_schema is None else value_schema_from(value_schema)
        return self.root.catalog.create(
            name, partitions, config, value_schema=schema, value_schema_compatibility=value_schema_compatibility
        )

    def evolve_value_schema(self, name: str, value_schema: Any, compatibility: str | None = None) -> TopicMetadata:
        """Give typed topic ``name`` a new value schema version, checked against its history under its
        compatibility mode (``InvalidConfigError`` naming each rule broken); ``compatibility`` also
        changes the mode for later changes. The same schema again changes nothing but the mode."""
        meta = self.root.catalog.update(name, evolve=(value_schema_from(value_schema), compatibility))
        self.root.forget_topic(name)
        return meta

    def list_topics(self) -> list[str]:
        """Names of all topics, sorted."""
        return self.root.catalog.names()

    def describe_topic(self, name: str) -> dict[str, Any]:
        """Topic id, config, and per partition: start and end offsets, bytes and segment count."""
        meta = self.root.topic(name, refresh=True)
        partitions = []
        for p, view in enumerate(self.root.partition_views(name, meta)):  # one LIST of the topic
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
            **_schema_description(meta),
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
        garbage (all topics if none named); for all topics, also run the root collector
        (:func:`coordinator.collection.collect`) and report what it deleted as ``collected_<namespace>``."""
        transactions = TransactionCoordinator(self.root.store)
        counts = self.root.maintain(name, transactions.resolve, transactions.decided_ms)
        if name is None:
            # The whole root: every other namespace by its collection rule too (PROTOCOL.md 3).
            report = collect(self.root)
            for namespace, deleted in report.deleted.items():
                counts[f"collected_{namespace.replace('-', '_')}"] = deleted
        return counts

    def read_topic(
        self,
        topic: str,
        partitions: int | Iterable[int] | None = None,
        *,
        start: Offsets = None,
        end: Offsets = None,
        start_time_ms: int | None = None,
        end_time_ms: int | None = None,
        columns: Sequence[str] | None = None,
        value_fields: Sequence[str] | None = None,
        isolation_level: str = READ_COMMITTED,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> pa.RecordBatchReader:
        """``topic``'s committed records as a ``pyarrow.RecordBatchReader`` (for DuckDB, Polars, pandas);
        the arguments are :func:`pyspark_logsource.read_topic`'s. The reader uses this store's root: read
        it before closing the store."""
        return read_topic_from_root(
            self.root,
            topic,
            partitions,
            start=start,
            end=end,
            start_time_ms=start_time_ms,
            end_time_ms=end_time_ms,
            columns=columns,
            value_fields=value_fields,
            isolation_level=isolation_level,
            chunk_bytes=chunk_bytes,
        )

    def close(self) -> None:
        """Release the store."""
        self.root.close()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
