"""A broken plan file is isolated (issue 25): the other plans' DAGs, page and status keep working.

A copy of conf/ gets two broken plans beside the three shipped ones: ``broken`` (the trades plan
renamed, with a field no plan has) and ``garbled`` (invalid YAML). The DAG files are parsed with
Airflow's DagBag in-process, the presenter's app is called in-process (fake user and auth manager,
as in test_presenter_app.py), and ``tandem status`` runs in-process over a fresh database.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from tandem.config import load_cluster, load_plans, load_plans_and_errors
from tandem.errors import ConfigError
from tandem.names import OPS_DAG_ID, PLAN_DAG_PURPOSES, RESTORE_DAG_ID, plan_dag_id

DAGS = Path(__file__).resolve().parents[2] / "dags"
GOOD = ("hot_rooms", "pizza_shop", "temperatures", "trades")
BROKEN = ("broken", "garbled")


@pytest.fixture
def broken_conf(conf: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped plans, plus ``broken`` (an unknown field) and ``garbled`` (invalid YAML)."""
    plan = yaml.safe_load((conf / "plans" / "trades.yaml").read_text())
    (conf / "plans" / "broken.yaml").write_text(yaml.safe_dump({**plan, "name": "broken", "colour": "red"}))
    (conf / "plans" / "garbled.yaml").write_text("name: garbled\nstreams: [\n")
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    return conf


def errors_of(conf: Path) -> dict[str, str]:
    plans, broken = load_plans_and_errors(load_cluster(conf / "cluster.yaml"))
    assert sorted(plans) == list(GOOD)
    return {name: str(error) for name, error in broken.items()}


def test_the_good_plans_load_and_each_broken_one_has_its_error_naming_file_and_field(broken_conf: Path) -> None:
    errors = errors_of(broken_conf)
    assert sorted(errors) == list(BROKEN)
    assert errors["broken"].startswith(f"{broken_conf / 'plans' / 'broken.yaml'}: colour: unknown field")
    assert errors["garbled"].startswith(f"{broken_conf / 'plans' / 'garbled.yaml'}: line 3, column 1: invalid YAML")
    with pytest.raises(ConfigError, match=r"broken\.yaml: colour: unknown field"):
        load_plans(load_cluster(broken_conf / "cluster.yaml"))  # strict, for callers that need every plan


def test_landing_retention_deletes_nothing_and_names_the_broken_plan(broken_conf: Path) -> None:
    from tandem.snapshots.landing import clean_plan_landing

    cluster = load_cluster(broken_conf / "cluster.yaml")
    trades = load_plans_and_errors(cluster)[0]["trades"]
    with pytest.raises(ConfigError) as refused:
        clean_plan_landing(cluster, trades, db=object())  # refused before the database is used
    message = str(refused.value)
    assert message.startswith(f"{broken_conf / 'plans' / 'broken.yaml'}: colour: unknown field")
    assert "plan broken is broken: landing retention of trades deletes nothing" in message
    assert "1 more plan(s) broken: garbled" in message


class Recorded(logging.Handler):
    """The records of one logger, whatever handlers Airflow's logging set-up gave the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_dag_files_define_the_good_plans_dags_and_list_the_broken_ones(broken_conf: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    errors = errors_of(broken_conf)
    recorded, logger = Recorded(), logging.getLogger("tandem.airflow.dags")
    logger.addHandler(recorded)
    try:
        bag = DagBag(dag_folder=str(DAGS), safe_mode=False)
    finally:
        logger.removeHandler(recorded)
    assert bag.import_errors == {}
    good = {plan_dag_id(name, purpose) for name in GOOD for purpose in PLAN_DAG_PURPOSES}
    assert set(bag.dag_ids) == good | {OPS_DAG_ID, RESTORE_DAG_ID}
    assert not {plan_dag_id(name, purpose) for name in BROKEN for purpose in PLAN_DAG_PURPOSES} & set(bag.dag_ids)
    for dag_id in (OPS_DAG_ID, RESTORE_DAG_ID):
        dag = bag.dags[dag_id]
        assert "### Broken plans" in dag.doc_md, dag_id
        for error in errors.values():
            assert f"\n    {error}\n" in dag.doc_md, dag_id  # an indented code line: shown literally
        assert dag.params.get_param("plan").schema["enum"] == list(GOOD), dag_id
    logged = [r.getMessage() for r in recorded.records]
    for name, error in errors.items():
        assert f"plan {name} is broken, its DAGs are not defined until its file loads: {error}" in logged


def test_the_ops_docs_have_no_broken_plans_section_when_every_plan_loads() -> None:
    from tandem.airflow.dags import OPS_DOC, with_broken_plans

    assert with_broken_plans(OPS_DOC, {}) == OPS_DOC


class Everyone:
    """An auth manager that lets every user read and trigger every DAG."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        return True


@pytest.fixture
def migrated(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    from tandem.store import Database, migrate

    with Database(database_url) as db:
        migrate(db)
    monkeypatch.setenv("TANDEM_DATABASE_URL", database_url)
    return database_url


def test_the_plan_list_shows_a_broken_plan_with_its_error_and_the_others_are_served(broken_conf: Path,
                                                                                   migrated: str) -> None:
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient
    from tandem.presenter import access
    from tandem.presenter.api import auth_manager, create_app, dag_teams

    errors = errors_of(broken_conf)
    app = create_app()
    app.dependency_overrides[get_user] = lambda: "ann"
    app.dependency_overrides[auth_manager] = Everyone
    app.dependency_overrides[dag_teams] = lambda: access.no_teams
    client = TestClient(app)
    listed = client.get("/api/v1/plans")
    assert listed.status_code == 200, listed.text
    entries = {entry["name"]: entry for entry in listed.json()}
    assert sorted(entries) == sorted(GOOD + BROKEN)
    for name in BROKEN:
        assert entries[name] == {"name": name, "state": "broken", "error": errors[name]}
    for name in GOOD:
        assert entries[name]["state"] == "ok" and entries[name]["nodes"], name
    refused = client.get("/api/v1/plans/broken/status")
    assert refused.status_code == 409
    assert refused.json()["detail"] == f"plan broken is broken: {errors['broken']}"
    status = client.get("/api/v1/plans/trades/status")
    assert status.status_code == 200, status.text
    assert [i["instance"] for i in status.json()["instances"]] == ["shard-1", "shard-2"]


def test_status_shows_the_good_plans_and_a_line_per_broken_plan_with_exit_2(broken_conf: Path, migrated: str,
                                                                          capsys: pytest.CaptureFixture) -> None:
    from tandem.cli import main

    errors = errors_of(broken_conf)
    assert main(["status"]) == 2
    out, err = capsys.readouterr()
    for name in GOOD:
        assert f"{name} / " in out, name
    assert err.splitlines() == [f"error: plan {name} is broken, not shown: {errors[name]}" for name in BROKEN]
    assert main(["status", "trades"]) == 0
    out, err = capsys.readouterr()
    assert "trades / shard-1" in out and "pizza_shop" not in out and err == ""


def test_config_check_still_reports_each_file(broken_conf: Path, capsys: pytest.CaptureFixture) -> None:
    from tandem.cli import main

    errors = errors_of(broken_conf)
    assert main(["config", "check"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: {errors[name]}" for name in BROKEN]
    assert [line for line in out.splitlines() if ": ok: plan " in line] and out.endswith("4 of 6 plan file(s) valid\n")
