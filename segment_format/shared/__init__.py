"""Shared topics (PROTOCOL.md 7.3, 10.2): shared objects, commits, and a topic's sequence of commits.

What lives here, by concern: ``object`` (the shared object: runs of many partitions and topics, offsets
relative, its index), ``commit`` (the commit document, its entries and the index a run is read with) and
``sequence`` (one topic incarnation's commit chain as a process knows it: resolving it, following its
head, committing a flush).

May import: everything up to ``encoding`` (the layer of ``topic``); never ``log/``, ``root`` or ``inspect/``
(``tests/test_layering.py``).
"""
