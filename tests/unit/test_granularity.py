"""UTC bucketing for every granularity, including month and year boundaries."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tandem.aggregation.granularity import GRANULARITIES, bucket_end, bucket_start, child_of

UTC = timezone.utc
MOMENT = datetime(2024, 2, 29, 23, 59, 58, 750000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("granularity", "start", "end"),
    [
        ("second", datetime(2024, 2, 29, 23, 59, 58, tzinfo=UTC), datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC)),
        ("minute", datetime(2024, 2, 29, 23, 59, tzinfo=UTC), datetime(2024, 3, 1, 0, 0, tzinfo=UTC)),
        ("hour", datetime(2024, 2, 29, 23, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC)),
        ("day", datetime(2024, 2, 29, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC)),
        ("month", datetime(2024, 2, 1, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC)),
        ("year", datetime(2024, 1, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)),
    ],
)
def test_bucket_bounds(granularity: str, start: datetime, end: datetime) -> None:
    assert bucket_start(MOMENT, granularity) == start
    assert bucket_end(start, granularity) == end
    assert start <= MOMENT < end


def test_december_rolls_into_next_year() -> None:
    assert bucket_end(datetime(2023, 12, 1, tzinfo=UTC), "month") == datetime(2024, 1, 1, tzinfo=UTC)


def test_other_time_zones_are_bucketed_in_utc() -> None:
    tokyo = timezone(timedelta(hours=9))
    local = datetime(2024, 1, 1, 8, 30, tzinfo=tokyo)  # 2023-12-31 23:30 UTC
    assert bucket_start(local, "day") == datetime(2023, 12, 31, tzinfo=UTC)
    assert bucket_start(local, "year") == datetime(2023, 1, 1, tzinfo=UTC)


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        bucket_start(datetime(2024, 1, 1), "hour")


def test_roll_up_chain_runs_from_year_down_to_second() -> None:
    assert [child_of(g) for g in GRANULARITIES] == [None, "second", "minute", "hour", "day", "month"]
    with pytest.raises(ValueError, match="unknown granularity"):
        child_of("week")
