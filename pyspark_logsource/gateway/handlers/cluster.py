"""ApiVersions, Metadata, FindCoordinator, DescribeCluster: what a client learns before it works."""

from __future__ import annotations

import time
import uuid
from typing import Any

from kio.index import load_response_schema

from segment_format.errors import PlogError, UnknownTopicOrPartitionError
from segment_format.topic import TopicMetadata, is_shared

from ..context import Api, RequestContext
from ..entities import has_field, make
from ..errors import GatewayError, MalformedRequestError
from ..server import Gateway, api_version_entries

CLUSTER_ID = "plog"
#: Kafka error codes used here.
NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED = 0, 3, 17, 29
GROUP_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, COORDINATOR_NOT_AVAILABLE = 30, 53, 15
#: How long the topic names listed for a Metadata request are reused (each listing is a LIST request).
NAMES_MAX_AGE_S = 2.0


async def api_versions(ctx: RequestContext, request: Any) -> Any:
    """ApiVersions: the APIs and versions this gateway answers."""
    return make(
        load_response_schema(18, ctx.api_version),
        error_code=NONE,
        api_keys=api_version_entries(ctx.gateway, ctx.api_version),
        throttle_time=0,
    )


def kafka_topic_id(meta: TopicMetadata) -> uuid.UUID:
    """A plog topic id (32 hex digits) as Kafka's topic UUID."""
    try:
        return uuid.UUID(hex=meta.topic_id)
    except ValueError:  # a topic id of another form: a stable UUID derived from it
        return uuid.uuid5(uuid.NAMESPACE_URL, f"plog:{meta.topic_id}")


class TopicNames:
    """The root's topic names, listed at most every ``NAMES_MAX_AGE_S``."""

    def __init__(self) -> None:
        self._at = 0.0
        self._names: list[str] = []

    def get(self, gateway: Gateway) -> list[str]:
        now = time.monotonic()
        if now - self._at > NAMES_MAX_AGE_S:
            self._names = gateway.root.catalog.names()
            self._at = now
        return self._names

    def forget(self) -> None:
        self._at = 0.0


def topic_names(gateway: Gateway) -> TopicNames:
    """The gateway's cache of topic names."""
    names: TopicNames = gateway.service("topic_names", TopicNames)
    return names


def _broker(info: Any) -> dict[str, Any]:
    return {"node_id": info.node_id, "host": info.host, "port": info.port, "rack": None}


def _topic_entry(gateway: Gateway, name: str) -> dict[str, Any]:
    try:
        meta = gateway.root.topic(name)
    except UnknownTopicOrPartitionError:
        return {"error_code": UNKNOWN_TOPIC_OR_PARTITION, "name": name, "topic_id": uuid.UUID(int=0), "partitions": []}
    except PlogError:
        return {"error_code": INVALID_TOPIC_EXCEPTION, "name": name, "topic_id": uuid.UUID(int=0), "partitions": []}
    directory = gateway.directory
    partitions = []
    shared = is_shared(meta.config)
    for p in range(meta.partitions):
        leader = directory.leader_for(name, p, shared).node_id
        partitions.append(
            {
                "error_code": NONE,
                "partition_index": p,
                "leader_id": leader,
                "leader_epoch": 0,
                "replica_nodes": [leader],
                "isr_nodes": [leader],
                "offline_replicas": [],
            }
        )
    return {
        "error_code": NONE,
        "name": name,
        "topic_id": kafka_topic_id(meta),
        "is_internal": False,
        "partitions": partitions,
        "topic_authorized_operations": -2147483648,
    }


async def metadata(ctx: RequestContext, request: Any) -> Any:
    """Metadata: the live gateways as brokers, and each topic's partitions led by one of them (a hint)."""
    gateway = ctx.gateway

    def collect() -> list[dict[str, Any]]:
        if request.topics is None or (ctx.api_version == 0 and not request.topics):
            names = topic_names(gateway).get(gateway)
            return [_topic_entry(gateway, n) for n in names if ctx.allowed("topic", n, "describe")]
        entries = []
        for topic in request.topics:
            name = topic.name
            if name is None and ctx.api_version < 12:
                # v10 and v11 carry topic ids but their response cannot say a topic has no name (Kafka refuses
                # the request the same way); answering would fail to encode
                raise MalformedRequestError(f"Metadata v{ctx.api_version} asks for a topic without a name")
            if name is None:
                entries.append(
                    {
                        "error_code": UNKNOWN_TOPIC_OR_PARTITION,
                        "name": None,
                        "topic_id": topic.topic_id,
                        "partitions": [],
                    }
                )
            elif not ctx.allowed("topic", name, "describe"):
                entries.append(
                    {
                        "error_code": TOPIC_AUTHORIZATION_FAILED,
                        "name": name,
                        "topic_id": uuid.UUID(int=0),
                        "partitions": [],
                    }
                )
            else:
                entries.append(_topic_entry(gateway, name))
        return entries

    topics = await ctx.blocking(collect)
    brokers = [_broker(info) for info in gateway.directory.live]
    return make(
        load_response_schema(3, ctx.api_version),
        throttle_time=0,
        brokers=brokers,
        cluster_id=CLUSTER_ID,
        controller_id=gateway.directory.node_id,
        topics=topics,
        cluster_authorized_operations=-2147483648,
    )


_KEY_TYPES = {0: ("group", "group"), 1: ("transactional_id", "transaction")}


async def find_coordinator(ctx: RequestContext, request: Any) -> Any:
    """FindCoordinator: the live gateway that coordinates a group or transactional id (rendezvous hashing)."""
    key_type = int(request.key_type) if has_field(request, "key_type") else 0
    keys = list(request.coordinator_keys) if has_field(request, "coordinator_keys") else [request.key]
    answers = []
    for key in keys:
        if key_type not in _KEY_TYPES:
            raise GatewayError(f"FindCoordinator key type {key_type} is not a group (0) or a transaction (1)")
        resource, kind = _KEY_TYPES[key_type]
        if not ctx.allowed(resource, key, "describe"):
            code = GROUP_AUTHORIZATION_FAILED if resource == "group" else TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            answers.append(
                {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": code, "error_message": None}
            )
            continue
        info = ctx.gateway.directory.coordinator_for(kind, key)
        answers.append(
            {
                "key": key,
                "node_id": info.node_id,
                "host": info.host,
                "port": info.port,
                "error_code": NONE,
                "error_message": None,
            }
        )
    response_type = load_response_schema(10, ctx.api_version)
    if has_field(response_type, "coordinators"):
        return make(response_type, throttle_time=0, coordinators=answers)
    first = answers[0]
    return make(
        response_type,
        throttle_time=0,
        error_code=first["error_code"],
        error_message=first["error_message"],
        node_id=first["node_id"],
        host=first["host"],
        port=first["port"],
    )


async def describe_cluster(ctx: RequestContext, request: Any) -> Any:
    """DescribeCluster: the live gateways (admin clients ask it)."""
    directory = ctx.gateway.directory
    return make(
        load_response_schema(60, ctx.api_version),
        throttle_time=0,
        error_code=NONE,
        error_message=None,
        endpoint_type=1,
        cluster_id=CLUSTER_ID,
        controller_id=directory.node_id,
        brokers=[
            {"broker_id": i.node_id, "host": i.host, "port": i.port, "rack": None, "is_fenced": False}
            for i in directory.live
        ],
        cluster_authorized_operations=-2147483648,
    )


APIS = [
    Api(18, "ApiVersions", 0, 4, api_versions, needs_auth=False),
    Api(3, "Metadata", 0, 12, metadata),
    Api(10, "FindCoordinator", 0, 4, find_coordinator),
    Api(60, "DescribeCluster", 0, 1, describe_cluster),
]
