"""``tandem produce`` gives a field that identifies an output's rows a value of its own in every event, and keys a
small pool (pure: the declared generator, on a plan written for the test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan
from tandem.declarations import FieldConfig
from tandem.producer import DeclaredGenerator, long_range, unique_fields, unique_value

LOGINS = """
name: logins
streams:
  logins:
    partitions: 2
    key: member
    event_time: time
    fields:
      member: {type: string}
      idp: {type: string}
      login_id: {type: string}
      session: {type: long}
      attempt: {type: long, at_least: 1, at_most: 50}
      ok: {type: long, at_least: 0, at_most: 1}
      time: {type: epoch_millis}
groups:
  g:
    queries: [logins]
outputs:
  successes:              # per identity provider, each login counted once: login_id identifies a row
    kind: table
    key: [idp]
    values: [ok]
    id: [login_id]
  sessions:               # an event per session
    kind: events
    key: [session]
    time: time
  retries:                # an event per (member, attempt): the member stays a key, the attempt is the id's own part
    kind: events
    key: [member, attempt]
    time: time
  seen:                   # an id with a time in it varies from event to event already
    kind: events
    key: [idp, time]
    time: time
nodes: [node-a, node-b]
"""
NOW_MS = 1_764_650_000_000


@pytest.fixture
def plan(conf: Path):
    (conf / "plans" / "logins.yaml").write_text(LOGINS)
    return load_plan("logins", load_cluster(conf / "cluster.yaml"))


def test_the_fields_made_unique_are_those_an_output_identifies_rows_by_and_no_key(plan) -> None:
    assert unique_fields(plan) == {"login_id", "session", "attempt"}


def test_n_produced_events_make_n_rows_and_keys_repeat(plan) -> None:
    events = DeclaredGenerator(plan, seed=7).events(NOW_MS, 200)["logins"]
    assert len({e["login_id"] for e in events}) == 200 and len({e["session"] for e in events}) == 200
    assert all(1 <= e["attempt"] <= 50 for e in events)
    assert len({e["attempt"] for e in events[:50]}) == 50  # as many as the bounds hold, then they come round
    assert len({e["member"] for e in events}) <= 16 and len({e["idp"] for e in events}) <= 8  # keys group
    assert all(0 <= e["ok"] <= 1 for e in events)


def test_a_later_run_makes_other_ids_and_the_same_run_the_same(plan) -> None:
    first = DeclaredGenerator(plan, seed=7).events(NOW_MS, 200)["logins"]
    later = DeclaredGenerator(plan, seed=7).events(NOW_MS + 1000, 200)["logins"]
    assert not {e["login_id"] for e in first} & {e["login_id"] for e in later}
    assert not {e["session"] for e in first} & {e["session"] for e in later}
    assert DeclaredGenerator(plan, seed=7).events(NOW_MS, 200)["logins"] == first


def test_the_shipped_plans_produce_as_before(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    for name in ("trades", "pizza_shop", "temperatures"):  # ids there are stream keys, or hold a time
        assert unique_fields(load_plan(name, cluster)) == frozenset(), name


def test_a_unique_value_passes_its_field_checks() -> None:
    short = FieldConfig(type="string", max_length=6)
    values = [unique_value(short, "login_id", NOW_MS * 1000 + n) for n in range(300)]
    assert len(set(values)) == 300 and all(len(v) <= 6 for v in values)
    assert unique_value(FieldConfig(type="string"), "login_id", 12) == "login_id-12"
    assert long_range(FieldConfig(type="long")) == (0, 2**63 - 1)
    assert long_range(FieldConfig(type="long", greater_than=10, less_than=20)) == (11, 19)
    bounded = FieldConfig(type="long", greater_than=10, less_than=20)
    assert sorted(unique_value(bounded, "n", NOW_MS * 1000 + k) for k in range(9)) == list(range(11, 20))
