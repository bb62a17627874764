"""Who may read which plan, and who may act on it: Airflow's auth manager decides.

Purpose:
    The presenter serves a plan's status, events and outputs to the users Airflow lets see that
    plan, and nobody else. Airflow knows no "plan": a plan's reads are authorised as reads of the
    plan's own DAG, its supervision DAG ``tandem_<plan>_supervise``, so an operator grants or
    denies a plan the same way as the DAG that runs it (roles, teams, a custom auth manager).

How it works:
    :func:`readable_plans` asks the auth manager ``is_authorized_dag(method="GET")`` for each
    plan's DAG and keeps the plans it allows; :func:`plan_for_reader` does the same for one plan
    and raises :class:`Forbidden` (403) when it is denied, or :class:`~tandem.presenter.views.NotFound`
    naming only the plans the user may read. An action on a plan is authorised per plan, like a read:
    :func:`check_action` asks for the right to trigger (``POST`` on the DAG runs of) the plan's own
    supervision DAG — acting on a plan is doing what its supervisor does — and then for the right to
    trigger the DAG that carries the action out (``tandem_ops``, ``tandem_restore``, or the plan's
    backfill DAG), which Airflow checks again when the caller's token triggers it. In multi-team mode
    the DAG's team goes into :class:`DagDetails`, as Airflow's own endpoints do.

    The runs of ``tandem_ops`` and ``tandem_restore`` serve every plan, so their tasks ask the same
    of the user who triggered them, however they did (:func:`check_run_action`, from
    :mod:`tandem.airflow.run_rights`): a direct trigger acts on no plan its user may not act on.

What it does not do:
    It does not authenticate (Airflow's ``get_user`` dependency does, before any of this) and it
    keeps no permission of its own: every decision is the auth manager's, on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

from tandem.errors import TandemError
from tandem.names import plan_dag_id
from tandem.presenter.views import NotFound

P = TypeVar("P")
TeamsOf = Callable[[Iterable[str]], Mapping[str, str | None]]
"""The team of each DAG id (multi-team mode), ``{}`` when Airflow runs without teams."""


class Forbidden(TandemError):
    """The user is logged in but Airflow's auth manager denies what was asked."""


class DagAuthority(Protocol):
    """The part of Airflow's ``BaseAuthManager`` the presenter asks."""

    def is_authorized_dag(self, *, method: str, user: object, access_entity: DagAccessEntity | None = None,
                          details: DagDetails | None = None) -> bool: ...


def authority_dag_id(plan: str) -> str:
    """The DAG whose permissions stand for ``plan``'s: its supervision DAG (read it to read the plan, trigger it to
    act on the plan)."""
    return plan_dag_id(plan, "supervise")


def no_teams(dag_ids: Iterable[str]) -> Mapping[str, str | None]:
    return {}


def airflow_teams(dag_ids: Iterable[str]) -> Mapping[str, str | None]:
    """Airflow's team of each DAG in multi-team mode (one metadata query), else ``{}``."""
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return {}
    from airflow.models.dag import DagModel

    return DagModel.get_dag_id_to_team_name_mapping(list(dag_ids))


def user_name(user: object) -> str:
    name = getattr(user, "get_name", None)
    return name() if callable(name) else str(user)


def readable_plans(auth: DagAuthority, user: object, plans: Mapping[str, P], teams_of: TeamsOf = no_teams) -> dict[str, P]:
    """The plans of ``plans`` (in their order) whose DAG ``user`` may read."""
    teams = teams_of([authority_dag_id(name) for name in plans])
    return {name: plan for name, plan in plans.items()
            if auth.is_authorized_dag(method="GET", user=user,
                                      details=DagDetails(id=authority_dag_id(name), team_name=teams.get(authority_dag_id(name))))}


def plan_for_reader(auth: DagAuthority, user: object, plans: Mapping[str, P], name: str,
                    teams_of: TeamsOf = no_teams) -> P:
    """The plan ``name`` if ``user`` may read it.

    Raises:
        NotFound: there is no such plan (the message names only the plans the user may read).
        Forbidden: there is, and Airflow denies the user a read of its DAG.
    """
    if name not in plans:
        readable = readable_plans(auth, user, plans, teams_of)
        raise NotFound(f"no plan {name!r} (plans you may read: {', '.join(readable) or 'none'})")
    dag_id = authority_dag_id(name)
    team = teams_of([dag_id]).get(dag_id)
    if not auth.is_authorized_dag(method="GET", user=user, details=DagDetails(id=dag_id, team_name=team)):
        raise Forbidden(f"{user_name(user)} may not read plan {name} (Airflow denies reading its DAG {dag_id})")
    return plans[name]


def _may_trigger(auth: DagAuthority, user: object, dag_id: str, teams_of: TeamsOf) -> bool:
    team = teams_of([dag_id]).get(dag_id)
    return auth.is_authorized_dag(method="POST", user=user, access_entity=DagAccessEntity.RUN,
                                  details=DagDetails(id=dag_id, team_name=team))


def check_trigger(auth: DagAuthority, user: object, dag_id: str, teams_of: TeamsOf = no_teams) -> None:
    """Raise :class:`Forbidden` unless ``user`` may trigger a run of ``dag_id``."""
    if not _may_trigger(auth, user, dag_id, teams_of):
        raise Forbidden(f"{user_name(user)} may not trigger {dag_id} (read-only user)")


def check_action(auth: DagAuthority, user: object, plan: str, dag_id: str, teams_of: TeamsOf = no_teams) -> None:
    """Raise :class:`Forbidden` unless ``user`` may act on ``plan`` (trigger its supervision DAG) and trigger
    ``dag_id``, the DAG that carries the action out."""
    own = authority_dag_id(plan)
    if not _may_trigger(auth, user, own, teams_of):
        raise Forbidden(f"{user_name(user)} may not act on plan {plan} (Airflow denies triggering its DAG {own})")
    if dag_id != own:
        check_trigger(auth, user, dag_id, teams_of)


def check_run_action(auth: DagAuthority, triggered_by: str | None, user: object | None, plan: str, dag_id: str,
                     teams_of: TeamsOf = no_teams) -> None:
    """Raise :class:`Forbidden` unless the user who triggered a run of ``dag_id`` may act on ``plan`` and trigger
    ``dag_id`` (:func:`check_action`): ``triggered_by`` is the run's ``triggering_user_name``, ``user`` the auth
    manager's user of that name (``None``: it knows none). A run without a triggering user acts for nobody."""
    if not triggered_by:
        raise Forbidden(f"this run of {dag_id} has no triggering user, and {dag_id} acts on plan {plan} only for a "
                        f"user Airflow lets act on it: trigger it as that user (the Tandem page, Airflow's UI or "
                        f"REST API)")
    if user is None:
        raise Forbidden(f"{triggered_by}, who triggered this run of {dag_id}, is not a user of Airflow's auth "
                        f"manager, so nobody may act on plan {plan} for them")
    check_action(auth, user, plan, dag_id, teams_of)
