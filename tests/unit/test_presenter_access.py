"""Who may read which plan: the presenter asks Airflow's auth manager per plan (a hand-written fake here).

SimpleAuthManager, which the e2e tests run, cannot say "may read plan A but not plan B" (its roles
read every DAG or none): the per-plan filtering is tested here, against a fake that can.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from tandem.presenter.access import (Forbidden, authority_dag_id, check_action, check_run_action, check_trigger,
                                    plan_for_reader, readable_plans)
from tandem.presenter.views import NotFound

PLANS = {"pizza_shop": "pizza plan", "temperatures": "temperatures plan", "trades": "trades plan"}


@dataclass
class FakeAuthManager:
    """Allows what ``grants`` lists: (method, dag id) pairs, with the DAG's team when one is given."""

    grants: set[tuple[str, str]]
    team_members: set[str] = field(default_factory=set)
    asked: list[tuple[str, str | None, str | None, object]] = field(default_factory=list)

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        self.asked.append((method, details.id if details else None, details.team_name if details else None,
                           access_entity))
        if details and details.team_name and details.team_name not in self.team_members:
            return False
        return (method, details.id if details else None) in self.grants


@dataclass
class FakeUser:
    name: str

    def get_name(self) -> str:
        return self.name


def test_a_plan_is_read_as_its_supervision_dag() -> None:
    assert authority_dag_id("trades") == "tandem_trades_supervise"


def test_the_plan_list_keeps_only_the_plans_whose_dag_the_user_may_read() -> None:
    auth = FakeAuthManager({("GET", "tandem_pizza_shop_supervise"), ("GET", "tandem_trades_supervise")})
    assert list(readable_plans(auth, FakeUser("ann"), PLANS)) == ["pizza_shop", "trades"]
    assert {(method, dag) for method, dag, _team, _entity in auth.asked} == {
        ("GET", authority_dag_id(name)) for name in PLANS}
    assert readable_plans(FakeAuthManager(set()), FakeUser("bob"), PLANS) == {}


def test_one_plan_is_served_only_to_a_reader_of_its_dag() -> None:
    auth = FakeAuthManager({("GET", "tandem_trades_supervise")})
    assert plan_for_reader(auth, FakeUser("ann"), PLANS, "trades") == "trades plan"
    with pytest.raises(Forbidden, match="ann may not read plan pizza_shop .*tandem_pizza_shop_supervise"):
        plan_for_reader(auth, FakeUser("ann"), PLANS, "pizza_shop")


def test_an_unknown_plan_names_only_the_plans_the_user_may_read() -> None:
    auth = FakeAuthManager({("GET", "tandem_trades_supervise")})
    with pytest.raises(NotFound, match=r"no plan 'nope' \(plans you may read: trades\)"):
        plan_for_reader(auth, FakeUser("ann"), PLANS, "nope")
    with pytest.raises(NotFound, match="may read: none"):
        plan_for_reader(FakeAuthManager(set()), FakeUser("bob"), PLANS, "nope")


def test_in_multi_team_mode_the_dag_team_goes_to_the_auth_manager() -> None:
    teams = {"tandem_trades_supervise": "desk", "tandem_pizza_shop_supervise": "kitchen"}
    auth = FakeAuthManager({("GET", authority_dag_id(name)) for name in PLANS}, team_members={"desk"})
    readable = readable_plans(auth, FakeUser("ann"), PLANS, teams_of=lambda ids: {i: teams.get(i) for i in ids})
    assert list(readable) == ["temperatures", "trades"]
    assert ("GET", "tandem_trades_supervise", "desk", None) in auth.asked


def test_an_action_needs_the_right_to_trigger_its_dag() -> None:
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    auth = FakeAuthManager({("POST", "tandem_ops")})
    check_trigger(auth, FakeUser("ops"), "tandem_ops")
    assert auth.asked[-1] == ("POST", "tandem_ops", None, DagAccessEntity.RUN)
    with pytest.raises(Forbidden, match="ops may not trigger tandem_restore"):
        check_trigger(auth, FakeUser("ops"), "tandem_restore")


def test_an_action_on_a_plan_needs_the_right_to_trigger_that_plans_dag_and_the_carrying_dag() -> None:
    """Per plan: the right to trigger ``tandem_ops`` is not the right to act on every plan through the page."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    auth = FakeAuthManager({("POST", "tandem_ops"), ("POST", "tandem_trades_supervise")})
    check_action(auth, FakeUser("ops"), "trades", "tandem_ops")
    assert [(method, dag, entity) for method, dag, _team, entity in auth.asked] == [
        ("POST", "tandem_trades_supervise", DagAccessEntity.RUN), ("POST", "tandem_ops", DagAccessEntity.RUN)]
    with pytest.raises(Forbidden, match=r"^ops may not act on plan pizza_shop \(Airflow denies triggering its DAG "
                                        r"tandem_pizza_shop_supervise\)$"):
        check_action(auth, FakeUser("ops"), "pizza_shop", "tandem_ops")
    with pytest.raises(Forbidden, match="ops may not trigger tandem_restore"):
        check_action(auth, FakeUser("ops"), "trades", "tandem_restore")


def test_in_multi_team_mode_an_action_asks_with_the_plans_team() -> None:
    teams = {"tandem_trades_supervise": "desk", "tandem_ops": None}
    auth = FakeAuthManager({("POST", "tandem_ops"), ("POST", "tandem_trades_supervise")}, team_members={"kitchen"})
    with pytest.raises(Forbidden, match="may not act on plan trades"):
        check_action(auth, FakeUser("cook"), "trades", "tandem_ops", teams_of=lambda ids: {i: teams.get(i) for i in ids})
    assert auth.asked[0][:3] == ("POST", "tandem_trades_supervise", "desk")


def test_a_run_of_a_dag_over_every_plan_acts_only_for_a_triggering_user_who_may_act_on_its_plan() -> None:
    """``tandem_ops`` triggered directly (Airflow's UI, REST API or CLI) asks inside the run what the page asks."""
    ops = FakeUser("ops")
    auth = FakeAuthManager({("POST", "tandem_ops"), ("POST", "tandem_trades_supervise")})
    check_run_action(auth, "ops", ops, "trades", "tandem_ops")
    assert [dag for _method, dag, _team, _entity in auth.asked] == ["tandem_trades_supervise", "tandem_ops"]
    with pytest.raises(Forbidden, match=r"^ops may not act on plan pizza_shop \(Airflow denies triggering its DAG "
                                        r"tandem_pizza_shop_supervise\)$"):
        check_run_action(auth, "ops", ops, "pizza_shop", "tandem_ops")
    with pytest.raises(Forbidden, match="ops may not trigger tandem_restore"):
        check_run_action(auth, "ops", ops, "trades", "tandem_restore")
    asked = len(auth.asked)
    with pytest.raises(Forbidden, match=r"^root, who triggered this run of tandem_ops, is not a user of Airflow's "
                                        r"auth manager, so nobody may act on plan trades for them$"):
        check_run_action(auth, "root", None, "trades", "tandem_ops")
    for nobody in (None, ""):
        with pytest.raises(Forbidden, match="^this run of tandem_restore has no triggering user, and tandem_restore "
                                            "acts on plan trades only for a user Airflow lets act on it"):
            check_run_action(auth, nobody, ops, "trades", "tandem_restore")
    assert len(auth.asked) == asked, "without a known user the auth manager is not asked"
