"""Time granularities of aggregations, from second to year, and UTC bucketing."""

from __future__ import annotations

from datetime import datetime, timezone

GRANULARITIES: tuple[str, ...] = ("second", "minute", "hour", "day", "month", "year")


def check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
    return granularity


def child_of(granularity: str) -> str | None:
    """The next finer granularity a bucket is rolled up from (``None`` for ``second``)."""
    index = GRANULARITIES.index(check_granularity(granularity))
    return GRANULARITIES[index - 1] if index else None


def bucket_start(moment: datetime, granularity: str) -> datetime:
    """The start of the UTC bucket of ``granularity`` that contains ``moment``."""
    check_granularity(granularity)
    if moment.tzinfo is None:
        raise ValueError("bucket_start needs a timezone-aware datetime")
    moment = moment.astimezone(timezone.utc)
    fields = {"second": 6, "minute": 5, "hour": 4, "day": 3, "month": 2, "year": 1}[granularity]
    parts = [moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second][:fields]
    parts += [1970, 1, 1, 0, 0, 0][len(parts):]  # month and day start at 1, time at 0
    return datetime(*parts, tzinfo=timezone.utc)


def bucket_end(start: datetime, granularity: str) -> datetime:
    """The start of the bucket after the one starting at ``start``."""
    check_granularity(granularity)
    if granularity == "year":
        return start.replace(year=start.year + 1)
    if granularity == "month":
        return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    seconds = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[granularity]
    return datetime.fromtimestamp(start.timestamp() + seconds, tz=timezone.utc)

