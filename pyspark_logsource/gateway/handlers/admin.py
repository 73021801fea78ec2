"""CreateTopics, DeleteTopics, DescribeConfigs: the admin calls Kafka tools make."""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema

from segment_format.errors import InvalidConfigError, InvalidTopicError, PlogError, TopicAlreadyExistsError
from segment_format.errors import UnknownTopicOrPartitionError

from ..context import Api, RequestContext
from ..entities import has_field, make
from .cluster import kafka_topic_id, topic_names

NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS = 0, 3, 17, 37
TOPIC_ALREADY_EXISTS, INVALID_CONFIG, TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 36, 40, 29, 31
INVALID_REQUEST, UNKNOWN_SERVER_ERROR = 42, -1
RESOURCE_TOPIC = 2


def _create(ctx: RequestContext, topic: Any, validate_only: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"name": topic.name, "error_message": None, "num_partitions": -1, "replication_factor": -1}
    if not (ctx.allowed("topic", topic.name, "create") or ctx.allowed("cluster", "kafka-cluster", "create")):
        return {**answer, "error_code": TOPIC_AUTHORIZATION_FAILED}
    partitions = int(topic.num_partitions)
    if partitions == -1:
        partitions = 1  # the broker's default
    config = {c.name: c.value for c in topic.configs if c.value is not None}
    try:
        if validate_only:
            from segment_format.layout import validate_topic_name
            from segment_format.topic import validate_config

            validate_topic_name(topic.name)
            validate_config(config)
            if partitions < 1:
                raise InvalidConfigError(f"num_partitions must be positive, got {partitions}")
            return {**answer, "error_code": NONE, "num_partitions": partitions, "replication_factor": 1}
        meta = ctx.gateway.root.catalog.create(topic.name, partitions, config)
        topic_names(ctx.gateway).forget()
        return {
            **answer,
            "error_code": NONE,
            "topic_id": kafka_topic_id(meta),
            "num_partitions": meta.partitions,
            "replication_factor": 1,
            "configs": [],
        }
    except TopicAlreadyExistsError as exc:
        return {**answer, "error_code": TOPIC_ALREADY_EXISTS, "error_message": str(exc)}
    except InvalidTopicError as exc:
        return {**answer, "error_code": INVALID_TOPIC_EXCEPTION, "error_message": str(exc)}
    except InvalidConfigError as exc:
        code = INVALID_PARTITIONS if "partition" in str(exc) else INVALID_CONFIG
        return {**answer, "error_code": code, "error_message": str(exc)}
    except PlogError as exc:
        return {**answer, "error_code": UNKNOWN_SERVER_ERROR, "error_message": str(exc)}


async def create_topics(ctx: RequestContext, request: Any) -> Any:
    """CreateTopics: plog topics (replication factor and assignments mean nothing here and are ignored)."""
    validate_only = bool(request.validate_only) if has_field(request, "validate_only") else False

    def run() -> list[dict[str, Any]]:
        return [_create(ctx, topic, validate_only) for topic in request.topics]

    return make(load_response_schema(19, ctx.api_version), throttle_time=0, topics=await ctx.blocking(run))


async def delete_topics(ctx: RequestContext, request: Any) -> Any:
    """DeleteTopics (by name)."""

    def run() -> list[dict[str, Any]]:
        out = []
        for name in request.topic_names:
            if not ctx.allowed("topic", name, "delete"):
                out.append({"name": name, "error_code": TOPIC_AUTHORIZATION_FAILED})
                continue
            try:
                ctx.gateway.root.catalog.delete(name)
                ctx.gateway.root.forget_topic(name)
                out.append({"name": name, "error_code": NONE})
            except UnknownTopicOrPartitionError as exc:
                out.append({"name": name, "error_code": UNKNOWN_TOPIC_OR_PARTITION, "error_message": str(exc)})
            except PlogError as exc:
                out.append({"name": name, "error_code": UNKNOWN_SERVER_ERROR, "error_message": str(exc)})
        topic_names(ctx.gateway).forget()
        return out

    return make(load_response_schema(20, ctx.api_version), throttle_time=0, responses=await ctx.blocking(run))


async def describe_configs(ctx: RequestContext, request: Any) -> Any:
    """DescribeConfigs: a topic's Kafka-named config (brokers have none to show)."""

    def run() -> list[dict[str, Any]]:
        results = []
        for resource in request.resources:
            base = {"resource_type": resource.resource_type, "resource_name": resource.resource_name, "error_message": None}
            if int(resource.resource_type) != RESOURCE_TOPIC:
                results.append({**base, "error_code": NONE, "configs": []})
                continue
            if not ctx.allowed("topic", resource.resource_name, "describe_configs"):
                results.append({**base, "error_code": TOPIC_AUTHORIZATION_FAILED, "configs": []})
                continue
            try:
                meta = ctx.gateway.root.topic(resource.resource_name)
            except UnknownTopicOrPartitionError as exc:
                results.append({**base, "error_code": UNKNOWN_TOPIC_OR_PARTITION, "error_message": str(exc), "configs": []})
                continue
            keys = resource.configuration_keys
            configs = [
                {
                    "name": name,
                    "value": None if value is None else str(value).lower() if isinstance(value, bool) else str(value),
                    "read_only": False,
                    "config_source": 1,
                    "is_default": False,
                    "is_sensitive": False,
                    "synonyms": [],
                    "documentation": None,
                }
                for name, value in sorted(meta.config.items())
                if keys is None or name in keys
            ]
            results.append({**base, "error_code": NONE, "configs": configs})
        return results

    return make(load_response_schema(32, ctx.api_version), throttle_time=0, results=await ctx.blocking(run))


APIS = [
    Api(19, "CreateTopics", 2, 7, create_topics),
    Api(20, "DeleteTopics", 1, 5, delete_topics),
    Api(32, "DescribeConfigs", 1, 4, describe_configs),
]
