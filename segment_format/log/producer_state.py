"""Producer state of one partition log: idempotent sequences, producer epochs, and finding a retried append.

Kafka keeps this in its ``ProducerStateManager``; plog keeps it per writing
process, because the log has no broker (PROTOCOL.md 11.1). For every producer
id that appended through this log it remembers the epoch and the next
sequence, so that a batch that skips or repeats a sequence is refused
(:class:`OutOfOrderSequenceError`) and a batch of an older epoch is fenced
(:class:`FencedError`). After an append fails ambiguously (a store error: the
object may or may not exist) it remembers the key tried, so that the retry
first looks whether the earlier attempt landed, instead of appending the
batch a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from ..errors import (
    ConcurrentAppendError,
    CorruptRecordError,
    FencedError,
    ObjectNotFoundError,
    OutOfOrderSequenceError,
)
from ..layout import appended_name
from ..segment import BatchMeta, SegmentIndex
from ..segment import read_index as read_segment_index
from ..stores.base import Store

#: The batches of one append: payload columns (no offsets) and what their producer states about them.
Payloads = Sequence[tuple[pa.RecordBatch, BatchMeta]]


def batch_identities(metas: Sequence[BatchMeta]) -> list[tuple[int, int, int]] | None:
    """(producer id, epoch, base sequence) of every batch; None if one is not idempotent (it cannot be recognised)."""
    out = [(m.producer_id, m.producer_epoch, m.base_sequence) for m in metas]
    return None if any(pid < 0 or seq < 0 for pid, _, seq in out) else out


class ProducerStateManager:
    """Sequences and epochs of the producers that append through one partition log, and their ambiguous tries."""

    def __init__(
        self, store: Store, prefix: str, name: str, read_index: Callable[[str], SegmentIndex] | None = None
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.name = name
        #: How an object's index is read: the log passes its index cache, so an index read here (another
        #: writer's object, met after losing a race) is not read again by whoever follows the chain next.
        self.read_index = read_index or (lambda key: read_segment_index(store, key))
        #: Per producer id written through this log: (epoch, next sequence) (PROTOCOL.md 11.1).
        self._producers: dict[int, tuple[int, int]] = {}
        #: Producer id -> key its last append tried before failing ambiguously.
        self._ambiguous: dict[int, str] = {}

    def check(self, payloads: Payloads) -> None:
        """Refuse batches that do not continue their producer's sequence, or whose epoch was fenced.

        Batches without a producer id or sequence are not idempotent and pass.
        Nothing is recorded: :meth:`record` does that once the append landed.
        """
        expected = dict(self._producers)
        for payload, meta in payloads:
            if meta.producer_id < 0 or meta.base_sequence < 0:
                continue
            known = expected.get(meta.producer_id)
            if known is not None:
                epoch, next_sequence = known
                if (meta.producer_epoch == epoch and meta.base_sequence != next_sequence) or (
                    meta.producer_epoch > epoch and meta.base_sequence != 0
                ):
                    raise OutOfOrderSequenceError(
                        f"{self.name}: producer {meta.producer_id} epoch {meta.producer_epoch} sent sequence "
                        f"{meta.base_sequence}, expected {next_sequence if meta.producer_epoch == epoch else 0}"
                    )
                if meta.producer_epoch < epoch:
                    raise FencedError(
                        f"{self.name}: producer {meta.producer_id} epoch {meta.producer_epoch} is older than {epoch}"
                    )
            expected[meta.producer_id] = (meta.producer_epoch, meta.base_sequence + payload.num_rows)

    def record(self, payloads: Payloads) -> None:
        """Advance each producer's next sequence past batches that were stored."""
        for payload, meta in payloads:
            if meta.producer_id >= 0 and meta.base_sequence >= 0:
                self._producers[meta.producer_id] = (meta.producer_epoch, meta.base_sequence + payload.num_rows)

    def adopt(self, producer_id: int, epoch: int, next_sequence: int) -> None:
        """Take a producer's epoch and next sequence as read from the log, replacing what this process
        remembered: a gateway whose producer wrote through another gateway meanwhile (PROTOCOL.md 11.9)."""
        self._producers[producer_id] = (epoch, next_sequence)

    def failed_ambiguously(self, first: BatchMeta, tried_key: str) -> None:
        """Remember that an idempotent append last tried ``tried_key`` and failed with the outcome unknown."""
        if first.producer_id >= 0 and first.base_sequence >= 0:
            self._ambiguous[first.producer_id] = tried_key  # the retry looks here first

    def take_ambiguous(self, first: BatchMeta) -> str | None:
        """The key (or, in a shared topic, ``commit:<n>``) ``first``'s producer last tried before failing
        ambiguously, forgotten as it is taken; None if none."""
        return self._ambiguous.pop(first.producer_id, None) if first.producer_id >= 0 else None

    def landed(self, key: str, append_id: str, metas: Sequence[BatchMeta]) -> SegmentIndex | None:
        """The index of the append stored at ``key`` if it is this attempt or the same batches (11.1).

        A conditional create whose response was lost and that the client
        retried answers "exists" although our bytes are stored (same
        ``append_id``); a retry after an ambiguous failure finds the earlier
        attempt by the producer ids, epochs and sequences of all its batches.
        None if ``key`` holds another writer's append, or nothing readable.
        """
        try:
            idx = self.read_index(key)
        except (ObjectNotFoundError, CorruptRecordError):
            return None
        return idx if self.matches(idx, append_id, metas) else None

    @staticmethod
    def matches(idx: SegmentIndex, append_id: str, metas: Sequence[BatchMeta]) -> bool:
        """Whether the object of ``idx`` is the append ``append_id``, or holds exactly the batches ``metas``
        describe, idempotent all, in order (11.1).

        Every batch must match, not only the first: an append may gather several producers' batches (a
        gateway's flush), and another writer's object may begin with the same producer's batch (a client that
        sent it to two gateways) yet hold none of the others; taking it as ours would acknowledge them unwritten.
        """
        if append_id and idx.meta.append_id == append_id:
            return True
        return bool(metas) and batch_identities(metas) == [
            (int(pid), int(epoch), int(seq))
            for pid, epoch, seq in zip(idx.producer_ids, idx.producer_epochs, idx.base_sequences, strict=True)
        ]

    @staticmethod
    def refuse_written_elsewhere(idx: SegmentIndex, metas: Sequence[BatchMeta], name: str) -> None:
        """Raise ``ConcurrentAppendError`` if another writer's object ``idx`` holds one of these batches.

        A client that sent a batch to two gateways (its leader moved) can have it appended by the other one
        while this append of it, gathered with other batches, is under way: appending it again would write
        it twice. The append fails instead; the retry finds the batch in the log (11.9) and writes the rest.
        """
        ours = {(m.producer_id, m.producer_epoch, m.base_sequence) for m in metas if batch_identities([m])}
        if not ours:
            return
        for pid, epoch, seq in zip(idx.producer_ids, idx.producer_epochs, idx.base_sequences, strict=True):
            if (int(pid), int(epoch), int(seq)) in ours:
                raise ConcurrentAppendError(
                    f"{name}: another writer appended the batch of producer {int(pid)} epoch {int(epoch)} "
                    f"sequence {int(seq)} meanwhile; retry"
                )

    def earlier_attempt(self, metas: Sequence[BatchMeta]) -> SegmentIndex | None:
        """After an append that failed ambiguously, the index of the object it stored, if it did (PROTOCOL.md 11.1).

        Follows the appended objects from the key the failed append last tried;
        one of them holding this producer's batch with the same sequence means
        the earlier attempt was stored. The memory of the failure is used up.
        """
        first = metas[0]
        key = self._ambiguous.pop(first.producer_id, None) if first.producer_id >= 0 else None
        while key is not None:
            try:
                idx = self.read_index(key)
            except (ObjectNotFoundError, CorruptRecordError):
                return None
            if self.matches(idx, "", metas):
                return idx
            key = self.prefix + "log/" + appended_name(idx.meta.next_offset)
        return None
