"""What DAG files need at parse time: the configuration, default arguments and Params of a plan.

Everything here reads ``conf/`` only: no database, no network, no Spark, no Great Expectations.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig, conf_dir, load_cluster, load_plans_and_errors
from tandem.errors import ConfigError
from tandem.names import ACTIVE, BACKUP, PASSIVE, ROLES, WARM, plan_dag_id
from tandem.ops import OPS_ACTIONS
from tandem.sources import source_of

# Durations tandem.declarations.parse_duration accepts ("500 ms", "2 seconds", "1m", "1.5 s"), lower case.
DURATION_PATTERN = (r"^\s*\d+(\.\d+)?\s*(ms|millis|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?"
                    r"|d|days?)?\s*$")
RUN_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 2, "retry_delay": timedelta(seconds=20)}
VALIDATE_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 1, "retry_delay": timedelta(minutes=2)}
SUPERVISE_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 3, "retry_delay": timedelta(seconds=15)}
OPS_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 1, "retry_delay": timedelta(seconds=30)}
# a BAD snapshot or a refused restore fails without retry (AirflowFailException); a transient error retries once
SNAPSHOT_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 1, "retry_delay": timedelta(seconds=30)}
MAINTENANCE_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 1, "retry_delay": timedelta(minutes=5)}
RESTORE_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 1, "retry_delay": timedelta(seconds=30)}
BATCH_DEFAULT_ARGS: dict[str, Any] = {"owner": "tandem", "retries": 1, "retry_delay": timedelta(seconds=30)}
"""The backfill and reconcile DAGs. A recompute whose Spark job died goes on with the same RUNNING backfill
(replacing a range twice is harmless); one that failed is FAILED in ``tandem.backfills`` and its retry refused:
trigger the DAG again."""
SUPERVISE_MAX_WATCH = timedelta(hours=1)
log = logging.getLogger(__name__)
NODE_EXECUTOR = "EdgeExecutor"
"""The executor of a node's tasks when the node names an ``airflow_queue``: an Edge worker on the
node's host serves that queue (``airflow edge worker --queues <queue>``), over HTTP to the API server."""


def cluster_yaml(dags_folder: Path) -> Path:
    """``cluster.yaml`` for DAG files: from ``TANDEM_CONF_DIR`` / ``TANDEM_HOME`` when set, else ``../conf``."""
    if os.environ.get("TANDEM_CONF_DIR") or os.environ.get("TANDEM_HOME"):
        return conf_dir() / "cluster.yaml"
    return dags_folder.resolve().parent / "conf" / "cluster.yaml"


def load_for_dags(dag_file: str) -> tuple[ClusterConfig, dict[str, PlanConfig]]:
    """The cluster and every plan that loads, for the DAG file at ``dag_file`` (see :func:`load_all_for_dags`)."""
    cluster, plans, _ = load_all_for_dags(dag_file)
    return cluster, plans


def load_all_for_dags(dag_file: str) -> tuple[ClusterConfig, dict[str, PlanConfig], dict[str, ConfigError]]:
    """The cluster, every plan that loads, and each broken plan's error, for the DAG file at ``dag_file``.

    A broken plan file does not fail the DAG file (which would take every other plan's DAGs, and the
    ops and restore DAGs, with it): its own DAGs are left out, whole, and its error is logged at ERROR
    (the dag-processor's log of the file). Airflow reports import errors per file, not per DAG, so
    the broken plan has no import error of its own: the docs of ``tandem_ops`` and ``tandem_restore``
    list it (:func:`with_broken_plans`). A broken ``cluster.yaml`` still fails every DAG file: no plan
    can be built without it.
    """
    cluster = load_cluster(cluster_yaml(Path(dag_file).parent))
    plans, broken = load_plans_and_errors(cluster)
    for name, error in broken.items():
        log.error("plan %s is broken, its DAGs are not defined until its file loads: %s", name, error)
    return cluster, plans, broken


def human_duration(seconds: float) -> str:
    """``1.0`` → ``"1 second"``, ``86400`` → ``"1 day"``, ``0.5`` → ``"500 ms"`` (parse_duration reads it back)."""
    millis = round(seconds * 1000)
    for factor, unit in ((86_400_000, "day"), (3_600_000, "hour"), (60_000, "minute"), (1000, "second")):
        if millis % factor == 0:
            count = millis // factor
            return f"{count} {unit}" if count == 1 else f"{count} {unit}s"
    return f"{millis} ms"


def notify_callbacks(plan: str, *, success: str | None = None, failure: str | None = None,
                     environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Callback arguments of a task that notifies ``success`` / ``failure`` events (names of
    :data:`tandem.airflow.notifications.EVENTS`) of ``plan`` through the connections ``TANDEM_NOTIFY_CONN_IDS``
    names; none named: ``{}``. Nothing is read but the environment: the connections are resolved when a callback
    runs."""
    from tandem.airflow.notifications import TandemNotifier, notify_conn_ids

    conn_ids = notify_conn_ids(environ)
    if not conn_ids:
        return {}
    chosen = {"on_success_callback": success, "on_failure_callback": failure}
    return {name: [TandemNotifier(event, plan, conn_ids)] for name, event in chosen.items() if event}


def launch_task_id(node: str) -> str:
    """The task of ``tandem_<plan>_run`` that launches on ``node``'s host."""
    return f"launch_{node}"


def stop_task_id(node: str) -> str:
    """The task of ``tandem_<plan>_run`` that stops the node's instance on ``node``'s host."""
    return f"stop_{node}"


LAUNCH, RELAUNCH, STOP = "launch", "relaunch", "stop"
RUN_ACTIONS = (LAUNCH, RELAUNCH, STOP)
"""``action`` of ``tandem_<plan>_run``: keep a live instance, replace it on its host, or stop it there."""

INSTANCE_TEMPLATE = "{{ params.get('shard_id') or params.instance }}"
"""The templated instance of a ``tandem_<plan>_run`` or ``tandem_<plan>_snapshot`` run: the Param ``instance``, or
the conf key ``shard_id`` of a client older than the rename (until the next release; the run DAG's Param has a
default, so the older key must win when it is there)."""


def snapshot_task_id(instance: str, node: str) -> str:
    """The task of ``tandem_<plan>_snapshot`` that snapshots ``instance`` on ``node``'s host."""
    return f"snapshot_{instance}_on_{node}"


def node_task_args(cluster: ClusterConfig, node: str) -> dict[str, Any]:
    """Operator arguments that run a task on ``node``'s host: its queue on the Edge executor, or
    nothing (the default executor) when the node names no queue."""
    queue = cluster.node(node).airflow_queue
    return {"executor": NODE_EXECUTOR, "queue": queue} if queue else {}


def run_params(plan: PlanConfig) -> dict[str, Any]:
    """Params of ``tandem_<plan>_run``: the action, node and instance (enums of the plan's), trigger
    interval, role, the node to re-sync from, the request's deadline, and a stop's timeout and launch."""
    from airflow.sdk import Param

    return {
        "action": Param(LAUNCH, type="string", enum=list(RUN_ACTIONS), title="Action",
                        description="launch: make sure the instance runs (a live one is kept); relaunch: stop "
                                    "it on the node's host first, then launch (what the supervisor does); "
                                    "stop: stop it on the node's host (the supervisor's fallback when its "
                                    "driver does not obey a stop request)"),
        "node": Param(plan.nodes[0], type="string", enum=list(plan.nodes), title="Node",
                      description=f"where to run (a node of plan {plan.name})"),
        "instance": Param(plan.instances[0], type="string", enum=list(plan.instances), title="Instance",
                          description="which instance of the plan runs on the node (it reads that instance's partitions)"),
        "trigger_interval": Param(human_duration(plan.trigger_interval_s), type="string", pattern=DURATION_PATTERN,
                                  title="Trigger interval",
                                  description="micro-batch interval, e.g. '500 ms', '1 second', '2 seconds'"),
        "role": Param(ACTIVE, type="string", enum=list(ROLES), title="Role",
                      description="ACTIVE takes the lease when it is free; PASSIVE and BACKUP are hot standbys; "
                                  "WARM builds its Spark session and starts its queries when it takes over"),
        "resync_from": Param("", type="string", enum=["", *plan.nodes], title="Re-sync from",
                             description="first copy a cut of this node's checkpoint over the launched node's "
                                         "(empty: start from its own checkpoint)"),
        "expires_at": Param("", type="string", title="Expires at",
                            description="ISO time after which the request is refused (empty: never); the "
                                        "supervisor sets it so that a late task does not act on an old decision"),
        "stop_timeout": Param("1 minute", type="string", pattern=DURATION_PATTERN, title="Stop timeout",
                              description="stop: how long the instance may take to stop after SIGTERM before "
                                          "SIGKILL"),
        "launched_at": Param("", type="string", title="Launched at",
                             description="stop: only the launch of this time (ISO, the instance row's "
                                         "launched_at; empty: whichever runs), so that a late stop leaves a "
                                         "newer launch alone"),
    }


def run_doc(plan: PlanConfig) -> str:
    return f"""### Run an instance of plan `{plan.name}`

{plan.description}

Launches one instance on one node (plan × instance × node) as a detached `spark-submit` job and waits until it
reports RUNNING, or stops it. `route` picks the task `launch_<node>` or `stop_<node>`, which runs on
the node's own host when the node names an `airflow_queue` (an Edge worker there serves it).

- **launch**: triggering again for an instance that is alive returns the running job: no second
  job is ever submitted.
- **relaunch**: first stops the instance on its host (signals: a driver that ignored its stop
  request or hangs is ended there), then launches; with `resync_from` it copies a cut of that
  node's checkpoint over the launched node's in between. The supervisor relaunches this way (with
  `role`, `resync_from` and an `expires_at` deadline).
- **stop**: stops the instance on its host (SIGTERM, SIGKILL after `stop_timeout`); the supervisor
  does this when a stop request through PostgreSQL was not obeyed.

Trigger from the UI or REST with conf such as
`{{"node": "{plan.nodes[0]}", "instance": "{plan.instances[0]}", "trigger_interval": "{human_duration(plan.trigger_interval_s)}"}}`.
"""


def suite_doc(suite: str | None) -> str:
    """A plan's suite in a DAG's doc: its file, or the suite its declarations imply (``None``)."""
    return f"`conf/expectations/{suite}.json`" if suite else "implied by the plan's declarations"


def validate_doc(plan: PlanConfig) -> str:
    return f"""### Validate the serving table of plan `{plan.name}`

Runs the Great Expectations suite {suite_doc(plan.validation.suite)} over the partial
aggregates of the last {human_duration(plan.validation.lookback_s)} and logs the merged hourly
aggregates of that window. Fails when an expectation fails; the log names it with sample rows.
"""


REACT_DOC = {
    "hot": ("the hot standby has taken the lease by itself; the failed node comes back as PASSIVE after "
            "re-syncing from the active; a BACKUP moves up when no PASSIVE is left."),
    "warm": ("the WARM standby has taken the lease by itself and started its queries from a cut of the "
             "failed active's checkpoint; the failed node comes back as the WARM standby."),
    "cold": "the plan is started on the next node from a cut of the failed active's checkpoint; the failed node stays down.",
}
"""What the supervise DAG's react step does, per standby mode."""


def supervise_doc(plan: PlanConfig) -> str:
    standbys = {"hot": [PASSIVE, *[BACKUP] * max(0, len(plan.nodes) - 2)], "warm": [WARM]}.get(plan.ha.standby, [])
    roles = ", ".join(f"`{node}` {role}" for node, role in zip(plan.nodes, [ACTIVE, *standbys]))
    return f"""### Supervise plan `{plan.name}` ({plan.ha.standby} standby)

Each run is one epoch of the plan's cluster (initial roles: {roles}):

1. **ensure** launches what is missing, each node in its role (detached `spark-submit`; a job
   that runs is found again, never submitted twice);
2. **watch** defers to the triggerer, which reads heartbeats and leases from PostgreSQL every
   second and fires when an instance is DEAD (no liveness beat for {human_duration(plan.heartbeat.timeout_s)}),
   FAILED, or STALLED (no progress for {human_duration(plan.ha.stall_timeout_s)} while input waits);
   after {human_duration(SUPERVISE_MAX_WATCH.total_seconds())} without a problem it ends quietly;
3. **react** fails over and repairs: {REACT_DOC[plan.ha.standby]}

Every decision is in `tandem.failover_events` (`tandem status {plan.name}`) and in the task logs.
Then the run ends and the next one starts. With `TANDEM_NOTIFY_CONN_IDS` set, **ensure** and **react** notify
each failover and BLOCKED instance once through those Airflow connections.
"""


def ops_params(cluster: ClusterConfig, plans: dict[str, PlanConfig]) -> dict[str, Any]:
    """Params of ``tandem_ops``: action, plan, instance (empty: every instance), node.

    A conf with ``shard_id``, the former name of ``instance``, is still obeyed until the next release
    (:func:`tandem.airflow.operator_support.requested_instance`)."""
    from airflow.sdk import Param

    names = sorted(plans)
    instances = sorted({instance for plan in plans.values() for instance in plan.instances})
    return {
        "action": Param("failover_now", type="string", enum=list(OPS_ACTIONS), title="Action",
                        description="failover_now: move the ACTIVE role to a standby now; drain_node: hand the "
                                    "node's ACTIVE roles to others and stop it; restart_node: restart the node's "
                                    "instances as standbys after re-syncing them (undoes a drain); snapshot_now: "
                                    "take a snapshot of each instance's ACTIVE node now on a standby's host "
                                    "(or of the node's instance, here); cutover: carry out a change the "
                                    "checkpoints refuse (a group's parallel, a measure) on the stopped plan; upgrade: "
                                    "take the plan's changed files without stopping (a standby of the new version, "
                                    "verified, takes over); finish_upgrade: restart the old version's nodes on the "
                                    "new one; rollback: hand back to the old version"),
        "plan": Param(names[0] if names else "", type="string", enum=names, title="Plan",
                      description="a plan whose file loads (broken plans: see the DAG's docs)"),
        "instance": Param("", type="string", enum=["", *instances], title="Instance",
                          description="one group instance of the plan (e.g. shop-1), or empty for every one"),
        "node": Param("", type="string", enum=["", *cluster.nodes], title="Node",
                      description="required for drain_node and restart_node; for failover_now the preferred "
                                  "standby to take over"),
        "expect_changes": Param(False, type="boolean", title="Expect changes",
                                description="upgrade: the change is one of semantics; hand over although the new "
                                            "version's outputs differ (the task log shows how)"),
    }


OPS_DOC = """### Operate Tandem's plans

Trigger with Params:

- **failover_now** (plan, optional instance, optional node): the ACTIVE role moves to a live hot
  standby at once (a lease handover; the old active keeps running as PASSIVE). Warm plans stop
  the active and start the plan on another node from a cut of its checkpoint.
- **drain_node** (plan, node, optional instance): the node's ACTIVE roles go to other nodes; once
  they are promoted, its instances stop. Supervision leaves a drained node down.
- **restart_node** (plan, node, optional instance): stop the node's instances (failing over first
  where they are ACTIVE) and relaunch them as standbys after re-syncing from the active.
- **snapshot_now** (plan, optional instance, optional node): take a snapshot of each instance's
  ACTIVE node now through a run of `tandem_<plan>_snapshot`, on a live standby's host as scheduled
  snapshots are; with a node, of that node's instance, in this task. It is validated and listed by
  `tandem snapshots <plan>`.
- **cutover** (plan, optional instance naming its group): carry out a change the plan's checkpoints
  refuse (a group's `parallel`, an aggregation's measures) by a cut-over of the stopped plan, every
  output kept (`tandem plan cutover`, docs: Changing a plan). Stop the plan's instances first.
- **upgrade** (plan, optional instance, expect_changes): take the plan's changed files without
  stopping it (`tandem upgrade`): per instance a standby restarts on the new version, its outputs are
  compared with the ACTIVE's for 30 s, then it takes over through the lease. A difference stops it
  unless **expect_changes** is set. **rollback** hands back to the old version while it runs as the
  standby; **finish_upgrade** restarts the old version's nodes on the new one.

A run acts only for a user Airflow lets trigger the plan's supervision DAG (`tandem_<plan>_supervise`), however it
was triggered; for anyone else (or a run without a triggering user) it fails and changes nothing.
The task log ends with a summary of every decision (also in `tandem.failover_events`).
A conf with `shard_id` (the former name of `instance`) is still obeyed until the next release.
"""


def with_broken_plans(doc: str, broken: dict[str, ConfigError]) -> str:
    """The docs ``doc`` of a DAG over every plan (``tandem_ops``, ``tandem_restore``), and a "Broken plans"
    section when a plan file does not load."""
    if not broken:
        return doc
    # one indented code line per error: shown literally, whatever the file or value quoted in it holds
    errors = "\n".join("    " + " ".join(str(error).splitlines()) for error in broken.values())
    return f"""{doc}
### Broken plans

These plan files do not load: their DAGs are not defined, and the Params above do not offer them,
until the file is fixed (`tandem config check` says the same; the dag-processor's log has it too).
The other plans' DAGs are unaffected.

{errors}
"""


def snapshot_params(plan: PlanConfig) -> dict[str, Any]:
    """Params of ``tandem_<plan>_snapshot``: the instance (empty, as scheduled runs have it: every instance)."""
    from airflow.sdk import Param

    return {"instance": Param("", type="string", enum=["", *plan.instances], title="Instance",
                              description="one instance, or empty for every instance (tandem_ops snapshot_now picks one)")}


def snapshot_doc(plan: PlanConfig) -> str:
    return f"""### Snapshots of plan `{plan.name}`

Every {human_duration(plan.snapshot.interval_s)} (`snapshot.interval`), for each instance, on the host of a
live standby (PASSIVE first; the ACTIVE's own host when no standby runs: `choose_host_<instance>`), a consistent
cut of the ACTIVE instance's checkpoint at its last committed batch (the query keeps running), its
operator state exported to the Delta table `state_snapshots`, the Delta versions of the plan's outputs
at the cut, validated with the suite {suite_doc(plan.snapshot.suite)} and marked GOOD or
BAD in `tandem.snapshots`. Then **prune** keeps the newest {plan.snapshot.keep} GOOD snapshots per instance
(`snapshot.keep`; never the newest good one) and deletes the others' files.

An instance with no ACTIVE instance is skipped. A run triggered with an instance (Param `instance`, as
`tandem_ops` snapshot_now does) snapshots only that instance. A BAD snapshot fails its task (see its log for the
failed expectations) and is notified through the connections `TANDEM_NOTIFY_CONN_IDS` names. List them with
`tandem snapshots {plan.name}`; restore with the `tandem_restore` DAG or `tandem restore {plan.name}`.
"""


def restore_params(cluster: ClusterConfig, plans: dict[str, PlanConfig]) -> dict[str, Any]:
    """Params of ``tandem_restore``: plan, instance, snapshot id, node, force, confirm (``shard_id``: as in
    :func:`ops_params`)."""
    from airflow.sdk import Param

    names = sorted(plans)
    instances = sorted({instance for plan in plans.values() for instance in plan.instances})
    return {
        "plan": Param(names[0] if names else "", type="string", enum=names, title="Plan",
                      description="a plan whose file loads (broken plans: see the DAG's docs)"),
        "instance": Param("", type="string", enum=["", *instances], title="Instance",
                          description="one group instance of the plan, or empty for every one (ignored when a "
                                      "snapshot id is given)"),
        "snapshot_id": Param("", type="string", title="Snapshot id",
                             description="empty: each instance's newest GOOD snapshot (tandem snapshots <plan>)"),
        "node": Param("", type="string", enum=["", *cluster.nodes], title="Node",
                      description="the node to start ACTIVE (default: the node the snapshot was cut from)"),
        "force": Param(False, type="boolean", title="Force",
                       description="restore a snapshot marked BAD (its state may be incomplete)"),
        "undo_backfills": Param(False, type="boolean", title="Undo backfills",
                                description="restore a snapshot taken before backfills of the instance (they are "
                                            "undone: backfill those ranges again afterwards)"),
        "confirm": Param(False, type="boolean", title="Confirm",
                         description="a restore rewinds the plan's outputs to the snapshot: a run without "
                                     "confirm = true fails and changes nothing"),
    }


RESTORE_DOC = """### Restore a plan from a snapshot

Trigger with Params (plan, instance or all, snapshot id or the newest GOOD one, node, force, undo backfills) and
**confirm** set: a run without `confirm = true` fails at once and changes nothing, however it was
triggered (the form, the REST API, `airflow dags trigger`); so does a run whose triggering user Airflow does not
let trigger the plan's supervision DAG (`tandem_<plan>_supervise`). For
each group instance: stop it on every node, put the snapshot's checkpoint cut in place of each node's
checkpoint, roll the plan's Delta outputs back to the snapshot's versions (this instance's rows
only) and the PostgreSQL outputs to match, then start the ACTIVE node (the supervisor starts
the standbys). The plan reprocesses the input after the cut. A BAD snapshot is refused unless
forced, and one taken before backfills of the instance unless `undo_backfills` is set. The steps are
in the task log and the run note. A conf with `shard_id` (the former name of `instance`) is still
obeyed until the next release.
"""


def _maintenance_schedule(plan: PlanConfig) -> str:
    schedule = plan.maintenance.dag_schedule
    if schedule is None:
        return "Runs only when triggered (`maintenance.schedule: manual`)."
    return "Hourly." if schedule == "@hourly" else f"On the schedule `{schedule}` (`maintenance.schedule`)."


def maintenance_doc(plan: PlanConfig) -> str:
    retention = plan.maintenance.retention
    landed = [stream for stream in plan.streams
              if any(source_of(plan, stream).landing_partitions(plan, instance, stream) for instance in plan.instances)]
    return f"""### Maintenance of plan `{plan.name}`

{_maintenance_schedule(plan)} **landing_retention** deletes input files of `landing/<stream>/<partition>/` ({", ".join(landed) or "none"}) that
every guarding node's checkpoint has processed (a committed batch read them) and that every kept GOOD
snapshot's cut had processed too: no restart and no restore can need them. Everything else stays,
and the task log says why per file group (e.g. "after the cut of snapshot …"). A node guards while it
holds the lease, beats or checkpoints; one left behind (a standby down for 10 minutes) re-syncs from the
holder before it runs again, and the log names it.

**delta_upkeep** compacts the small files of each Delta output table into few large ones, writes a log
checkpoint and vacuums files removed more than {human_duration(plan.maintenance.vacuum_retention_s)} ago
(`maintenance.vacuum_retention`), except those of the versions the kept snapshots recorded: a restore can
still roll an instance back to them. The instances keep appending meanwhile; a compaction that loses a race
to an append is tried again. Off with `maintenance: {{compact: false}}`. Each output it compacted or expired rows of
gets an asset event (`x-tandem://{plan.name}/<output>`), as does each output **postgres_retention** deleted rows of.

**postgres_retention** deletes PostgreSQL rows older than `maintenance.retention` declares: aggregation
partials of {_partials_kept(plan)}; progress rows after {human_duration(retention.heartbeats_s)}, published
positions after {human_duration(retention.publish_log_s)}, contribution ids after
{human_duration(retention.contributions_s)} (never one a kept snapshot's replay may bring again) and supervision
events after {human_duration(retention.failover_events_s)}. The newest row of each kind that the supervisor, a
standby or this page reads is kept whatever its age.
"""


def _partials_kept(plan: PlanConfig) -> str:
    kept = plan.maintenance.retention.partials_s
    if not kept:
        return "every granularity kept for good"
    return ", ".join(f"{g} buckets after {human_duration(s)}" for g, s in kept.items()) + " (coarser ones kept)"


def backfill_params(plan: PlanConfig) -> dict[str, Any]:
    """The Params of ``tandem_<plan>_backfill``: the range and the instances."""
    from airflow.sdk import Param

    return {
        "start": Param("", type="string", minLength=1, title="Start",
                       description="first instant of the range, ISO (UTC when no zone), e.g. 2026-11-26T10:00:00Z"),
        "end": Param("", type="string", minLength=1, title="End",
                     description="end of the range (excluded); at or before the slowest instance's watermark"),
        "instance": Param("", type="string", enum=["", *plan.instances], title="Instance",
                          description="one instance, or empty for every instance of the plan"),
    }


def backfill_doc(plan: PlanConfig) -> str:
    return f"""### Backfill of plan `{plan.name}`

Recomputes a closed event-time range of the plan's outputs from the landing files still retained, **late events
included**, with the plan's own query functions, and replaces the range while the instances keep running.
Trigger with Params `start`, `end` (ISO, UTC when no zone) and optionally one `instance`.

**register** refuses a range that is not closed (ends after the slowest instance's watermark), whose input
retention deleted (names the files), or that overlaps a running backfill of the plan; else records it RUNNING in
`tandem.backfills`. **recompute** is the provider's `SparkSubmitOperator` running `jobs/backfill.py` on node
`{plan.nodes[0]}`'s Spark connection: each instance's queries run as finite `availableNow` queries over all its
retained input in one first micro-batch, then each aggregation's seconds in the range are replaced and its coarser
buckets rebuilt, in one PostgreSQL transaction and in Delta. **report** writes the outcome to the log and the run's
note, emits an asset event (`x-tandem://{plan.name}/<output>`) per output it changed, and fails unless the backfill
is DONE; the outcome is notified through the connections `TANDEM_NOTIFY_CONN_IDS` names. Also
`tandem backfill {plan.name} --start … --end …`.
"""

def reconcile_params() -> dict[str, Any]:
    """The Params of ``tandem_<plan>_reconcile``: an explicit day (a manual run; empty: the run's partition)."""
    from airflow.sdk import Param

    return {"day": Param("", type="string", pattern=r"^(\d{4}-\d{2}-\d{2})?$", title="Day",
                         description="the UTC day to reconcile, YYYY-MM-DD (empty: the run's partition, else yesterday)")}


def reconcile_doc(plan: PlanConfig) -> str:
    return f"""### Reconcile of plan `{plan.name}`

Daily at 01:00 UTC, for the day before (runs are partitioned by day: Airflow's backfill, in the UI or
`airflow backfill create --dag-id {plan_dag_id(plan.name, "reconcile")} --from-date … --to-date …`, runs it over a
month). **day** resolves the day (Param `day`, else the run's partition key), **reconcile** runs
`jobs/reconcile.py` with the provider's `SparkSubmitOperator`: each instance's queries recompute the day from the
retained landing files as a backfill would, and every output is compared with what was published, key by key:
`late` (the stream counted fewer events: dropped by the watermark, by design), `extra` (published, not
recomputed) and `different`. The counts and examples go to the Delta table `delta/{plan.name}/reconciliations`
and, with `reconcile.repair: true` ({plan.reconcile.repair}), the day goes to a backfill (an asset event per output
it changed, `x-tandem://{plan.name}/<output>`). **verdict** logs them, writes the run's note and the asset event,
and fails when extra + different exceed `reconcile.tolerance` ({plan.reconcile.tolerance}); the result is notified
through the connections `TANDEM_NOTIFY_CONN_IDS` names. Paused when created: the day's input must be retained
(`maintenance.keep_input`).
"""