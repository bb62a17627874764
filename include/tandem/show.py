"""A plan's outputs printed to a terminal, merged over its instances (``tandem query``, the demo)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from rich import box
from rich.console import Console
from rich.table import Table

from tandem.json_values import json_text


def render_aggregates(rows: list[dict], title: str, spec) -> Table:
    """Merged aggregates as a table: bucket, keys, derived ratios, measures, shards."""
    columns = [*spec.keys, *(r.column for r in spec.ratios), *spec.measure_columns, "shards"]
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("bucket (UTC)", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="left" if column in spec.keys else "right", no_wrap=True)

    def shown(value) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    for row in rows:
        table.add_row(row["bucket_start"].strftime("%Y-%m-%d %H:%M:%S"), *[shown(row[c]) for c in columns])
    return table


def show_output(console: Console, cluster, plan, output: str, *, limit: int | None = None) -> None:
    """Print a table output merged, or an events output's first ``limit`` events (all time), from PostgreSQL."""
    if plan.outputs[output].kind == "aggregation":
        from tandem import aggregation
        from tandem.aggregation.spec import spec_for

        now = datetime.now(timezone.utc)  # a day either side: a demo rerun writes events after an earlier watermark
        rows = aggregation.query(cluster, plan.name, "minute", now - timedelta(days=1), now + timedelta(days=1),
                                 output=output)
        console.print(render_aggregates(rows[-(limit or len(rows)):], f"{plan.name} {output} per minute (PostgreSQL)",
                                        spec_for(plan, output)))
        return
    if plan.outputs[output].kind == "table":
        print_table(console, cluster, plan, output, {})
        return
    console.print(f"[bold]{plan.name} {output}[/] (events, first {limit or 'all'}):")
    print_events(console, cluster, plan, output, datetime(1970, 1, 1, tzinfo=timezone.utc),
                 datetime(9999, 1, 1, tzinfo=timezone.utc), limit=limit)


def print_table(console: Console, cluster, plan, output: str, key: dict[str, str], *, source: str = "postgres",
                as_json: bool = False) -> None:
    """A table output merged over the instances, rows matching ``key`` (from PostgreSQL or Delta)."""
    from tandem.layout import delta_table_dir
    from tandem.outputs.table import read_table_lake
    from tandem.store import Database
    from tandem.store.outputs import read_table_rows

    config = plan.outputs[output]
    if source == "delta":
        rows = [r for r in read_table_lake(delta_table_dir(cluster, plan.name, output), config)
                if all(str(r.get(k)) == str(v) for k, v in key.items())]
    else:
        with Database(cluster.database_url, "tandem-query") as db:
            found = db.run(lambda cursor: read_table_rows(cursor, plan.name, output, config.values, key or None))
        rows = [{**r["key"], **{v: float(r[v]) for v in config.values}, "instances": int(r["instances"])}
                for r in found]
    if as_json:
        print(json_text(rows, indent=2))
        return
    table = Table(title=f"{plan.name} {output} ({source}, merged over instances)", box=box.SIMPLE_HEAD)
    for column in [*config.key, *config.values, "instances"]:
        table.add_column(column, justify="left" if column in config.key else "right")
    for row in rows:
        table.add_row(*[f"{row[c]:g}" if isinstance(row[c], float) else str(row[c])
                        for c in [*config.key, *config.values, "instances"]])
    console.print(table)


def print_events(console: Console, cluster, plan, output: str, start: datetime, end: datetime, *,
                 source: str = "postgres", as_json: bool = False, follow: bool = False,
                 limit: int | None = None) -> None:
    """An events output's events in ``[start, end)`` in time order; ``follow`` keeps printing new ones."""
    from tandem.store import Database
    from tandem.store.outputs import count_events, read_events

    if source == "delta":
        from tandem.layout import delta_table_dir
        from tandem.outputs.base import as_utc
        from tandem.outputs.events import read_events_lake

        lake = read_events_lake(delta_table_dir(cluster, plan.name, output)).to_pylist()
        time_field = plan.outputs[output].time
        for event in sorted(lake, key=lambda e: (e[time_field], e["event_id"])):
            if start <= as_utc(event[time_field]) < end:
                print(json_text(event) if as_json else
                      ", ".join(f"{k}={v}" for k, v in event.items()), flush=True)
        return
    after: tuple[datetime, str] | None = None
    far = datetime(9999, 1, 1, tzinfo=timezone.utc)
    page = limit or 1000
    with Database(cluster.database_url, "tandem-query") as db:
        while True:
            rows = db.run(lambda cursor: read_events(cursor, plan.name, output, start, far if follow else end,
                                                     after=after, limit=page))
            for row in rows:
                event = {"event_id": row["event_id"], "event_time": row["event_time"].isoformat(),
                         "shard_id": row["shard_id"], **row["payload"]}
                if as_json:
                    print(json_text(event), flush=True)
                else:
                    details = ", ".join(f"{k}={v}" for k, v in row["payload"].items())
                    console.print(f"{event['event_time']}  {row['shard_id']}  {details}", highlight=False)
                after = (row["event_time"], row["event_id"])
            if limit is not None:
                total = db.run(lambda cursor: count_events(cursor, plan.name, output))
                console.print(f"({len(rows)} of {total} events shown)")
                return
            if len(rows) == page:
                continue
            if not follow:
                return
            time.sleep(1.0)
