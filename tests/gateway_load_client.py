"""One client process of the gateway load test: many idempotent producers, or many group consumers, at once.

Run by ``tests/test_gateway_load.py`` as a real process::

    python -m tests.gateway_load_client produce BOOTSTRAP TOPIC PROCESS PRODUCERS RECORDS SECONDS
    python -m tests.gateway_load_client consume BOOTSTRAP TOPIC GROUP CONSUMERS SECONDS

``produce`` runs PRODUCERS confluent-kafka producers (a connection each to every gateway), each sending
RECORDS records under its own key ``<process>-<producer>`` with values ``<process>-<producer>-<n>``, paced
over SECONDS; it prints ``started`` once every producer has its connections, then one JSON line: the values
acknowledged, per producer, in acknowledgement order, and those the client gave up on (its delivery
timeout). ``consume`` runs CONSUMERS members of one group until a line arrives on its stdin (at most SECONDS) and prints
how many records they read.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

import confluent_kafka

#: librdkafka's own log: only its emergencies (a fatal error's reason), to stderr.
_LOG = logging.getLogger("librdkafka")
_LOG.addHandler(logging.StreamHandler(sys.stderr))
_LOG.setLevel(logging.DEBUG)  # what reaches it is chosen by each client's log_level
QUIET = {"log_level": 0, "logger": _LOG}
#: ``PLOG_LOAD_DEBUG=1``: the first producer of each process logs librdkafka's idempotence, message and broker
#: events to stderr (to see what a producer does across a gateway's death).
DEBUG = {"debug": "eos,msg,broker", "log_level": 7, "logger": _LOG}


def produce(bootstrap: str, topic: str, process: str, producers: int, records: int, seconds: float) -> dict[str, Any]:
    """Each producer's acknowledged values in acknowledgement order (``acked``), and the values whose delivery
    failed (``timed_out``: the client gave up after ``message.timeout.ms``, Kafka's delivery timeout; such a
    record may or may not be in the log, as with a broker). Exits 1 on anything else: a fatal error, another
    delivery error, or records still undelivered 150 s after the stream."""
    acked: dict[str, list[str]] = {}
    timed_out: dict[str, list[str]] = {}
    fatal: list[str] = []
    clients = []

    def on_error(err: Any) -> None:  # librdkafka's own account of a fatal error, which produce() only calls "Fatal"
        if err.fatal():
            fatal.append(f"fatal: {err}")

    for k in range(producers):
        key = f"{process}-{k}"
        acked[key] = []
        clients.append(
            (
                key,
                confluent_kafka.Producer(
                    {
                        "bootstrap.servers": bootstrap,
                        "enable.idempotence": True,
                        "message.timeout.ms": 120_000,
                        "topic.metadata.refresh.interval.ms": 1000,
                        "error_cb": on_error,
                        **(DEBUG if k == 0 and os.environ.get("PLOG_LOAD_DEBUG") else QUIET),
                    }
                ),
            )
        )

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked[msg.key().decode()].append(msg.value().decode())
        elif err.code() == confluent_kafka.KafkaError._MSG_TIMED_OUT:
            timed_out.setdefault(msg.key().decode(), []).append(msg.value().decode())
        else:
            fatal.append(str(err))

    for _, client in clients:
        client.list_topics(topic, timeout=60)
    print("started", flush=True)
    start = time.monotonic()
    for n in range(records):
        for key, client in clients:
            try:
                client.produce(topic, key=key.encode(), value=f"{key}-{n}".encode(), on_delivery=report)
            except confluent_kafka.KafkaException as exc:
                client.poll(0)  # the error callback says why
                print(json.dumps({"failed": [str(exc), *fatal[:5]]}), flush=True)
                sys.exit(1)
            client.poll(0)
        # A stream, not one burst: records are in flight whenever a gateway dies.
        time.sleep(max(0.0, start + (n + 1) * seconds / records - time.monotonic()))
    for _, client in clients:
        if client.flush(150):
            fatal.append("not delivered in 150 s")
    if fatal:
        print(json.dumps({"failed": fatal[:5]}), flush=True)
        sys.exit(1)
    return {"acked": acked, "timed_out": timed_out}


def consume(bootstrap: str, topic: str, group: str, consumers: int, seconds: float) -> int:
    """Records read by ``consumers`` members of ``group`` until a line arrives on stdin (the test saw the group
    commit everything), or ``seconds`` at most."""
    counts = [0] * consumers
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()

    def member(i: int) -> None:
        # A short session: when the coordinating gateway dies, the survivor's rebalance waits for the members'
        # sessions to lapse (45 s at librdkafka's default), longer than the short form runs.
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                **QUIET,
            }
        )
        consumer.subscribe([topic])
        until = time.monotonic() + seconds
        try:
            while time.monotonic() < until and not stop.is_set():
                counts[i] += sum(1 for m in consumer.consume(500, timeout=0.2) if m.error() is None)
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def main(argv: list[str]) -> int:
    mode, bootstrap, topic = argv[0], argv[1], argv[2]
    if mode == "produce":
        print(json.dumps(produce(bootstrap, topic, argv[3], int(argv[4]), int(argv[5]), float(argv[6]))), flush=True)
    else:
        print(json.dumps({"read": consume(bootstrap, topic, argv[3], int(argv[4]), float(argv[5]))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
