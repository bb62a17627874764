"""A key filter's value is text (``tandem query --key``, the REST API's ``key``), whatever type the key holds
(found after stop 52: a REST filter on a numeric key matched nothing, a CLI filter typed by JSON failed on a text
column).

On real PostgreSQL, the stores that keep typed JSON keys (tables, latest) find ``5`` in a key holding the number 5
(or 5.0), the string "5" in a text key and not "05", ``true`` in a boolean key: the same rows as the plain-Python
rule the other reads use (:meth:`ReadRequest.matches`), computed here independently.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

import pytest

from tandem.outputs.base import ReadRequest
from tandem.store import Database, migrate
from tandem.store import latest as latest_store
from tandem.store.outputs import apply_contributions, read_table_rows
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
PLAN = "filters"
KEYS = [{"n": 5, "name": "5", "ok": True}, {"n": 6, "name": "05", "ok": False}, {"n": 7, "name": "IBM", "ok": True},
        {"n": 5.5, "name": "true", "ok": False}]
FILTERS = [("n", "5"), ("n", "5.0"), ("n", "6"), ("n", "5.5"), ("name", "5"), ("name", "05"), ("name", "IBM"),
           ("name", "true"), ("name", "6"), ("ok", "true"), ("ok", "false"), ("ok", "True"), ("n", "x")]


def reference(field: str, text: str) -> list[dict]:
    """The keys whose field the text names: a string equal to it, else the number or boolean JSON reads in it."""
    import json
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    found = []
    for key in KEYS:
        value = key[field]
        if isinstance(value, str):
            hit = value == text
        elif isinstance(value, bool):
            hit = parsed is value
        else:
            hit = isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and value == parsed
        if hit:
            found.append(key)
    return found


def test_a_text_filter_finds_the_keys_it_names_in_every_store(database_url: str) -> None:
    instance = InstanceKey(PLAN, "g-1", "node-a")
    with Database(database_url) as db:
        migrate(db)

        def publish(cursor) -> None:
            apply_contributions(cursor, instance, "totals", ["amount"],
                                {f"c{i}": (key, {"amount": i + 1}) for i, key in enumerate(KEYS)}, 1, 0)
            at = datetime(2026, 12, 1, tzinfo=timezone.utc)
            latest_store.stage(cursor, [(json_key(key), at, f"t{i}", {**key, "at": i})
                                        for i, key in enumerate(KEYS)])
            latest_store.keep_higher(cursor, instance, "last", 1, 0, [json_key(key) for key in KEYS])
        db.run(publish)

        for field, text in FILTERS:
            expected = sorted(json_key(k) for k in reference(field, text))
            request = ReadRequest(keys={field: [text]})
            single, _ = request.in_store()
            tables = db.run(lambda c: read_table_rows(c, PLAN, "totals", ["amount"], single))
            latest = db.run(lambda c: latest_store.read_merged(c, PLAN, "last", single))
            assert sorted(json_key(r["key"]) for r in tables) == expected, (field, text)
            assert sorted(json_key(r["key"]) for r in latest) == expected, (field, text)
            assert sorted(json_key(k) for k in KEYS if request.matches(k)) == expected, (field, text)

        # several values of one field, and two fields: any of a field's values, every field
        request = ReadRequest(keys={"n": ["5", "7"], "ok": ["true"]})
        assert [k for k in KEYS if request.matches(k)] == [KEYS[0], KEYS[2]]


def json_key(key: dict) -> str:
    from tandem.store.outputs import canonical_key

    return canonical_key({k: key[k] for k in ("n", "name", "ok")})


def test_every_filter_is_checked_against_a_key_of_each_type() -> None:
    """The cases above cover a hit and a miss for numbers, strings and booleans (a test that cannot fail is none)."""
    hits = {(field, bool(reference(field, text))) for field, text in FILTERS}
    assert set(itertools.product(("n", "name", "ok"), (True, False))) <= hits
