"""Typed topics (PROTOCOL.md 11.8) against JSON values, the way Kafka users carry records today.

Usage::

    python benchmarks/bench_typed.py [--records N] [--repeat R] [--quick]

The same ``N`` records of ten fields (four strings, four integers, two doubles; 1,000,000 by default)
go to two topics of one root, two partitions each:

* **typed**: a typed topic whose value schema has the ten fields, stored as Arrow columns;
* **JSON**: an untyped topic whose values are the same records as JSON objects (``json.dumps``).

Writes (the Python client, one process):

* ``send_batch``: the typed table (fields as columns) against a table of the JSON values, already
  serialised (the untyped row does not pay for the serialisation; a third row shows what it costs);
* ``send``, per record: a dict to the typed topic against its ``json.dumps`` bytes to the JSON topic
  (``--send-records``, 200,000 by default).

Reads (one local[2] SparkSession, batch reads into Spark's ``noop`` sink, 2 of the 10 fields):

* **typed, valueFields**: ``option("valueFields", "country,amount")``: only those two columns are
  decompressed and decoded;
* **typed, all fields**: the whole value struct is decoded, then Spark selects two fields;
* **JSON, from_json**: ``from_json(value, schema)`` and the same two fields.

Each read runs once untimed, then ``--repeat`` times interleaved; the table shows the median time,
records/s and the ratio to the JSON row (higher is better for plog). MB/s counts the JSON bytes of
the records read (the same information in every row).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from spark_common import local_spark, machine  # also puts the project root on sys.path

from pyspark_logsource import LogStore, Producer

SCHEMA = (
    "user string, page string, country string, agent string, n int, count bigint, amount bigint, "
    "session bigint, score double, ratio double"
)
FIELDS = ("country", "amount")


def make_table(records: int, seed: int = 7) -> pa.Table:
    """The records, fields as columns, with a key column."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i:05d}" for i in range(5000)])
    countries = np.array(["fr", "de", "us", "jp", "br", "in", "ng", "cn"])
    return pa.table(
        {
            "key": pa.array(np.char.add("k", rng.integers(0, 100_000, records).astype(str))),
            "user": pa.array(np.char.add("user-", rng.integers(0, 1_000_000, records).astype(str))),
            "page": pa.array(words[rng.integers(0, len(words), records)]),
            "country": pa.array(countries[rng.integers(0, len(countries), records)]),
            "agent": pa.array(np.char.add("agent/", rng.integers(0, 50, records).astype(str))),
            "n": pa.array(rng.integers(0, 1000, records, dtype=np.int32)),
            "count": pa.array(rng.integers(0, 10**9, records)),
            "amount": pa.array(rng.integers(0, 10**6, records)),
            "session": pa.array(rng.integers(0, 10**12, records)),
            "score": pa.array(rng.random(records)),
            "ratio": pa.array(rng.random(records)),
        }
    )


def json_values(table: pa.Table) -> list[bytes]:
    """Each record's fields as a compact JSON object (what a Kafka producer would send)."""
    rows = table.drop_columns(["key"]).to_pylist()
    return [json.dumps(row, separators=(",", ":")).encode() for row in rows]


def timed(fn: Any) -> float:
    """Wall seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_writes(
    root: Path, table: pa.Table, values: list[bytes], send_records: int, repeat: int
) -> list[tuple[str, float, int]]:
    """(row, median seconds, records) for the write rows, each run on fresh topics."""
    json_table = pa.table({"key": table.column("key"), "value": pa.array(values, pa.binary())})
    rows: dict[str, list[float]] = {
        "typed send_batch": [],
        "JSON send_batch": [],
        "JSON serialisation (json.dumps)": [],
        "typed send(dict)": [],
        "JSON send(bytes)": [],
    }
    dicts = table.slice(0, send_records).drop_columns(["key"]).to_pylist()
    keys = table.column("key").slice(0, send_records).to_pylist()
    for run in range(repeat + 1):
        url = str(root / f"writes-{run}")
        admin = LogStore(url)
        admin.create_topic("typed", 2, {"auto.maintenance.enable": False}, value_schema=SCHEMA)
        admin.create_topic("json", 2, {"auto.maintenance.enable": False})
        admin.create_topic("typed1", 2, {"auto.maintenance.enable": False}, value_schema=SCHEMA)
        admin.create_topic("json1", 2, {"auto.maintenance.enable": False})
        with Producer(url) as producer:
            got = {
                "typed send_batch": timed(lambda: producer.send_batch("typed", table)),
                "JSON send_batch": timed(lambda: producer.send_batch("json", json_table)),
                "JSON serialisation (json.dumps)": timed(lambda: json_values(table.slice(0, len(values) // 10))) * 10,
            }

            def send_typed() -> None:
                for key, value in zip(keys, dicts, strict=True):
                    producer.send("typed1", value, key=key)
                producer.flush()

            def send_json() -> None:
                for key, value in zip(keys, dicts, strict=True):
                    producer.send("json1", json.dumps(value, separators=(",", ":")).encode(), key=key)
                producer.flush()

            got["typed send(dict)"] = timed(send_typed)
            got["JSON send(bytes)"] = timed(send_json)
        shutil.rmtree(url, ignore_errors=True)
        if run:  # the first run warms caches and imports
            for name, seconds in got.items():
                rows[name].append(seconds)
    n = len(values)
    counts = {"typed send(dict)": send_records, "JSON send(bytes)": send_records}
    return [(name, statistics.median(times), counts.get(name, n)) for name, times in rows.items()]


def bench_reads(url: str, records: int, repeat: int) -> list[tuple[str, float, int]]:
    """(row, median seconds, records) for the Spark read rows."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    spark = local_spark("plog-bench-typed")
    schema = SCHEMA
    queries = {
        "typed, valueFields": lambda: (
            spark.read.format("plog")
            .option("url", url)
            .option("subscribe", "typed")
            .option("valueFields", ",".join(FIELDS))
            .load()
            .select(*(F.col(f"value.{f}") for f in FIELDS))
        ),
        "typed, all fields": lambda: (
            spark.read.format("plog")
            .option("url", url)
            .option("subscribe", "typed")
            .load()
            .select(*(F.col(f"value.{f}") for f in FIELDS))
        ),
        "JSON, from_json": lambda: (
            spark.read.format("plog")
            .option("url", url)
            .option("subscribe", "json")
            .load()
            .select(F.from_json(F.col("value").cast("string"), schema).alias("v"))
            .select(*(F.col(f"v.{f}") for f in FIELDS))
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in queries}
    for run in range(repeat + 1):
        for name, query in queries.items():
            seconds = timed(lambda q=query: q().write.format("noop").mode("overwrite").save())
            if run:
                times[name].append(seconds)
    check = queries["typed, valueFields"]().agg(F.sum("amount")).collect()[0][0]
    expected = queries["JSON, from_json"]().agg(F.sum("amount")).collect()[0][0]
    if check != expected:
        raise RuntimeError(f"typed and JSON reads disagree: {check} != {expected}")
    spark.stop()
    return [(name, statistics.median(values), records) for name, values in times.items()]


def print_table(title: str, rows: list[tuple[str, float, int]], against: dict[str, str], json_bytes: float) -> None:
    """One table: time, records/s, MB/s of JSON-equivalent bytes, and each row's throughput over that of the
    row ``against`` names for it (its JSON counterpart, measured in the same run)."""
    rates = {name: n / seconds for name, seconds, n in rows}
    print(f"\n{title}\n")
    print("| path | records | time | records/s | MB/s (as JSON) | vs its JSON counterpart |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, seconds, n in rows:
        if name in against:
            ratio = f"{rates[name] / rates[against[name]]:.2f}x"
        else:
            ratio = "reference" if name in against.values() else "-"
        print(
            f"| {name} | {n:,} | {seconds:.3f} s | {rates[name] / 1e6:.2f} M | "
            f"{rates[name] * json_bytes / 1e6:.0f} | {ratio} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--send-records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100,000 records, 20,000 sends, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.records, args.send_records, args.repeat = 100_000, 20_000, 1
    table = make_table(args.records)
    values = json_values(table)
    json_bytes = sum(map(len, values)) / len(values)
    print(f"# bench_typed: {dt.date.today()}, {machine()}")
    print(f"{args.records:,} records of 10 fields ({json_bytes:.0f} B as JSON); median of {args.repeat} runs")
    with tempfile.TemporaryDirectory(prefix="plog-typed-") as tmp:
        root = Path(tmp)
        writes = bench_writes(root, table, values, args.send_records, args.repeat)
        url = str(root / "reads")
        admin = LogStore(url)
        admin.create_topic("typed", 2, {"auto.maintenance.enable": False}, value_schema=SCHEMA)
        admin.create_topic("json", 2, {"auto.maintenance.enable": False})
        with Producer(url) as producer:
            producer.send_batch("typed", table)
            producer.send_batch("json", pa.table({"key": table.column("key"), "value": pa.array(values, pa.binary())}))
        stored = {
            topic: sum(p["bytes"] for p in admin.describe_topic(topic)["partitions"]) for topic in ("typed", "json")
        }
        reads = bench_reads(url, args.records, args.repeat)
    write_pairs = {"typed send_batch": "JSON send_batch", "typed send(dict)": "JSON send(bytes)"}
    print_table("Writes (Python client)", writes, write_pairs, json_bytes)
    print(f"\nStored: typed {stored['typed'] / 1e6:.1f} MB, JSON {stored['json'] / 1e6:.1f} MB (lz4)")
    read_pairs = {"typed, valueFields": "JSON, from_json", "typed, all fields": "JSON, from_json"}
    print_table(f"Spark batch read of {len(FIELDS)} of 10 fields, into noop", reads, read_pairs, json_bytes)


if __name__ == "__main__":
    main()
