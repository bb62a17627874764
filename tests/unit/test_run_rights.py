"""Which user of Airflow's auth manager triggered a run, from the run's ``triggering_user_name``: SimpleAuthManager's
users come from Airflow's configuration (set here through its environment variables), another auth manager answers
through ``tandem_user_by_name`` or not at all."""

from __future__ import annotations

import pytest
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

from tandem.airflow.run_rights import UnknownUsers, user_by_name


def may_trigger(auth: SimpleAuthManager, user: object, dag_id: str) -> bool:
    return auth.is_authorized_dag(method="POST", user=user, access_entity=DagAccessEntity.RUN,
                                  details=DagDetails(id=dag_id))


def test_a_simple_auth_manager_user_is_found_by_name_with_its_role(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,ops:op,view:viewer")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    auth = SimpleAuthManager()
    ops, view = user_by_name(auth, "ops"), user_by_name(auth, "view")
    assert (ops.get_name(), ops.role) == ("ops", "op") and (view.get_name(), view.role) == ("view", "viewer")
    assert may_trigger(auth, ops, "tandem_trades_supervise") and not may_trigger(auth, view, "tandem_trades_supervise")
    assert user_by_name(auth, "root") is None, "an operating-system user (airflow dags trigger) is not Airflow's"


def test_with_simple_auth_manager_all_admins_every_name_is_an_admin(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    user = user_by_name(SimpleAuthManager(), "Anonymous")
    assert (user.get_name(), user.role) == ("Anonymous", "admin")


def test_another_auth_manager_answers_through_its_own_lookup_or_cannot_be_asked():
    class Keyed:
        def tandem_user_by_name(self, name: str) -> object | None:
            return {"ann": "the user ann"}.get(name)

    assert user_by_name(Keyed(), "ann") == "the user ann" and user_by_name(Keyed(), "bob") is None

    class TokenOnly:
        pass

    with pytest.raises(UnknownUsers, match="auth manager TokenOnly cannot tell a task who ann is"):
        user_by_name(TokenOnly(), "ann")
