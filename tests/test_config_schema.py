"""segment_format.config: the one config-schema mechanism, and the schemas declared with it.

Unknown keys name the key and the known ones; bad values name the key and the
value; defaults are filled in; values are normalized; case-insensitive schemas
report the declared spelling; the topic schema is the one PROTOCOL.md documents.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource.spark.option_schema import KNOWN_OPTIONS, SOURCE_OPTIONS
from pyspark_logsource.spark.options import parse_options
from segment_format.config import ConfigKey, ConfigSchema, boolean_from_text, integer_from_text, lowercase_text
from segment_format.errors import InvalidConfigError
from segment_format.topic import TOPIC_CONFIG, TOPIC_CONFIG_DEFAULTS, validate_config

SPEC = Path(__file__).resolve().parents[1] / "PROTOCOL.md"


def check_sum_below_ten(config: dict[str, Any], schema: ConfigSchema) -> None:
    if config["a"] + config["b"] >= 10:
        raise schema.error("b", config["b"], f"makes a + b = {config['a'] + config['b']}, not below 10")


SCHEMA = ConfigSchema(
    "test config",
    [
        ConfigKey("a", int, 1, "an int", minimum=0, maximum=5),
        ConfigKey("b", int, 2, "an int from text", parse=integer_from_text),
        ConfigKey("mode", str, "fast", "a choice", allowed=("fast", "slow")),
        ConfigKey("flag", bool, False, "a boolean from text", parse=boolean_from_text),
        ConfigKey("name", str, None, "a nullable string", nullable=True, validator=lambda v: None if v else "is empty"),
        ConfigKey("level", str, "info", "lower-cased", parse=lowercase_text, allowed=("info", "debug")),
    ],
    checks=[check_sum_below_ten],
)


def refused(config: dict[str, Any], *culprits: str, schema: ConfigSchema = SCHEMA) -> str:
    with pytest.raises(InvalidConfigError) as info:
        schema.validate(config)
    message = str(info.value)
    for culprit in culprits:
        assert culprit in message, f"{culprit!r} not in {message!r}"
    return message


def test_defaults_are_filled_and_values_normalized() -> None:
    assert SCHEMA.validate(None) == {"a": 1, "b": 2, "mode": "fast", "flag": False, "name": None, "level": "info"}
    out = SCHEMA.validate({"b": " 7 ", "flag": "TRUE", "level": " DEBUG", "name": "x", "a": 0})
    assert out == {"a": 0, "b": 7, "mode": "fast", "flag": True, "name": "x", "level": "debug"}
    assert SCHEMA.validate({"b": 3.0})["b"] == 3
    assert SCHEMA.defaults()["mode"] == "fast" and SCHEMA.names()[0] == "a"
    assert "a" in SCHEMA and "zzz" not in SCHEMA and SCHEMA["mode"].allowed == ("fast", "slow")


def test_an_unknown_key_names_itself_and_the_known_ones() -> None:
    message = refused({"colour": "red"}, "unknown test config 'colour'")
    assert re.search(r"known: \['a', 'b', 'flag', 'level', 'mode', 'name'\]", message)


def test_unknown_keys_are_reported_before_bad_values() -> None:
    refused({"a": "bad", "colour": "red"}, "'colour'")


@pytest.mark.parametrize(
    ("config", "culprits"),
    [
        ({"a": "3"}, ["test config a='3' is not an integer"]),
        ({"a": True}, ["a=True is not an integer"]),
        ({"a": 2.0}, ["a=2.0 is not an integer"]),
        ({"a": -1}, ["a=-1 is below its minimum 0"]),
        ({"a": 6}, ["a=6 is above its maximum 5"]),
        ({"b": "seven"}, ["b='seven' is not an integer"]),
        ({"b": 1.5}, ["b=1.5 is not an integer"]),
        ({"b": False}, ["b=False is not an integer"]),
        ({"mode": "medium"}, ["mode='medium' is not one of ['fast', 'slow']"]),
        ({"mode": 3}, ["mode=3 is not a string"]),
        ({"flag": "yes"}, ["flag='yes' must be true or false"]),
        ({"name": ""}, ["name='' is empty"]),
        ({"level": 5}, ["level=5 is not a string"]),
        ({"level": "trace"}, ["level='trace' is not one of"]),
        ({"a": 5, "b": 5}, ["b=5 makes a + b = 10, not below 10"]),
    ],
)
def test_a_bad_value_names_the_key_and_the_value(config: dict[str, Any], culprits: list[str]) -> None:
    refused(config, *culprits)


def test_none_is_accepted_only_where_declared() -> None:
    assert SCHEMA.validate({"name": None})["name"] is None
    refused({"mode": None}, "mode=None is not a string")


def test_case_insensitive_schemas_report_the_declared_spelling() -> None:
    schema = ConfigSchema(
        "option",
        [ConfigKey("maxThings", int, None, "", parse=integer_from_text, minimum=1, nullable=True)],
        case_insensitive=True,
        value_message="{what} '{key}': {value!r} {problem}",
        unknown_message="{what} '{key}': unknown; known: {known}",
    )
    assert schema.validate({"maxthings": "4"}) == {"maxThings": 4}
    assert schema.validate({"MAXTHINGS": "4"}) == {"maxThings": 4}
    refused({"maxthings": "0"}, "option 'maxThings': '0' is below its minimum 1", schema=schema)
    refused({"minthings": "1"}, "option 'minthings': unknown; known: ['maxThings']", schema=schema)


def test_a_key_cannot_be_declared_twice() -> None:
    with pytest.raises(ValueError, match="'a' is declared twice"):
        ConfigSchema("x", [ConfigKey("a"), ConfigKey("a")])
    with pytest.raises(ValueError, match="declared twice"):
        ConfigSchema("x", [ConfigKey("a"), ConfigKey("A")], case_insensitive=True)


# --------------------------------------------------------------------------- the schemas declared with it


def test_topic_config_is_declared_once_and_documented_in_the_spec() -> None:
    assert TOPIC_CONFIG_DEFAULTS == TOPIC_CONFIG.defaults() == validate_config(None)
    section = SPEC.read_text(encoding="utf-8").split("## 4. Topics", 1)[1].split("\n## 5.", 1)[0]
    documented = dict(re.findall(r"^\| `([a-z.]+)` \| (string|integer|boolean|number) \|", section, flags=re.MULTILINE))
    assert set(TOPIC_CONFIG.names()) <= set(documented), set(TOPIC_CONFIG.names()) - set(documented)
    json_types = {str: "string", int: "integer", bool: "boolean", float: "number"}
    assert {key.name: json_types[key.type] for key in TOPIC_CONFIG} == {
        name: documented[name] for name in TOPIC_CONFIG.names()
    }
    assert all(key.doc for key in TOPIC_CONFIG)


def test_topic_config_keeps_its_rules() -> None:
    assert validate_config({"segment.bytes": "2048", "retention.ms": 60000.0})["segment.bytes"] == 2048
    assert validate_config({"compression.type": "none"})["compression.type"] == "none"
    with pytest.raises(InvalidConfigError, match=r"topic config segment\.bytes=-5 is below its minimum 1024"):
        validate_config({"segment.bytes": -5})
    with pytest.raises(InvalidConfigError, match="must be below file.delete.delay.ms"):
        validate_config({"writer.max.staleness.ms": 5000, "file.delete.delay.ms": 1000})
    assert validate_config({"writer.max.staleness.ms": 5000, "file.delete.delay.ms": 0})["file.delete.delay.ms"] == 0
    with pytest.raises(InvalidConfigError, match="lz4_frame"):
        validate_config({"compression.type": "lz4_frame"})
    for policy in ("compact", "compact,delete", "delete,compact"):
        assert validate_config({"cleanup.policy": policy})["cleanup.policy"] == policy
    with pytest.raises(InvalidConfigError, match=r"cleanup\.policy='compacted' is not one of"):
        validate_config({"cleanup.policy": "compacted"})
    assert validate_config({"min.cleanable.dirty.ratio": "0.25"})["min.cleanable.dirty.ratio"] == 0.25
    with pytest.raises(InvalidConfigError, match=r"min\.cleanable\.dirty\.ratio=1\.5 is above its maximum 1\.0"):
        validate_config({"min.cleanable.dirty.ratio": 1.5})
    with pytest.raises(InvalidConfigError, match=r"min\.cleanable\.dirty\.ratio='half' is not a number"):
        validate_config({"min.cleanable.dirty.ratio": "half"})
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms=10 is above max\.compaction\.lag\.ms=5"):
        validate_config({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5})
    assert validate_config(None)["max.compaction.lag.ms"] == 2**63 - 1
    assert validate_config(None)["delete.retention.ms"] == 24 * 3600 * 1000


def test_spark_source_options_are_the_schema() -> None:
    assert {key.name.lower(): key.name for key in SOURCE_OPTIONS} == KNOWN_OPTIONS
    assert all(key.doc for key in SOURCE_OPTIONS)
    defaults = parse_options({"url": "/r", "subscribe": "a"}, streaming=True)
    assert defaults.max_trigger_delay_ms == 900_000
    assert (defaults.fail_on_data_loss, defaults.include_headers) == (True, False)
    assert (defaults.isolation_level, defaults.starting_timestamp_strategy) == ("read_committed", "error")
    with pytest.raises(InvalidConfigError, match=r"plog option 'maxOffsetsPerTrigger': '0' is below its minimum 1"):
        parse_options({"url": "/r", "subscribe": "a", "maxoffsetspertrigger": "0"}, streaming=True)
    with pytest.raises(InvalidConfigError, match=r"plog option 'isolationLevel': 'Dirty' is not one of"):
        parse_options({"url": "/r", "subscribe": "a", "isolationlevel": "Dirty"}, streaming=True)
    with pytest.raises(InvalidConfigError, match=r"plog option 'bogus': unknown option; known options are \["):
        parse_options({"url": "/r", "subscribe": "a", "bogus": "1"}, streaming=True)
