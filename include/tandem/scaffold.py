"""``tandem plan new NAME``: a new plan's two files, ready to check, produce for and run as written.

``conf/plans/<name>.yaml`` declares one stream, one group with one query and one events output;
``conf/plans/<name>.py`` beside it holds the query. The plan has no generator of its own: sample
events come from its declarations (:class:`tandem.producer.DeclaredGenerator`).
"""

from __future__ import annotations

import re
from pathlib import Path

from tandem.config import ClusterConfig, load_plan
from tandem.errors import ConfigError, TandemError

PLAN_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
"""A new plan's name: also the name of its module and the prefix of its stream."""

YAML_TEMPLATE = """\
# {name}: events of {stream} whose value is at least a threshold, published once each.
# A plan is this file and {name}.py beside it; docs/plans.md is the guide.
name: {name}
description: {name} - high values of {stream}
streams:
  {stream}:                         # events land in landing/{stream}/<partition>/ (docs/partitions.md)
    partitions: 2
    key: device_id                  # events of one device go to one partition, and to one instance
    event_time: time
    fields:
      device_id: {{type: string, not_empty: true}}
      value: {{type: double, at_least: 0}}
      time: {{type: epoch_millis}}
groups:
  main:
    parallel: 1                     # instances main-1, ...; each reads a share of the partitions
    queries: [high_values]          # functions of {name}.py declared with @query
outputs:
  high_values:
    kind: events                    # each event published once, whichever node publishes it
    key: [device_id, time, value]   # the fields an event's id is computed from
    time: time
nodes: [{nodes}]
trigger_interval: 1 second
watermark: 10 seconds
"""

MODULE_TEMPLATE = '''\
"""{name}: the queries of conf/plans/{name}.yaml (docs/plans.md is the plan author's guide).

``high_values``: every event of ``{stream}`` whose value is at least :data:`THRESHOLD`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tandem.plans import PlanContext, query

STREAM = "{stream}"
THRESHOLD = 50.0


@query("high_values")
def high_values(ctx: PlanContext) -> DataFrame:
    """Events whose value is at least THRESHOLD (a stateless filter: every replica emits the same rows)."""
    return ctx.events(STREAM).where(F.col("value") >= THRESHOLD).select("device_id", "value", "time")
'''


def new_plan(cluster: ClusterConfig, name: str) -> tuple[Path, Path]:
    """Write ``<name>.yaml`` and ``<name>.py`` in the plans folder (``conf/plans/``, or ``TANDEM_PLANS_DIR``); return
    their paths. Refuses to overwrite anything."""
    if not PLAN_NAME.fullmatch(name):
        raise TandemError(f"{name[:80]!r} cannot name a new plan: {PLAN_NAME.pattern} (it is also a Python "
                          "module's name)")
    folder = cluster.plans_dir
    yaml_path, module_path = folder / f"{name}.yaml", folder / f"{name}.py"
    for path in (yaml_path, module_path):
        if path.exists():
            raise TandemError(f"{path} already exists: choose another name, or remove it first")
    stream = f"{name}_events"
    nodes = list(cluster.nodes)[:2]
    folder.mkdir(parents=True, exist_ok=True)
    yaml_path.write_text(YAML_TEMPLATE.format(name=name, stream=stream, nodes=", ".join(nodes)), encoding="utf-8")
    module_path.write_text(MODULE_TEMPLATE.format(name=name, stream=stream), encoding="utf-8")
    try:
        load_plan(name, cluster)
    except ConfigError:
        yaml_path.unlink()
        module_path.unlink()
        raise
    return yaml_path, module_path
