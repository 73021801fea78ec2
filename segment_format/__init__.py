"""plog's storage layer: bytes on storage, segments, indexes and the partition log.

Knows nothing of Spark or leases (see PROTOCOL.md for the format it implements).
"""
