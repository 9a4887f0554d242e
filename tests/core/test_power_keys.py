"""Power readings are keyed by their server's generation, every other signal as before (``opsloop.topics``).

The power detector compares each server with the median of its generation; keyed by host, a generation's
servers spread over the partitions, and with N stream workers each compared only its share
(tests/streams/detectors/test_power_two_workers.py). Only ``telemetry.ipmi`` reads the ``generation`` tag first.
"""

from __future__ import annotations

from opsloop.collect.publisher import records_for
from opsloop.records import metric
from opsloop.topics import _PREFIX_TOPIC, KEY_TAGS, TOPIC_TAG, Topic, series_key

TS = 1_795_500_000.0
TAGS = {"host": "stor-g3-17", "generation": "gen3", "raw_capacity_tb": "144"}


def test_a_power_reading_is_keyed_by_its_generation_and_without_one_by_its_host() -> None:
    for name in ("ipmi_power", "ipmi_power_sensor", "ipmi_bmc", "ipmi_sensor", "power_draw"):
        assert series_key(name, TAGS) == "gen3"
        assert metric(name, {"watts": 1.0}, TAGS, TS).key == "gen3"
        assert series_key(name, {"host": "stor-g3-17"}) == "stor-g3-17"
        assert series_key(name, {**TAGS, "generation": ""}) == "stor-g3-17"   # empty: as if not set
    # routed to the topic by its tag (Telegraf's shape), and with the topic given by the caller
    assert series_key("custom", {**TAGS, TOPIC_TAG: Topic.IPMI.value}) == "gen3"
    assert series_key("anything", TAGS, Topic.IPMI) == "gen3"


def test_every_other_topics_keys_stay_as_they_were() -> None:
    for prefix, topic in _PREFIX_TOPIC:
        if topic is Topic.IPMI:
            continue
        for tag in KEY_TAGS:
            tags = {tag: "src", "generation": "gen3"}
            assert series_key(prefix + "x", tags) == "src", (prefix, tag)
            assert series_key("custom", {**tags, TOPIC_TAG: topic.value}) == "src"
    # a sample of no topic (refused by the publisher for it) still has a key, never an error
    assert series_key("nothing_routes_me", TAGS) == "stor-g3-17"
    assert series_key("nothing_routes_me", {"x": "y"}) == "nothing_routes_me"


def test_a_collector_round_of_a_generation_is_one_record_of_its_key() -> None:
    hosts = [f"stor-g3-{i}" for i in range(20)]
    round_ = [metric("ipmi_power", {"watts": 150.0 + i}, {**TAGS, "host": h}, TS) for i, h in enumerate(hosts)]
    round_ += [metric("ipmi_power", {"watts": 200.0}, {"host": "untagged"}, TS)]
    records = records_for(round_)
    assert [(r.topic, r.key) for r in records] == [(Topic.IPMI.value, "gen3"), (Topic.IPMI.value, "untagged")]
