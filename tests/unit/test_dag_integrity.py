"""DAG integrity: every file in dags/ imports cleanly and without I/O, ids, Params, tags, retries."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plans
from tandem.declarations import parse_duration

PROJECT = Path(__file__).resolve().parents[2]
DAGS = PROJECT / "dags"


@pytest.fixture(scope="module")
def plans():
    return load_plans(load_cluster(PROJECT / "conf" / "cluster.yaml"))


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    saved = {k: os.environ.pop(k) for k in ("TANDEM_HOME", "TANDEM_CONF_DIR") if k in os.environ}
    try:
        return DagBag(dag_folder=str(DAGS), safe_mode=False)
    finally:
        os.environ.update(saved)


def test_every_dag_file_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    files = {Path(dag.fileloc).name for dag in dagbag.dags.values()}
    assert files == {p.name for p in DAGS.glob("*.py")}


def test_each_plan_has_its_dags_and_there_is_one_ops_and_one_restore_dag(dagbag, plans):
    expected = {f"tandem_{name}_{kind}" for name in plans for kind in ("run", "validate", "supervise", "snapshot",
                                                                       "maintenance", "backfill", "reconcile")}
    assert set(dagbag.dag_ids) == expected | {"tandem_ops", "tandem_restore"}
    assert {"tandem_trades_run", "tandem_trades_validate"} <= set(dagbag.dag_ids)


def test_tags_and_retries_on_every_dag_and_task(dagbag, plans):
    for dag_id, dag in dagbag.dags.items():
        plan = "ops" if dag_id in ("tandem_ops", "tandem_restore") else dag_id.split("_", 1)[1].rsplit("_", 1)[0]
        assert plan in plans or plan == "ops"
        assert {"tandem", plan} <= set(dag.tags), dag_id
        assert dag.default_args.get("retries", 0) >= 1, dag_id
        assert dag.tasks, dag_id
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id}"


def test_backfill_dag_shape(dagbag, plans):
    cluster = load_cluster(PROJECT / "conf" / "cluster.yaml")
    for name, plan in plans.items():
        dag = dagbag.dags[f"tandem_{name}_backfill"]
        assert dag.schedule is None and set(dag.params) == {"start", "end", "instance"}
        register, recompute, report = (dag.get_task(t) for t in ("register", "recompute", "report"))
        assert register.downstream_task_ids == {"recompute"} and recompute.downstream_task_ids == {"report"}
        assert recompute.task_type == "SparkSubmitOperator"
        assert recompute._conn_id == cluster.node(plan.nodes[0]).airflow_conn_id
        assert recompute.application.endswith("jobs/backfill.py")
        assert report.trigger_rule == "all_done"


def test_reconcile_dag_is_partitioned_by_day_and_reports_an_asset(dagbag, plans):
    for name in plans:
        dag = dagbag.dags[f"tandem_{name}_reconcile"]
        assert type(dag.timetable).__name__ == "CronPartitionTimetable"
        day, compare, verdict = (dag.get_task(t) for t in ("day", "reconcile", "verdict"))
        assert day.downstream_task_ids == {"reconcile"} and compare.downstream_task_ids == {"verdict"}
        assert compare.task_type == "SparkSubmitOperator" and compare.application.endswith("jobs/reconcile.py")
        assert [a.name for a in verdict.outlets] == [f"tandem_{name}_reconciliations"]


def test_run_dag_shape(dagbag, plans):
    for name, plan in plans.items():
        dag = dagbag.dags[f"tandem_{name}_run"]
        assert dag.schedule is None
        assert dag.max_active_runs == len(plan.nodes) * len(plan.instances)
        route = dag.get_task("route")
        assert route.downstream_task_ids == {f"{verb}_{node}" for node in plan.nodes for verb in ("launch", "stop")}
        for node in plan.nodes:
            task = dag.get_task(f"launch_{node}")
            assert task.task_type == "LaunchPlanInstanceOperator"
            assert task.node == node
            assert set(task.template_fields) >= {"plan", "instance", "trigger_interval", "role", "resync_from",
                                                 "expires_at", "action"}
            stop = dag.get_task(f"stop_{node}")
            assert stop.task_type == "StopPlanInstanceOperator" and stop.node == node
            assert set(stop.template_fields) >= {"plan", "instance", "stop_timeout", "expires_at", "launched_at"}
            assert (stop.queue, stop.executor) == (task.queue, task.executor), "both run on the node's host"
            for action, chosen in (("launch", task), ("relaunch", task), ("stop", stop)):
                assert route.python_callable(params={"node": node, "action": action}) == chosen.task_id


def test_node_tasks_run_on_the_nodes_queue_when_it_names_one(tmp_path):
    from tandem.airflow.dags import NODE_EXECUTOR, node_task_args
    from tandem.config import load_cluster

    path = tmp_path / "conf" / "cluster.yaml"
    path.parent.mkdir()
    path.write_text("nodes:\n  node-a: {spark_master: 'local[1]', airflow_queue: host-a}\n"
                    "  node-b: {spark_master: 'local[1]'}\n")
    cluster = load_cluster(path)
    assert node_task_args(cluster, "node-a") == {"executor": NODE_EXECUTOR, "queue": "host-a"}
    assert node_task_args(cluster, "node-b") == {}


def test_a_bad_queue_name_names_the_file_and_field(tmp_path):
    from tandem.config import load_cluster
    from tandem.errors import ConfigError

    path = tmp_path / "conf" / "cluster.yaml"
    path.parent.mkdir()
    path.write_text("nodes:\n  node-a: {spark_master: 'local[1]', airflow_queue: 'host a'}\n")
    with pytest.raises(ConfigError, match=r"nodes\.node-a\.airflow_queue"):
        load_cluster(path)


def test_validate_dag_shape(dagbag, plans):
    for name, plan in plans.items():
        dag = dagbag.dags[f"tandem_{name}_validate"]
        assert dag.catchup is False
        assert dag.max_active_runs == 1
        assert dag.schedule == plan.validation.schedule
        assert dag.timetable.can_be_scheduled
        [task] = dag.tasks
        assert task.task_type == "ValidateServingTableOperator"
        assert task.lookback == plan.validation.lookback_s


def test_maintenance_dag_runs_on_the_plans_schedule(dagbag, plans):
    for name, plan in plans.items():
        dag = dagbag.dags[f"tandem_{name}_maintenance"]
        assert dag.schedule == plan.maintenance.dag_schedule == "@hourly"  # no conf plan declares its own
        assert dag.catchup is False and dag.max_active_runs == 1
        assert [t.task_id for t in dag.tasks] == ["landing_retention", "delta_upkeep", "postgres_retention"]


def test_snapshot_dag_shape(dagbag, plans):
    for name, plan in plans.items():
        dag = dagbag.dags[f"tandem_{name}_snapshot"]
        assert dag.catchup is False and dag.max_active_runs == 1
        assert dag.schedule == timedelta(seconds=plan.snapshot.interval_s) == timedelta(minutes=15)
        assert dag.timetable.can_be_scheduled
        prune = dag.get_task("prune")
        assert prune.trigger_rule == "all_done", "retention must run even when a snapshot failed"
        snapshots = [t for t in dag.tasks if t.task_type == "TakeSnapshotOperator"]
        assert sorted((t.instance, t.task_id) for t in snapshots) == sorted(
            (instance, f"snapshot_{instance}_on_{node}") for instance in plan.instances for node in plan.nodes)
        assert all(t.node == "" for t in snapshots), "every host snapshots the ACTIVE instance"
        assert all(t.downstream_task_ids == {"prune", "all_snapshots_good"} for t in snapshots)
        for instance in plan.instances:  # one task per node of the instance, after the choice of the host
            choose = dag.get_task(f"choose_host_{instance}")
            assert choose.task_type == "ChooseSnapshotHostOperator" and choose.instance == instance
            assert choose.downstream_task_ids == {f"snapshot_{instance}_on_{node}" for node in plan.nodes}
        assert dag.get_task("all_snapshots_good").trigger_rule == "none_failed", "a failed snapshot fails the run"


def test_a_snapshot_run_takes_every_instance_by_default_and_one_instance_when_triggered_for_it(dagbag, plans):
    """Scheduled runs have the Param's default (every instance); ``tandem_ops`` snapshot_now triggers a run
    for one instance, and the host choices of the other instances render that instance's name (they skip)."""
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["tandem_pizza_shop_snapshot"]
    assert dag.params.validate() == {"instance": ""}
    params = copy.deepcopy(dag.params)
    params.update({"instance": "shop-2"})
    for instance in plans["pizza_shop"].instances:
        task = dag.get_task(f"choose_host_{instance}")
        assert task.render_template(task.selected_instance, {"params": params.validate()}) == "shop-2"
    with pytest.raises(ParamValidationError):  # another plan's instance
        params.update({"instance": "shard-1"})
        params.validate()


def test_restore_params_default_to_the_latest_good_snapshot_and_reject_unknowns(dagbag, plans):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["tandem_restore"]
    assert dag.schedule is None
    assert dag.params.validate() == {"plan": sorted(plans)[0], "instance": "", "snapshot_id": "", "node": "",
                                     "force": False, "undo_backfills": False, "confirm": False}
    [task] = dag.tasks
    assert task.task_type == "RestoreSnapshotOperator"
    for param, value in (("plan", "nope"), ("node", "node-z"), ("instance", "shard-9"), ("force", "yes"),
                         ("undo_backfills", "yes"), ("confirm", "yes")):
        with pytest.raises(ParamValidationError, match=param):
            copy.deepcopy(dag.params)[param] = value


def test_supervise_dag_shape(dagbag, plans):
    from airflow.sdk.definitions.timetables.simple import ContinuousTimetable

    for name in plans:
        dag = dagbag.dags[f"tandem_{name}_supervise"]
        assert isinstance(dag.timetable, ContinuousTimetable)
        assert dag.max_active_runs == 1 and dag.catchup is False
        assert [t.task_id for t in dag.topological_sort()] == ["ensure", "watch", "react"]
        assert dag.get_task("watch").task_type == "StreamHealthSensor"
        assert dag.get_task("react").watch_task_id == "watch"
        assert dag.get_task("ensure").watch_task_id is None


def test_supervise_dag_runs_follow_each_other_with_distinct_logical_dates(dagbag, plans):
    from airflow.timetables.base import TimeRestriction
    from airflow.timetables.simple import ContinuousTimetable

    dag = dagbag.dags["tandem_trades_supervise"]
    restriction = TimeRestriction(earliest=dag.start_date, latest=None, catchup=False)
    first = ContinuousTimetable().next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    time.sleep(0.01)
    second = ContinuousTimetable().next_dagrun_info(last_automated_data_interval=first.data_interval,
                                                    restriction=restriction)
    assert second.logical_date > first.logical_date, "the next @continuous run would collide with the first"


def test_ops_params_validate_and_reject(dagbag, plans):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["tandem_ops"]
    assert dag.schedule is None
    assert dag.params.validate() == {"action": "failover_now", "plan": sorted(plans)[0], "instance": "", "node": "",
                                     "expect_changes": False}
    params = copy.deepcopy(dag.params)
    params.update({"action": "drain_node", "plan": "trades", "instance": "shard-2", "node": "node-a"})
    assert params.validate()["action"] == "drain_node"
    params.update({"action": "snapshot_now", "node": ""})
    assert params.validate()["action"] == "snapshot_now"
    params.update({"action": "upgrade", "expect_changes": True})
    assert params.validate()["expect_changes"] is True
    for param, value in (("action", "reboot"), ("plan", "nope"), ("node", "node-z"), ("instance", "shard-9"),
                         ("expect_changes", "yes")):
        with pytest.raises(ParamValidationError, match=param):
            copy.deepcopy(dag.params)[param] = value


@pytest.mark.parametrize("dag_id", ["tandem_ops", "tandem_restore"])
def test_a_conf_of_an_older_client_still_names_the_instance_shard_id(dagbag, dag_id, caplog):
    """Until the next release, a run triggered with ``instance`` (the Param's former name) acts on that
    instance; with both names given and different it fails without retry."""
    import logging

    from airflow.sdk.exceptions import AirflowFailException
    from tandem.airflow.operator_support import requested_instance

    dag = dagbag.dags[dag_id]
    [task] = dag.tasks
    log = logging.getLogger("test")

    def instance_of(conf: dict) -> str:
        params = copy.deepcopy(dag.params)
        params.update({"plan": "trades", **conf})
        values = params.validate()
        return requested_instance(log, task.render_template(task.instance, {"params": values}), values)

    assert instance_of({"instance": "shard-2"}) == "shard-2"
    assert instance_of({}) == ""
    assert "deprecated" not in caplog.text
    assert instance_of({"shard_id": "shard-2"}) == "shard-2"
    assert "the conf key shard_id is deprecated" in caplog.text
    assert instance_of({"instance": "shard-2", "shard_id": "shard-2"}) == "shard-2"
    with pytest.raises(AirflowFailException, match="give instance only"):
        instance_of({"instance": "shard-1", "shard_id": "shard-2"})


def test_run_params_default_to_the_plans_first_node_and_instance(dagbag, plans):
    plan = plans["trades"]
    values = dagbag.dags["tandem_trades_run"].params.validate()
    assert values == {"action": "launch", "node": plan.nodes[0], "instance": plan.instances[0],
                      "trigger_interval": "1 second", "role": "ACTIVE", "resync_from": "", "expires_at": "",
                      "stop_timeout": "1 minute", "launched_at": ""}
    assert parse_duration(values["trigger_interval"]) == plan.trigger_interval_s


@pytest.mark.parametrize(("param", "value"), [
    ("node", "node-z"), ("instance", "shard-9"), ("trigger_interval", "soon"), ("trigger_interval", "1 fortnight"),
    ("node", 3), ("role", "LEADER"), ("resync_from", "node-z"), ("action", "restart"), ("stop_timeout", "never"),
])
def test_run_params_reject_bad_values(dagbag, param, value):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dagbag.dags["tandem_trades_run"].params)
    with pytest.raises(ParamValidationError, match=param):
        params[param] = value


@pytest.mark.parametrize("value", ["500 ms", "2 seconds", "1.5 s", "1m", "10 minutes", "1 hour"])
def test_run_params_accept_durations(dagbag, value):
    params = copy.deepcopy(dagbag.dags["tandem_trades_run"].params)
    params["trigger_interval"] = value
    params["node"] = "node-b"
    assert params.validate()["trigger_interval"] == value


def test_run_templates_render_the_params(dagbag):
    dag = dagbag.dags["tandem_trades_run"]
    task = dag.get_task("launch_node-b")
    params = copy.deepcopy(dag.params)
    params.update({"node": "node-b", "instance": "shard-2", "trigger_interval": "2 seconds", "role": "PASSIVE",
                   "resync_from": "node-a"})
    rendered = {field: task.render_template(getattr(task, field), {"params": params.validate()})
                for field in ("plan", "node", "instance", "trigger_interval", "role", "resync_from")}
    assert rendered == {"plan": "trades", "node": "node-b", "instance": "shard-2", "trigger_interval": "2 seconds",
                        "role": "PASSIVE", "resync_from": "node-a"}



@pytest.mark.parametrize("dag_id, task_id, field", [("tandem_trades_run", "launch_node-b", "instance"),
                                                    ("tandem_trades_run", "stop_node-b", "instance"),
                                                    ("tandem_trades_snapshot", "choose_host_shard-1",
                                                     "selected_instance")])
def test_a_run_of_an_older_client_naming_shard_id_gets_that_instance(dagbag, dag_id, task_id, field):
    """A conf key ``shard_id`` (before the rename) is obeyed until the next release, though the run DAG's Param
    ``instance`` has a default (the plan's first instance)."""
    dag = dagbag.dags[dag_id]
    task = dag.get_task(task_id)

    def rendered(conf: dict) -> str:
        params = copy.deepcopy(dag.params)
        params.update({**({"node": "node-b"} if "node" in params else {}), **conf})
        return task.render_template(getattr(task, field), {"params": params.validate()})

    assert rendered({"shard_id": "shard-2"}) == "shard-2"
    assert rendered({"instance": "shard-2"}) == "shard-2"
    assert rendered({}) == ("shard-1" if dag_id.endswith("_run") else "")

def test_dags_serialize_like_the_scheduler_stores_them(dagbag):
    from airflow.serialization.serialized_objects import DagSerialization

    for dag in dagbag.dags.values():
        data = DagSerialization.to_dict(dag)
        json.dumps(data)
        restored = DagSerialization.from_dict(data)
        assert restored.dag_id == dag.dag_id
        assert set(restored.task_ids) == set(dag.task_ids)


def _parse_in_fresh_interpreter(dags: Path, tmp_path: Path) -> dict:
    """A fresh interpreter with an audit hook: connecting a socket or starting a process fails the parse.

    Airflow's own modules are imported before the hook is installed (croniter runs ``file -b`` at
    import to learn the word size); the hook then watches only what parsing the DAG files does.
    """
    script = textwrap.dedent(f"""
        import json, sys
        import airflow.sdk, croniter
        from airflow.dag_processing.dagbag import DagBag
        events = []
        def hook(event, args):
            if event in ("socket.connect", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
                         "sqlite3.connect"):
                events.append(event + " " + repr(args)[:200])
                raise RuntimeError("I/O at DAG parse time: " + event)
        sys.addaudithook(hook)
        import psycopg2  # libpq opens its sockets in C, out of the audit hook's sight
        def no_database(*args, **kwargs):
            events.append("psycopg2.connect")
            raise RuntimeError("database access at DAG parse time")
        psycopg2.connect = no_database
        bag = DagBag(dag_folder={str(dags)!r}, safe_mode=False)
        print(json.dumps({{"errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                           "dags": sorted(bag.dag_ids), "events": events}}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "TANDEM_DATABASE_URL": "postgresql://nobody@203.0.113.1:1/unreachable"})
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dag_files_parse_without_database_network_or_subprocesses(tmp_path):
    result = _parse_in_fresh_interpreter(DAGS, tmp_path)
    assert result["errors"] == {}
    assert result["events"] == []
    assert "tandem_trades_run" in result["dags"]


def test_the_parse_guard_catches_a_dag_file_that_queries_the_database(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "bad_dag.py").write_text(textwrap.dedent("""
        from airflow.sdk import DAG
        from tandem.store.db import connect
        connect("postgresql://postgres@127.0.0.1:5432/postgres")
        with DAG(dag_id="bad", schedule=None):
            pass
    """))
    result = _parse_in_fresh_interpreter(dags, tmp_path)
    assert result["events"] == ["psycopg2.connect"]
    assert list(result["errors"]) and "database access at DAG parse time" in next(iter(result["errors"].values()))


def test_dag_files_find_conf_next_to_dags_from_any_directory(tmp_path):
    from tandem.airflow.dags import cluster_yaml

    saved = {k: os.environ.pop(k) for k in ("TANDEM_HOME", "TANDEM_CONF_DIR") if k in os.environ}
    try:
        assert cluster_yaml(DAGS) == PROJECT / "conf" / "cluster.yaml"
    finally:
        os.environ.update(saved)


@pytest.mark.parametrize("text", ["500 ms", "1 second", "2 seconds", "1.5 s", "3m", "1 hour", "2 days", "250 millis",
                                  "10 sec", "7"])
def test_duration_pattern_accepts_what_parse_duration_accepts(text):
    import re

    from tandem.airflow.dags import DURATION_PATTERN

    assert re.match(DURATION_PATTERN, text)
    assert parse_duration(text) > 0


@pytest.mark.parametrize("text", ["soon", "1 fortnight", "-1 s", "1 s 2", ""])
def test_duration_pattern_rejects_what_parse_duration_rejects(text):
    import re

    from tandem.airflow.dags import DURATION_PATTERN

    assert not re.match(DURATION_PATTERN, text)
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(1.0, "1 second"), (2.0, "2 seconds"), (0.5, "500 ms"),
                                               (86400.0, "1 day"), (5400.0, "90 minutes"), (1.25, "1250 ms")])
def test_human_duration_reads_back(seconds, text):
    from tandem.airflow.dags import human_duration

    assert human_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_launch_operator_rejects_a_bad_interval_without_retry():
    from airflow.sdk.exceptions import AirflowFailException

    from tandem.airflow.instance_operators import LaunchPlanInstanceOperator

    operator = LaunchPlanInstanceOperator(task_id="t", plan="trades", node="node-a", instance="shard-1",
                                          trigger_interval="soon")
    with pytest.raises(AirflowFailException, match="Param trigger_interval: expected a duration"):
        operator.execute(context={})


def test_launch_operator_rejects_an_unknown_action_without_retry():
    from airflow.sdk.exceptions import AirflowFailException

    from tandem.airflow.instance_operators import LaunchPlanInstanceOperator

    operator = LaunchPlanInstanceOperator(task_id="t", plan="trades", node="node-a", instance="shard-1",
                                          action="stop")
    with pytest.raises(AirflowFailException, match="Param action: 'stop' is not launch or relaunch"):
        operator.execute(context={})


def test_stop_operator_rejects_a_bad_timeout_without_retry():
    from airflow.sdk.exceptions import AirflowFailException

    from tandem.airflow.instance_operators import StopPlanInstanceOperator

    operator = StopPlanInstanceOperator(task_id="t", plan="trades", node="node-a", instance="shard-1",
                                        stop_timeout="soon")
    with pytest.raises(AirflowFailException, match="Param stop_timeout: expected a duration"):
        operator.execute(context={})
