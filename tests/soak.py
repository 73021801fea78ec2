"""Short forms for CI, long forms for a nightly run: how hard the soak and crash tests push.

CI runs every soak test in a short form that still checks each property the long form checks (a kill
mid-batch and one between batches, an executor lost, faults injected); ``PLOG_LONG=1`` (what
``benchmarks/soak`` sets) runs the long form, with more kills, rounds and examples.
"""

from __future__ import annotations

import os

#: Whether this run is the long (nightly) form.
LONG = os.environ.get("PLOG_LONG", "") == "1"


def soak(ci: int, long: int) -> int:
    """``long`` in the long form, else ``ci``."""
    return long if LONG else ci
