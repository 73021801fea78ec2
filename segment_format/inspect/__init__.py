"""Looking at a root without changing it: data-only listings (``listings``) and the verifier (``verify``).

Nothing here writes. Its modules are imported by name (``from segment_format.inspect import listings``);
this package imports neither eagerly, so that importing one does not load the other.

May import: everything else in ``segment_format``; nothing in ``segment_format`` imports it (checked by
``tests/test_layering.py``).
"""

from __future__ import annotations

__all__ = ["listings", "verify"]
