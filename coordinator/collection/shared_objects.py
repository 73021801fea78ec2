"""Shared objects (PROTOCOL.md 10.2, *Garbage collection*): objects no commit names any more, and orphans.

::

    shared/<created_ms>-<id>.arrow   older than C + D (D: the largest delay of the topics it names)
        -> its shared JSON names topics t1, t2 (incarnations i1, i2)
        -> topics/t1/i1/commits/ and topics/t2/i2/commits/ listed *after* the listing of shared/
        -> no listed commit document (plain, range, on the chain or superseded) names it: deleted

An object is named by a commit created within ``C`` of the object (the writer's deadline, 7.3), so a commit
that will ever name it has landed before the commit listings, which are taken after the object turned
C + D old: an object none of them names is an orphan (its writer died between object and commit) or was
moved out of entirely. A deleted incarnation's commits name nothing.
"""

from __future__ import annotations

from segment_format.errors import CorruptRecordError, ObjectNotFoundError
from segment_format.layout import incarnation_prefix
from segment_format.shared.commit import COMMITS, Commit, parse_commit_name
from segment_format.shared.object import SharedMeta, parse_shared_key, read_shared_meta
from segment_format.shared.sequence import COMMIT_DEADLINE_MS
from segment_format.topic import read_topic_version

from .base import CollectionContext, NamespaceCollector
from .topics import DEFAULT_DELETE_DELAY_MS

SHARED_PREFIX = "shared/"


class SharedObjectsCollector(NamespaceCollector):
    """``shared/``: objects older than C + D that no commit document of the incarnations they name names."""

    namespace = "shared"
    #: Objects and commit documents never change: what a process read once it keeps (a pass re-reads nothing).
    _metas: dict[str, SharedMeta] = {}
    _named: dict[str, set[str]] = {}

    def collect(self, context: CollectionContext) -> int:
        """One listing of ``shared/``, then the candidates' topics, their commits, and the deletions."""
        store = context.store
        old: list[tuple[str, SharedMeta]] = []
        for info in store.list(SHARED_PREFIX):
            parsed = parse_shared_key(info.key)
            if parsed is None or context.now_ms - parsed[0] <= COMMIT_DEADLINE_MS:
                continue
            meta = self._meta(context, info.key)
            if meta is not None:
                old.append((info.key, meta))
        incarnations = {(t, doc["topic_id"]) for _, meta in old for t, doc in meta.topics.items()}
        delays = {name: self._delay(context, name) for name in {t for t, _ in incarnations}}
        due = [
            (key, meta)
            for key, meta in old
            if context.now_ms - meta.created_ms > COMMIT_DEADLINE_MS + max(delays[t] for t in meta.topics)
        ]
        if not due:
            return 0
        # Listed after the listing of shared/ (and after every object above turned C + D old): see the module doc.
        named: set[str] = set()
        unreadable: set[str] = set()
        for topic, topic_id in sorted({(t, doc["topic_id"]) for _, meta in due for t, doc in meta.topics.items()}):
            if context.spent():
                return 0
            found = self._names(context, incarnation_prefix(topic, topic_id) + COMMITS)
            if found is None:
                unreadable.add(topic)
            else:
                named |= found
        doomed = [key for key, meta in due if key not in named and not unreadable & meta.topics.keys()]
        if doomed:
            store.delete_many(doomed)
        return len(doomed)

    def _meta(self, context: CollectionContext, key: str) -> SharedMeta | None:
        found = self._metas.get(key)
        if found is None:
            try:
                found = self._metas[key] = read_shared_meta(context.store, key)
            except (ObjectNotFoundError, CorruptRecordError):
                return None  # gone, or damaged: kept for plog verify to name, never deleted on a guess
        return found

    @staticmethod
    def _delay(context: CollectionContext, topic: str) -> int:
        """The topic's ``file.delete.delay.ms`` in its current metadata (the default when it has none)."""
        versions = [
            number
            for info in context.store.list(f"topics/{topic}/meta/")
            if (number := _meta_number(info.key)) is not None
        ]
        if not versions:
            return DEFAULT_DELETE_DELAY_MS
        try:
            return int(read_topic_version(context.store, topic, max(versions)).config["file.delete.delay.ms"])
        except (ObjectNotFoundError, CorruptRecordError):
            return DEFAULT_DELETE_DELAY_MS

    def _names(self, context: CollectionContext, prefix: str) -> set[str] | None:
        """Every object named by a commit document listed under ``prefix`` now; None when one does not parse
        (what it names is unknown: the objects of its topic are kept, and ``plog verify`` names it)."""
        named: set[str] = set()
        for info in context.store.list(prefix):
            numbers = parse_commit_name(info.key[len(prefix) :])
            if numbers is None:
                continue
            found = self._named.get(info.key)
            if found is None:
                try:
                    commit = Commit.parse(context.store.get(info.key), info.key, numbers[0], numbers[1])
                except ObjectNotFoundError:
                    continue  # collected since the listing: its runs live in segments (10.2)
                except CorruptRecordError:
                    return None
                found = self._named[info.key] = {entry.object for entry in commit.entries}
            named |= found
        return named


def _meta_number(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


__all__ = ["SharedObjectsCollector", "SHARED_PREFIX"]
