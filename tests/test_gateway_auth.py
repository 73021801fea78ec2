"""plog serve's security with real Kafka clients (librdkafka via confluent-kafka, kafka-python; never ours).

Each test starts a gateway with a credentials file, an ACL file and/or TLS, and checks what a real client sees
and what reaches the root: authentication (PLAIN, SCRAM-SHA-256/512 over SASL_SSL and SASL_PLAINTEXT), a
wrong password and a client that skips SASL (refused, nothing written), ACL denials with Kafka's error codes,
and the listener rule (no unauthenticated listener on a remote address unless explicitly allowed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer  # noqa: E402

from pyspark_logsource.client.admin import LogStore  # noqa: E402
from pyspark_logsource.gateway import Gateway, GatewayConfig, running_gateway  # noqa: E402
from pyspark_logsource.gateway.security.credentials import add_user_to_file  # noqa: E402
from pyspark_logsource.gateway.security.errors import UnauthenticatedRemoteListenerError  # noqa: E402
from pyspark_logsource.gateway.security.tls import server_ssl_context  # noqa: E402
from tests.gateway_fixtures import consume_from_start, one_record_batch, produce_frame, send_frames  # noqa: E402
from tests.gateway_tls import TlsFiles, make_tls_files  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@dataclass
class Setup:
    """A root with topic ``orders`` (2 partitions), a credentials file, TLS files."""

    root: str
    users: str
    tls: TlsFiles
    tmp: Path

    def write_acls(self, rules: list[dict[str, Any]]) -> str:
        path = self.tmp / "acls.json"
        path.write_text(json.dumps(rules))
        return str(path)

    def rows(self, topic: str = "orders") -> int:
        return int(LogStore(self.root).read_topic(topic).read_all().num_rows)

    def values(self, topic: str = "orders") -> set[bytes]:
        table = LogStore(self.root).read_topic(topic).read_all()
        return {r["value"] for r in table.select(["value"]).to_pylist()}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("users") / "users.json")
    for name, password in PASSWORDS.items():
        add_user_to_file(path, name, password)
    return path


@pytest.fixture
def setup(tmp_path: Path, tls: TlsFiles, users: str) -> Setup:
    root = str(tmp_path / "root")
    LogStore(root).create_topic("orders", 2)
    return Setup(root, users, tls, tmp_path)


@pytest.fixture
def sasl_ssl_gateway(setup: Setup) -> Iterator[Gateway]:
    context = server_ssl_context(setup.tls.server_cert, setup.tls.server_key)
    config = GatewayConfig(url=setup.root, port=0, flush_interval_ms=20, users_file=setup.users, ssl_context=context)
    with running_gateway(config) as gw:
        yield gw


def _client(gw: Gateway, setup: Setup, protocol: str, mechanism: str, user: str, password: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{gw.port}",
        "security.protocol": protocol,
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }
    if protocol == "SASL_SSL":
        config["ssl.ca.location"] = str(setup.tls.ca_cert)
    return config


def _produce(config: dict[str, Any], topic: str, values: list[bytes], **extra: Any) -> list[KafkaError]:
    """Produce ``values`` to partition 0 and return the delivery errors (empty on success)."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "message.timeout.ms": 10_000, **extra})
    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=lambda err, _m: err and errors.append(err))
    producer.flush(20)
    return errors


def _consume(config: dict[str, Any], topic: str, expected: int, **extra: Any) -> list[bytes]:
    return [m.value() for m in consume_from_start({**config, **extra}, topic, 1, expected, timeout_s=20)]


# ------------------------------------------------------------------------------------------------ SASL_SSL


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_ssl_round_trip(sasl_ssl_gateway: Gateway, setup: Setup, mechanism: str) -> None:
    config = _client(sasl_ssl_gateway, setup, "SASL_SSL", mechanism, "alice", PASSWORDS["alice"])
    values = [f"{mechanism}-{i}".encode() for i in range(20)]
    assert _produce(config, "orders", values) == []
    assert setup.values() == set(values)
    assert _consume(config, "orders", len(values)) == values


def _authentication_errors(config: dict[str, Any]) -> tuple[list[KafkaError], list[KafkaError]]:
    """Produce one record with ``config``: (client-level errors, delivery errors)."""
    client_errors: list[KafkaError] = []
    delivery = _produce(
        {**config, "error_cb": client_errors.append}, "orders", [b"must-not-land"], **{"message.timeout.ms": 3000}
    )
    return client_errors, delivery


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_ssl_wrong_password_is_refused_and_writes_nothing(
    sasl_ssl_gateway: Gateway, setup: Setup, mechanism: str
) -> None:
    config = _client(sasl_ssl_gateway, setup, "SASL_SSL", mechanism, "alice", "not-alices-password")
    client_errors, delivery = _authentication_errors(config)
    auth = [e for e in client_errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth, client_errors
    # the gateway's sentence, said once (not "authentication failed: Authentication failed: ...")
    assert "invalid user name or password" in auth[0].str()
    assert auth[0].str().lower().count("authentication failed") == 1, auth[0].str()
    assert delivery and all(e.code() != KafkaError.NO_ERROR for e in delivery)
    assert setup.rows() == 0


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_scram_over_sasl_ssl(sasl_ssl_gateway: Gateway, setup: Setup, mechanism: str) -> None:
    common: dict[str, Any] = {
        "bootstrap_servers": f"127.0.0.1:{sasl_ssl_gateway.port}",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "bob",
        "sasl_plain_password": PASSWORDS["bob"],
        "ssl_cafile": str(setup.tls.ca_cert),
    }
    producer = kafka.KafkaProducer(acks="all", **common)
    for i in range(10):
        producer.send("orders", value=f"kp-{i}".encode(), partition=0)
    producer.flush(20)
    producer.close()
    assert setup.values() == {f"kp-{i}".encode() for i in range(10)}
    consumer = kafka.KafkaConsumer(auto_offset_reset="earliest", **common)
    assert _kafka_python_read(consumer, 10) == [f"kp-{i}".encode() for i in range(10)]


def _kafka_python_read(consumer: Any, expected: int) -> list[bytes]:
    """Read partition 0 of orders with a kafka-python consumer until ``expected`` values (or 20 s)."""
    consumer.assign([kafka.TopicPartition("orders", 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
    finally:
        consumer.close()
    return values


def test_kafka_python_wrong_password_fails_authentication(
    sasl_ssl_gateway: Gateway, setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kafka")
    with pytest.raises(kafka.errors.KafkaTimeoutError):  # kafka-python keeps retrying the bootstrap, then gives up
        kafka.KafkaProducer(
            bootstrap_servers=f"127.0.0.1:{sasl_ssl_gateway.port}",
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="bob",
            sasl_plain_password="wrong",
            ssl_cafile=str(setup.tls.ca_cert),
            bootstrap_timeout_ms=3000,
        )
    # Every attempt got Kafka's SASL_AUTHENTICATION_FAILED with the gateway's reason; none saw only a closed
    # socket (the gateway lingers briefly after answering, so the answer is not lost to a reset connection).
    attempts = [r.getMessage() for r in caplog.records if "Bootstrap connection to" in r.getMessage()]
    assert attempts
    for attempt in attempts:
        assert "SaslAuthenticationFailedError" in attempt and "invalid user name or password" in attempt, attempt
    assert setup.rows() == 0


def test_kafka_python_raw_sasl_frames_after_handshake_v0(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway that offers SaslHandshake v0 only (as Kafka 0.10 did): kafka-python then sends its SASL tokens as
    bare size-prefixed frames, not SaslAuthenticate requests; PLAIN and both SCRAMs authenticate that way too."""
    import pyspark_logsource.gateway as gateway_package

    apis = gateway_package.all_apis()
    apis[17] = dataclasses.replace(apis[17], max_version=0)
    monkeypatch.setattr(gateway_package, "all_apis", lambda: apis)
    config = GatewayConfig(url=setup.root, port=0, flush_interval_ms=20, users_file=setup.users)
    with running_gateway(config) as gw:
        for mechanism in MECHANISMS:
            producer = kafka.KafkaProducer(
                bootstrap_servers=f"127.0.0.1:{gw.port}",
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism,
                sasl_plain_username="carol",
                sasl_plain_password=PASSWORDS["carol"],
                acks="all",
                bootstrap_timeout_ms=10_000,
            )
            producer.send("orders", value=f"v0-{mechanism}".encode(), partition=0).get(20)
            producer.close()
        # a wrong password over raw frames: the gateway closes the connection (Kafka's v0 behaviour)
        with pytest.raises(kafka.errors.KafkaTimeoutError):
            kafka.KafkaProducer(
                bootstrap_servers=f"127.0.0.1:{gw.port}",
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256",
                sasl_plain_username="carol",
                sasl_plain_password="wrong",
                bootstrap_timeout_ms=2000,
            )
    assert setup.values() == {f"v0-{m}".encode() for m in MECHANISMS}


# ------------------------------------------------------------------------------------------- SASL_PLAINTEXT


@pytest.fixture
def sasl_plaintext_gateway(setup: Setup) -> Iterator[Gateway]:
    config = GatewayConfig(url=setup.root, host="127.0.0.1", port=0, flush_interval_ms=20, users_file=setup.users)
    with running_gateway(config) as gw:
        yield gw


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_plaintext_round_trip(sasl_plaintext_gateway: Gateway, setup: Setup, mechanism: str) -> None:
    config = _client(sasl_plaintext_gateway, setup, "SASL_PLAINTEXT", mechanism, "carol", PASSWORDS["carol"])
    values = [f"plain-{mechanism}-{i}".encode() for i in range(5)]
    assert _produce(config, "orders", values) == []
    assert _consume(config, "orders", len(values)) == values


def test_client_that_skips_sasl_is_disconnected_and_writes_nothing(
    sasl_plaintext_gateway: Gateway, setup: Setup
) -> None:
    # librdkafka without SASL: its requests after ApiVersions close the connection; nothing is delivered
    client_errors, delivery = _authentication_errors(
        {"bootstrap.servers": f"127.0.0.1:{sasl_plaintext_gateway.port}", "security.protocol": "PLAINTEXT"}
    )
    assert delivery and delivery[0].code() == KafkaError._MSG_TIMED_OUT
    assert any(e.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN) for e in client_errors)
    # a well-formed Produce request sent straight away, without SASL: closed unanswered
    assert send_frames(sasl_plaintext_gateway.port, produce_frame(one_record_batch(b"sneaky"), topic="orders")) == b""
    assert setup.rows() == 0


# ---------------------------------------------------------------------------------------------------- ACLs

ACL_RULES: list[dict[str, Any]] = [
    {"principal": "User:alice", "resource": "topic", "name": "orders", "operations": ["write"], "permission": "allow"},
    {"principal": "User:alice", "resource": "group", "name": "g", "operations": ["read"], "permission": "allow"},
    {"principal": "User:bob", "resource": "topic", "name": "orders", "operations": ["read"], "permission": "allow"},
    {"principal": "User:carol", "resource": "cluster", "operations": ["idempotent_write"], "permission": "allow"},
]


@pytest.fixture
def acl_gateway(setup: Setup) -> Iterator[Gateway]:
    config = GatewayConfig(
        url=setup.root, port=0, flush_interval_ms=20, users_file=setup.users, acls_file=setup.write_acls(ACL_RULES)
    )
    with running_gateway(config) as gw:
        yield gw


def _as(gw: Gateway, setup: Setup, user: str) -> dict[str, Any]:
    return _client(gw, setup, "SASL_PLAINTEXT", "SCRAM-SHA-256", user, PASSWORDS[user])


def test_acl_reader_cannot_produce(acl_gateway: Gateway, setup: Setup) -> None:
    assert _produce(_as(acl_gateway, setup, "alice"), "orders", [b"by-alice"]) == []
    delivery = _produce(_as(acl_gateway, setup, "bob"), "orders", [b"by-bob"])
    assert [e.code() for e in delivery] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert setup.values() == {b"by-alice"}
    # and bob may read what alice wrote (kafka-python without a group: bob may read no group)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{acl_gateway.port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="bob",
        sasl_plain_password=PASSWORDS["bob"],
        auto_offset_reset="earliest",
    )
    assert _kafka_python_read(consumer, 1) == [b"by-alice"]


def test_acl_consumer_in_a_group_it_may_not_read(acl_gateway: Gateway, setup: Setup) -> None:
    consumer = Consumer({**_as(acl_gateway, setup, "alice"), "group.id": "h", "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    errors: list[KafkaError] = []
    deadline = time.monotonic() + 20
    try:
        while not errors and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                errors.append(message.error())
    finally:
        consumer.close()
    assert errors and errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, errors


def test_acl_transactional_producer_without_transactional_id_rights(acl_gateway: Gateway, setup: Setup) -> None:
    producer = Producer({**_as(acl_gateway, setup, "alice"), "transactional.id": "tx-alice"})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(20)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, raised.value
    assert setup.rows() == 0


def test_acl_idempotent_producer_needs_a_write_or_idempotent_write(acl_gateway: Gateway, setup: Setup) -> None:
    # alice may write orders: Kafka's rule gives her an idempotent producer id without a cluster ACL
    assert _produce(_as(acl_gateway, setup, "alice"), "orders", [b"idem"], **{"enable.idempotence": True}) == []
    assert setup.values() == {b"idem"}
    # bob may write nothing and has no idempotent_write: InitProducerId is refused (a fatal producer error)
    errors: list[KafkaError] = []
    producer = Producer({**_as(acl_gateway, setup, "bob"), "enable.idempotence": True, "error_cb": errors.append})
    producer.produce("orders", value=b"bob-idem", partition=0)
    try:
        producer.flush(10)
    except KafkaException as exc:  # the fatal error surfaces here or in error_cb, by timing
        errors.append(exc.args[0])
    fatal = [e for e in errors if e.fatal()]
    assert fatal and fatal[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, errors
    # carol has idempotent_write on the cluster: her producer id is granted, her write to orders is not
    delivery = _produce(_as(acl_gateway, setup, "carol"), "orders", [b"carol-idem"], **{"enable.idempotence": True})
    assert [e.code() for e in delivery] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert setup.values() == {b"idem"}


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ([], False),
        ([("allow", "literal", "orders", "write")], True),
        ([("allow", "literal", "orders", "read")], False),
        ([("allow", "literal", "orders", "all")], True),
        ([("allow", "prefixed", "ord", "write")], True),
        ([("allow", "literal", "orders", "write"), ("deny", "literal", "orders", "write")], False),
        ([("allow", "literal", "orders", "write"), ("deny", "literal", "other", "write")], True),
        ([("allow", "literal", "orders", "write"), ("deny", "literal", "*", "write")], False),
        ([("allow", "literal", "orders", "write"), ("deny", "prefixed", "or", "all")], False),
        ([("allow", "prefixed", "or", "write"), ("deny", "literal", "orders", "write")], True),
        ([("allow", "literal", "*", "write"), ("deny", "literal", "orders", "write")], True),
        ([("allow", "literal", "*", "write"), ("deny", "prefixed", "o", "write")], True),
        ([("allow", "literal", "orders", "write"), ("deny", "literal", "orders", "read")], True),
    ],
)
def test_authorizer_allowed_on_any_topic(rules: list[tuple[str, str, str, str]], expected: bool) -> None:
    from pyspark_logsource.gateway.security.acl import Authorizer

    document = [
        {"principal": "User:alice", "resource": "topic", "name": name, "pattern": pattern,
         "operations": [operation], "permission": permission}
        for permission, pattern, name, operation in rules
    ]  # fmt: skip
    authorizer = Authorizer.from_rules(document)
    assert authorizer.allowed_on_any("User:alice", "topic", "write") is expected
    assert authorizer.allowed_on_any("User:bob", "topic", "write") is False
    assert Authorizer.allow_all().allowed_on_any("User:bob", "topic", "write") is True


# ------------------------------------------------------------------------------------------ listener rule


def test_gateway_refuses_unauthenticated_remote_listener(setup: Setup) -> None:
    refused = GatewayConfig(url=setup.root, host="0.0.0.0", port=0)
    with pytest.raises(UnauthenticatedRemoteListenerError) as raised, running_gateway(refused):
        pass
    message = str(raised.value)
    assert "'0.0.0.0'" in message and "--allow-unauthenticated-remote" in message
    assert "allow_unauthenticated_remote=True" in message
    # with users, or with the explicit opt-in, it serves
    with running_gateway(GatewayConfig(url=setup.root, host="0.0.0.0", port=0, users_file=setup.users)) as gw:
        config = _client(gw, setup, "SASL_PLAINTEXT", "PLAIN", "alice", PASSWORDS["alice"])
        assert _produce(config, "orders", [b"remote-sasl"]) == []
    opt_in = GatewayConfig(
        url=setup.root, host="0.0.0.0", port=0, flush_interval_ms=20, allow_unauthenticated_remote=True
    )
    with running_gateway(opt_in) as gw:
        assert _produce({"bootstrap.servers": f"127.0.0.1:{gw.port}"}, "orders", [b"remote-open"]) == []
    assert setup.values() == {b"remote-sasl", b"remote-open"}


def test_plog_serve_refuses_unauthenticated_remote_listener(setup: Setup) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "pyspark_logsource.cli", "serve", "--url", setup.root, "--listen", "0.0.0.0:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    error = " ".join(result.stderr.split())  # the console may wrap the sentence
    assert "'0.0.0.0'" in error and "--allow-unauthenticated-remote" in error, result.stderr


def test_oversized_frame_before_authentication_is_refused_unread(sasl_plaintext_gateway: Gateway) -> None:
    # 1 MiB announced, nothing sent: the gateway must not wait to buffer it (Kafka's sasl.server.max.receive.size)
    with socket.create_connection(("127.0.0.1", sasl_plaintext_gateway.port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", 1024 * 1024))
        assert sock.recv(100) == b""  # closed at once, not after a timeout
