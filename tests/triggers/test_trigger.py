"""Trigger semantics without a database: templates, schedules, timestamps and the event encoding."""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo

import pytest
from pydantic import ValidationError

from bitlake.triggers import Event, EventIn, PartitionTrigger, decode_events, encode_events
from bitlake.triggers.errors import OutOfRangeError
from bitlake.triggers.event import MAX_PARTITION_DEPTH, MAX_PARTITION_JSON_BYTES, format_timestamp, parse_timestamp
from bitlake.triggers.trigger import FrequencyUnit, render, schedule
from tests.triggers.samples import event

UTC = dt.UTC
LA = zoneinfo.ZoneInfo("America/Los_Angeles")


def at(*args, tz=UTC) -> dt.datetime:
    return dt.datetime(*args, tzinfo=tz)


@pytest.mark.parametrize(("template", "expected"), [
    ("{{ ds }}", "2024-03-01"),
    ("{{ds_nodash}}", "20240301"),
    ("{{ year }}/{{ month }}/{{ day }}", "2024/03/01"),
    ("{{ hour }}:{{ minute }}", "05:07"),
    ("{{ ts }}", "2024-03-01T05:07:09+00:00"),
    ("{{ ts_nodash }}", "20240301T050709"),
    ("dt={{ ds }}-{{ hour }}", "dt=2024-03-01-05"),
    ("{{ ds - 1d }}", "2024-02-29"),
    ("{{ ds + 1d }}", "2024-03-02"),
    ("{{ hour - 6h }}", "23"),
    ("{{ ds - 6h }}", "2024-02-29"),
    ("{{ minute + 60m }}", "07"),
    ("no template", "no template"),
])
def test_templates_render_the_scheduled_time(template, expected):
    assert render(template, at(2024, 3, 1, 5, 7, 9)) == expected


def test_templates_render_in_the_time_zone_with_calendar_days():
    # 2024-03-10 is the spring-forward day in Los Angeles: the day before 2024-03-11 00:30 is 03-10 00:30.
    when = at(2024, 3, 11, 0, 30, tz=LA)
    assert render("{{ ds - 1d }} {{ hour - 1d }}", when, LA) == "2024-03-10 00"
    assert render("{{ ds }} {{ hour }}", at(2024, 3, 11, 7, 30), LA) == "2024-03-11 00"


@pytest.mark.parametrize("template", ["{{ dss }}", "{{ ds - 1y }}", "{{ ds -- 1d }}", "{{ }}", "{{ ds", "ds }}",
                                      "{{ ds }} }}", "{{ macros.ds_add(ds, 1) }}"])
def test_bad_templates_are_refused_with_the_reason(template):
    with pytest.raises(ValidationError, match="template"):
        PartitionTrigger(table="t", partition=[template])


def test_schedule_finds_the_latest_tick_at_or_before_the_evaluation_time():
    start = at(2024, 1, 1)
    assert schedule(at(2024, 1, 1), start, 15, FrequencyUnit.MINUTES) == (at(2024, 1, 1), at(2024, 1, 1, 0, 15))
    assert schedule(at(2024, 1, 1, 0, 29, 59), start, 15, FrequencyUnit.MINUTES)[0] == at(2024, 1, 1, 0, 15)
    assert schedule(at(2024, 1, 1, 13), start, 6, FrequencyUnit.HOURS) == (at(2024, 1, 1, 12), at(2024, 1, 1, 18))
    assert schedule(at(2024, 2, 10, 3), start, 7, FrequencyUnit.DAYS) == (at(2024, 2, 5), at(2024, 2, 12))
    assert schedule(at(2023, 12, 31), start, 1, FrequencyUnit.DAYS) == (None, start)


def test_daily_schedules_keep_their_wall_clock_time_across_dst():
    start = at(2024, 3, 9, 0, 0, tz=LA).astimezone(UTC)  # midnight in Los Angeles, 08:00 UTC
    tick, following = schedule(at(2024, 3, 10, 12, tz=UTC), start, 1, FrequencyUnit.DAYS, LA)
    assert tick == at(2024, 3, 10, 0, 0, tz=LA) and following == at(2024, 3, 11, 0, 0, tz=LA)
    assert (following - tick) == dt.timedelta(hours=23)
    # 07:30 UTC on the 11th is 00:30 in LA (PDT): the tick is that midnight, not the 10th's.
    assert schedule(at(2024, 3, 11, 7, 30), start, 1, FrequencyUnit.DAYS, LA)[0] == at(2024, 3, 11, tz=LA)


def test_partition_trigger_schedule_options():
    base = {"table": "t", "partition": ["{{ ds }}"]}
    trigger = PartitionTrigger(**base, start="2024-01-01T00:00:00Z", frequency=1, frequency_unit="DAYS",
                               at="2024-01-05T12:00:00Z")
    assert trigger.evaluate_at(at(2030, 1, 1)) == (at(2024, 1, 5, 12), at(2024, 1, 5), at(2024, 1, 6))
    logical = PartitionTrigger(**base, scheduled_time="2024-01-03T00:00:00Z")
    assert logical.evaluate_at(at(2030, 1, 1)) == (at(2030, 1, 1), at(2024, 1, 3), None)
    assert PartitionTrigger(**base).evaluate_at(at(2030, 1, 1)) == (at(2030, 1, 1), at(2030, 1, 1), None)
    for bad in ({"start": "2024-01-01"}, {"frequency": 1, "frequency_unit": "DAYS"},
                {"start": "2024-01-01", "frequency": 1, "frequency_unit": "DAYS", "scheduled_time": "2024-01-01"},
                {"start": "2024-01-01", "frequency": 0, "frequency_unit": "DAYS"},
                {"start": "2024-01-01", "frequency": 1, "frequency_unit": "MONTHS"},
                {"timezone": "Mars/Olympus"}):
        with pytest.raises(ValidationError):
            PartitionTrigger(**base, **bad)


def test_timestamps_parse_iso_and_epoch_milliseconds_and_format_fixed_width():
    assert parse_timestamp("2024-01-01T00:00:00Z") == at(2024, 1, 1)
    assert parse_timestamp("2024-01-01T02:00:00+02:00") == at(2024, 1, 1)
    assert parse_timestamp("2024-01-01 00:00:00") == at(2024, 1, 1)  # no zone: UTC
    assert parse_timestamp(1_704_067_200_000) == at(2024, 1, 1) == parse_timestamp("1704067200000")
    assert format_timestamp(at(2024, 1, 1)) == "2024-01-01T00:00:00.000000Z"
    assert format_timestamp(at(2024, 1, 1, 1, tz=dt.timezone(dt.timedelta(hours=1)))) == "2024-01-01T00:00:00.000000Z"
    for bad in ("yesterday", True, 1.5, None, 10**20):
        with pytest.raises(ValueError):
            parse_timestamp(bad)
    # in range as written, out of range in UTC: a ValueError (a 422), not an OverflowError (a 500)
    for bad in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-01:00"):
        with pytest.raises(ValueError, match="out of range in UTC"):
            parse_timestamp(bad)
    assert parse_timestamp("0001-01-01T00:00:00-01:00") == at(1, 1, 1, 1)


def test_templates_and_schedules_that_leave_the_range_of_dates_say_so():
    with pytest.raises(OutOfRangeError, match=r"'\{\{ ds - 999999d \}\}' rendered at 2024-03-01"):
        render("{{ ds - 999999d }}", at(2024, 3, 1))
    with pytest.raises(OutOfRangeError, match="leaves the range of dates"):
        render("{{ ds + 1d }}", at(9999, 12, 31))
    with pytest.raises(OutOfRangeError, match="every 1 days has no tick after 9999-12-31T12:00:00"):
        schedule(at(9999, 12, 31, 12), at(2024, 1, 1), 1, FrequencyUnit.DAYS)
    with pytest.raises(OutOfRangeError, match="every 1000000 days"):
        schedule(at(9000, 1, 1), at(2024, 1, 1), 1_000_000, FrequencyUnit.DAYS)
    assert OutOfRangeError.status_code == 422


def test_event_validation_limits():
    EventIn.model_validate(event(partition=["x"] * 8, tags={f"k{i}": "v" for i in range(32)}))
    # What a bitlake table can write: many partition columns, long values; only the JSON's size is limited.
    EventIn.model_validate(event(partition=["v" * 250] * 5))
    EventIn.model_validate(event(partition=[f"c{i}" for i in range(20)]))
    EventIn.model_validate(event(partition=["x" * (MAX_PARTITION_JSON_BYTES - 4)]))  # ["x..."]: exactly the limit
    for bad in ({"partition": []}, {"partition": [1]}, {"partition": ["x" * (MAX_PARTITION_JSON_BYTES - 3)]},
                {"partition": ["é" * 200] * 5},  # 2,016 bytes of JSON
                {"partition": [""] * (MAX_PARTITION_DEPTH + 1)},
                {"tags": {f"k{i}": "v" for i in range(33)}}, {"tags": {"bad key": "v"}}, {"tags": {"k": 1}},
                {"table": ""}, {"table": "t" * 513}, {"table": "a\x00b"}, {"table": "a\nb"},
                {"snapshot_id": ""}, {"snapshot_id": 5}, {"table_format": "PARQUET"}, {"operation_type": "MERGE"},
                {"snapshot_ts": "not a time"}, {"event_id": 3}, {"partition": ["\ud800"]}, {"tags": None}):
        with pytest.raises(ValidationError):
            EventIn.model_validate(event(**bad))


def test_the_event_encoding_round_trips_and_is_plain_json():
    e = Event(event_id=7, event_ts="2024-01-01T00:00:01.5Z", table="db.t", partition=["2024-01-01", None],
              snapshot_id="3", snapshot_ts=1_704_067_200_000, prev_snapshot_id="2", table_format="DELTA",
              operation_type="UPDATE", tags={"a": "b"})
    text = encode_events([e])
    assert json.loads(text) == [{
        "event_id": 7, "event_ts": "2024-01-01T00:00:01.500000Z", "table": "db.t", "partition": ["2024-01-01", None],
        "snapshot_id": "3", "snapshot_ts": "2024-01-01T00:00:00.000000Z", "prev_snapshot_id": "2",
        "table_format": "DELTA", "operation_type": "UPDATE", "tags": {"a": "b"}}]
    assert decode_events(text) == [e]


def test_the_docstring_examples_run():
    import doctest

    import bitlake.triggers.event
    import bitlake.triggers.store
    import bitlake.triggers.trigger

    for module in (bitlake.triggers.event, bitlake.triggers.trigger, bitlake.triggers.store):
        assert doctest.testmod(module).failed == 0, module.__name__
