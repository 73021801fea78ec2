"""Where a loop of ``Producer.send(topic, value, partition=0)`` spends its time, stage by stage.

Usage::

    python benchmarks/profile_send.py [--records N] [--rounds K]

The producer's sender thread is replaced, stage by stage, by a shortened copy of itself, and the caller's
loop of sends is timed against each (every stage in a fresh process, ``K`` rounds, the median printed):

* ``no write``: the sender completes each buffer at once; the loop runs alone;
* ``build + route``: it also builds each buffer's Arrow batch and routes it, unless the send that sealed
  the buffer did (``Sender.prepare``: since then these two stages time the same);
* ``+ encode``: it also encodes each batch as the append would (offsets, Arrow IPC with lz4, CRC);
* ``full``: the real sender (appends, change notices, maintenance);
* ``full, the sender alone``: the real sender, held back until the loop has ended; only its writing of
  every record is timed (the caller waits in ``flush``).

Per stage: the loop's wall time per record, the calling thread's own CPU per record, and the time it was
blocked waiting for ``buffer_memory`` room (the sender behind). benchmarks/README.md reads the
tables before and after the sender learnt to keep up: while the caller's Python loop holds the GIL, every
GIL release of the sender's longer than the caller's wake-up (a NumPy call on a buffer, a compression, a
file write) costs the sender a switch interval before it runs again; with such calls per buffer it fell
behind, and the caller blocked for buffer room.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

STAGES = ("no write", "build + route", "+ encode", "full", "full, the sender alone")
#: Set once the loop has ended: in the last stage the sender takes nothing before, then writes it all.
_LOOP_DONE = threading.Event()


def _patch(stage: str, waits: list[float]) -> None:
    """Shorten the sender to ``stage`` and count the caller's waits for buffer room into ``waits``."""
    import pyspark_logsource.client.accumulator as accumulator
    import pyspark_logsource.client.sender as sender
    from segment_format.encoding import encode_batches
    from segment_format.segment import BatchMeta, ipc_options

    wait_for_room = accumulator.RecordAccumulator.wait_for_room

    def counted_wait(self: Any) -> None:
        start = time.perf_counter()
        try:
            wait_for_room(self)
        finally:
            waits.append(time.perf_counter() - start)

    accumulator.RecordAccumulator.wait_for_room = counted_wait  # type: ignore[method-assign]
    if stage == "full, the sender alone":
        take_sealed = accumulator.RecordAccumulator.take_sealed

        def take_after_the_loop(self: Any) -> Any:
            _LOOP_DONE.wait()
            return take_sealed(self)

        accumulator.RecordAccumulator.take_sealed = take_after_the_loop  # type: ignore[method-assign]
    if stage.startswith("full"):
        return
    options = ipc_options("lz4")

    def write_run(self: Any, buffers: list[Any]) -> set[int]:
        try:
            meta = self.root.topic(buffers[0].topic)
            for buffer in buffers:
                n = len(buffer.values)
                if stage == "no write":
                    buffer.out_partitions = np.zeros(n, np.int32)
                else:
                    routed = buffer.routed if buffer.routed is not None else self._routed(buffer, meta)
                    buffer.out_partitions = routed.partitions
                    if stage == "+ encode":
                        for _encoded in encode_batches([(routed.payload, BatchMeta(), 0)], options, None):
                            pass
                buffer.out_offsets = np.zeros(n, np.int64)
        finally:
            for buffer in buffers:
                buffer.done.set()
        return set()  # no partition written, none to maintain

    sender.Sender.write_run = write_run  # type: ignore[method-assign]


def run_stage(stage: str, records: int, rounds: int) -> dict[str, float]:
    """This process: ``rounds`` timed loops (after one not counted) of ``records`` sends under ``stage``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_client import make_values

    waits: list[float] = []
    _patch(stage, waits)
    from pyspark_logsource import LogStore, Producer

    values = make_values(records, 100, seed=1)
    root = tempfile.mkdtemp(prefix="plog-profile-send-")
    admin = LogStore(root)
    alone = stage == "full, the sender alone"
    # The sender alone holds every record back until the loop has ended: buffer_memory must hold them all.
    config: dict[str, Any] = {"buffer_memory": 2**40} if alone else {}
    walls, cpus, blocked = [], [], []
    for round_number in range(rounds + 1):
        name = f"t{round_number}"
        admin.create_topic(name, 1, {"compression.type": "lz4"})
        waits.clear()
        _LOOP_DONE.clear()
        with Producer(root, compression_type="lz4", acks=1, **config) as producer:
            send = producer.send
            cpu0, t0 = time.thread_time(), time.perf_counter()
            for value in values:
                send(name, value, partition=0)
            if alone:  # only the writing is timed, after the loop
                cpu0, t0 = time.thread_time(), time.perf_counter()
                _LOOP_DONE.set()
            producer.flush()
            wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        if round_number:  # the first round warms the process up
            walls.append(wall)
            cpus.append(cpu)
            blocked.append(sum(waits))
    admin.close()
    per = 1e9 / records
    return {
        "wall_ns": float(np.median(walls)) * per,
        "caller_cpu_ns": float(np.median(cpus)) * per,
        "blocked_ns": float(np.median(blocked)) * per,
        "threads": threading.active_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_500_000, help="sends per round (default 1,500,000)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per stage (default 3)")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # one stage, in a child process
    args = parser.parse_args(argv)
    if args.stage:
        print(json.dumps(run_stage(args.stage, args.records, args.rounds)))
        return 0
    print(f"{args.records:,} x send(topic, 100 B value, partition=0) + flush, lz4, acks=1; median of {args.rounds}")
    print()
    print("| sender does | ns/record, wall | caller's CPU ns/record | caller blocked for buffer room, ns/record |")
    print("|---|---:|---:|---:|")
    for stage in STAGES:
        command = [sys.executable, os.path.abspath(__file__), "--stage", stage]
        command += ["--records", str(args.records), "--rounds", str(args.rounds)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        print(f"| {stage} | {row['wall_ns']:,.0f} | {row['caller_cpu_ns']:,.0f} | {row['blocked_ns']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
