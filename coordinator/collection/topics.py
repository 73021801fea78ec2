"""Topics (PROTOCOL.md 4, *Collection*): leftovers of deleted incarnations, old metadata versions, and the
maintainer leases of deleted topics.

One listing of ``topics/`` shows every topic's metadata versions and the incarnations (topic ids) that
have objects. The current metadata is read *after* that listing, so an object listed under another id
belongs to an incarnation whose metadata was gone when it was read: deleted, since an incarnation's
metadata exists before any of its objects and a topic id never returns.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from segment_format.errors import CorruptRecordError, ObjectNotFoundError, PlogError
from segment_format.layout import TOPIC_NAME, notice_key, topic_meta_key
from segment_format.notice import ChangeNotice
from segment_format.numbered import parse_number
from segment_format.topic import read_topic_version

from ..keys import LEASES, maintainer_lease_name
from .base import CollectionContext, NamespaceCollector

#: A topic id (PROTOCOL.md 3): 32 lowercase hex digits.
TOPIC_ID = re.compile(r"^[0-9a-f]{32}$")
#: D of a topic whose metadata is gone (assumption A4's default).
DEFAULT_DELETE_DELAY_MS = 20 * 60 * 1000
#: Metadata versions a topic keeps: the newest, and the one before, which a reader holding it checks with
#: two GETs (PROTOCOL.md 4, *Checking known metadata without a listing*).
META_VERSIONS_KEPT = 2


@dataclass
class _Topic:
    meta: list[tuple[int, str]] = field(default_factory=list)
    by_id: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


class TopicsCollector(NamespaceCollector):
    """``topics/<topic>/``: incarnations no metadata names, metadata versions below the newest two, and
    ``_coordinator/leases/maintainer=<topic>/`` of topics without metadata."""

    namespace = "topics"
    #: Every 36th pass (6 hours at the default interval): the listing covers every object of the root.
    every = 36

    def collect(self, context: CollectionContext) -> int:
        """One listing of ``topics/`` (and of the leases), then one step per topic."""
        store = context.store
        leases = {info.key[len(LEASES) :].split("/", 1)[0] for info in store.list(LEASES)}
        topics: dict[str, _Topic] = defaultdict(_Topic)
        for info in store.list("topics/"):
            parts = info.key.split("/")
            if len(parts) < 4 or not TOPIC_NAME.match(parts[1]):
                continue
            entry = topics[parts[1]]
            if parts[2] == "meta" and len(parts) == 4:
                number = parse_number(info.key)
                if number is not None:
                    entry.meta.append((number, info.key))
            elif TOPIC_ID.match(parts[2]):
                entry.by_id[parts[2]].append(info.key)
        deleted = 0
        for name in sorted(topics):
            if context.spent():
                return deleted
            deleted += self._one(context, name, topics[name])
        # Leases of topics that no longer exist; the topic listing above predates this check, and a lease
        # deleted in a race with a topic's creation costs one early maintenance pass (10.1), nothing else.
        existing = {maintainer_lease_name(name) for name, t in topics.items() if t.meta}
        for lease in sorted(leases):
            if context.spent():
                break
            if lease.startswith("maintainer=") and lease not in existing:
                deleted += store.delete_prefix(f"{LEASES}{lease}/")
        return deleted

    def _one(self, context: CollectionContext, name: str, topic: _Topic) -> int:
        store = context.store
        current_id, delay_ms = None, DEFAULT_DELETE_DELAY_MS
        deleted = 0
        if topic.meta:
            version, _ = max(topic.meta)
            try:
                meta = read_topic_version(store, name, version)
            except (ObjectNotFoundError, CorruptRecordError):
                return 0  # changed or deleted since the listing: the next pass decides
            current_id, delay_ms = meta.topic_id, int(meta.config["file.delete.delay.ms"])
            older = sorted(n for n, _ in topic.meta if n < version - (META_VERSIONS_KEPT - 1))
            if older and context.now_ms - meta.created_ms > delay_ms:
                for n in older:  # ascending, so that a reader that finds v + 1 absent finds v absent too
                    store.delete(topic_meta_key(name, n))
                    deleted += 1
        for topic_id, keys in sorted(topic.by_id.items()):
            if topic_id == current_id or context.spent():
                continue
            if self._recent_notice(context, name, topic_id, delay_ms):
                continue
            store.delete_many(keys)
            deleted += len(keys)
        return deleted

    @staticmethod
    def _recent_notice(context: CollectionContext, name: str, topic_id: str, delay_ms: int) -> bool:
        """Whether the deleted incarnation's change notice was written less than D ago (its last append)."""
        try:
            body = context.store.get(notice_key(name, topic_id))
        except ObjectNotFoundError:
            return False
        try:
            notice = ChangeNotice.from_json(body, what=notice_key(name, topic_id))
        except PlogError:
            return False  # a notice that does not decode holds no data (9.1)
        return context.now_ms - notice.written_ms <= delay_ms
