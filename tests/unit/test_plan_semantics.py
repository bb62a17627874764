"""Pure logic of plans: partitions, instance shares, event ids, and the plans' semantics under any batching."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest
from tandem.declarations import event_id, instance_ids, instance_partitions, partition_of
from tandem.plans.pizza_shop import outcome
from tandem.plans.temperatures import ALERT_WITHIN_MS, AVERAGE_WINDOW_MS, averages_at, rises_at


def test_the_partition_layout_is_pinned() -> None:
    """Clients outside Tandem place events with this function: changing it silently breaks keyed state."""
    assert [partition_of(k, 4) for k in ("IBM", "WSO2", "o-17", 101, 109)] == [3, 0, 3, 0, 2]
    assert [partition_of(k, 1024) for k in ("IBM", 101)] == [1015, 124]
    assert partition_of(101, 4) == partition_of("101", 4), "a number's key is its decimal text"


@pytest.mark.parametrize(("parallel", "partitions"), [(1, 4), (2, 4), (3, 4), (4, 4), (2, 7)])
def test_a_group_reads_every_partition_exactly_once(parallel: int, partitions: int) -> None:
    shares = [instance_partitions(i, parallel, partitions) for i in range(1, parallel + 1)]
    assert sorted(p for share in shares for p in share) == list(range(partitions))
    assert instance_ids("group-2", parallel)[-1] == f"group-2-{parallel}"


def test_event_ids_depend_on_the_key_values_only() -> None:
    t = datetime(2025, 1, 1, tzinfo=timezone.utc)
    one = event_id("temperatures", "high_temps", {"room_no": 101, "time": t, "temp": 41.0})
    assert one == event_id("temperatures", "high_temps", {"temp": 41, "time": t, "room_no": 101})
    assert one != event_id("temperatures", "avg_temps", {"room_no": 101, "time": t, "temp": 41.0})
    assert one != event_id("temperatures", "high_temps", {"room_no": 102, "time": t, "temp": 41.0})


@pytest.mark.parametrize(("delivered_at", "result"), [(0, "delivered"), (30_000, "delivered"), (15_000, "delivered"),
                                                      (30_001, "overdue"), (-1, "overdue"), (None, "overdue")])
def test_an_order_is_on_time_inside_its_closed_30_second_window(delivered_at, result) -> None:
    assert outcome(1_000_000, [] if delivered_at is None else [1_000_000 + delivered_at]) == result


def _readings(seed: int) -> list[tuple[int, str, float]]:
    rng = random.Random(seed)
    temp, out = 20.0, []
    for i in range(120):
        temp += rng.uniform(5, 8) if rng.random() < 0.2 else rng.uniform(-1, 1)
        out.append((i * 20_000 + rng.randint(0, 5) * 1000, f"d{rng.randint(1, 2)}", round(temp, 1)))
    return out


def _replay(readings, cuts: list[int]) -> tuple[list, list]:
    """The processors' rule: at each watermark step handle the times in (done_until, now], then drop old readings."""
    kept_avg, kept_rise, alerted, done = [], [], set(), None
    averages, alerts = [], []
    arrived = sorted(readings)
    for now in cuts:
        fresh = [r for r in arrived if r[0] <= now and (done is None or r[0] > done)]
        kept_avg += fresh
        kept_rise += fresh
        times = sorted({r[0] for r in fresh})
        averages += averages_at(kept_avg, times)
        for t in times:
            for e1, e2 in rises_at(kept_rise, alerted, t):
                alerted.add(e1)
                alerts.append((e1, e2))
        kept_avg = [r for r in kept_avg if r[0] > now - AVERAGE_WINDOW_MS]
        kept_rise = [r for r in kept_rise if r[0] > now - ALERT_WITHIN_MS]
        done = now
    return sorted(averages), sorted(alerts)


def test_the_same_readings_cut_at_different_watermarks_give_the_same_results() -> None:
    readings = _readings(5)
    end = max(r[0] for r in readings)
    one_step = _replay(readings, [end])
    rng = random.Random(1)
    for _ in range(5):
        cuts = sorted(rng.sample(range(0, end), 12)) + [end]
        assert _replay(readings, cuts) == one_step
    averages, alerts = one_step
    assert len(averages) == len(readings) and alerts
    for (e1, e2) in alerts:  # brute force: e2 is the earliest qualifying reading after e1
        later = sorted(r for r in readings if e1[0] < r[0] <= e1[0] + ALERT_WITHIN_MS and r[2] >= e1[2] + 5)
        assert later[0] == e2


def test_every_generator_writes_events_of_its_plan_and_bad_lines_that_break_a_declared_rule() -> None:
    import json

    from tandem.config import load_cluster, load_plans
    from tandem.producer import bad_line, generator_for

    for plan in load_plans(load_cluster()).values():
        generator = generator_for(plan, seed=3)
        seen: set[str] = set()
        for tick in range(60):
            for stream, events in generator.events(1_750_000_000_000 + tick * 1000, 20).items():
                fields = plan.streams[stream].fields
                for event in events:
                    assert set(event) == set(fields), (plan.name, stream, event)
                    seen.add(stream)
                    line = bad_line(plan.streams[stream], event, generator.random)
                    assert line != json.dumps(event)
        assert seen == set(plan.input_streams), f"{plan.name}: some input stream got no events"


def test_an_aggregation_keeps_the_granularities_it_declares_and_always_seconds() -> None:
    from tandem.aggregation.spec import spec_for
    from tandem.config import load_plan

    stats = spec_for(load_plan("pizza_shop"), "order_stats")
    assert stats.granularities == ("second", "minute", "hour", "day")
    assert stats.child_of("hour") == "minute" and stats.child_of("minute") == "second"
    with pytest.raises(ValueError, match="keeps second, minute, hour, day"):
        stats.check_granularity("month")
    trades = load_plan("trades")
    assert spec_for(trades, "trade_aggregates").granularities == ("second", "minute", "hour", "day", "month", "year")


def test_two_runs_of_the_pizza_producer_never_reuse_an_order_number() -> None:
    # an order number is the id of the order's outcome: a second run reusing it would count nothing
    from tandem.plans.pizza_shop import PizzaGenerator

    first, second = PizzaGenerator(seed=42), PizzaGenerator(seed=42)
    a = [o["order_no"] for o in first.events(1_700_000_000_000, 50)["orders"]]
    b = [o["order_no"] for o in second.events(1_700_000_900_000, 50)["orders"]]
    assert len(set(a)) == 50 and not set(a) & set(b)
