"""Whether the user who triggered a run of ``tandem_ops`` or ``tandem_restore`` may act on the plan it names.

Purpose
    Those two DAGs serve every plan, so Airflow's right to trigger them says nothing about a plan. The Tandem page
    and its API check the plan before they trigger (:func:`tandem.presenter.access.check_action`); a run triggered
    some other way (Airflow's UI form, its REST API, ``airflow dags trigger``, another DAG's task) is checked here,
    inside the run, before it reads or changes anything.

How it works
    Airflow 3 gives a task its run's ``triggering_user_name`` (the REST API's caller; ``airflow dags trigger``'s
    operating-system user; a task-triggered run inherits its parent's). :func:`user_by_name` turns that name into
    the auth manager's user, as the API server would build it from the user's token, and
    :func:`tandem.presenter.access.check_run_action` asks the auth manager what the page asks: may that user
    trigger the plan's supervision DAG, and the DAG of this run. A refusal fails the task without retry.

What it does not do
    It reads the auth manager's configuration where the task runs: a worker needs the API server's
    ``[core] auth_manager`` and its users. Only auth managers whose users a task can look up by name are supported:
    SimpleAuthManager (and its subclasses), or one with a method ``tandem_user_by_name(name)``; with any other
    (FAB's and Keycloak's build users from a session or a token only) every run is refused and says so. A run
    without a triggering user acts for nobody.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.errors import TandemError


class UnknownUsers(TandemError):
    """The auth manager cannot tell a task who a user is from their name."""


def user_by_name(auth: object, name: str) -> object | None:
    """The user called ``name`` as ``auth`` (an Airflow auth manager) would build it for a request of theirs, or
    ``None`` when it has no such user.

    SimpleAuthManager: the user of ``[core] simple_auth_manager_users`` with that name and its role and teams
    (every name is an admin when ``simple_auth_manager_all_admins`` is set, as every request then is).

    Raises:
        UnknownUsers: ``auth`` is neither SimpleAuthManager nor has a ``tandem_user_by_name(name)`` method.
    """
    lookup = getattr(auth, "tandem_user_by_name", None)
    if callable(lookup):
        return lookup(name)
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.configuration import conf

    if not isinstance(auth, SimpleAuthManager):
        raise UnknownUsers(f"Airflow's auth manager {type(auth).__name__} cannot tell a task who {name} is (Tandem "
                           f"asks SimpleAuthManager, or an auth manager with a method tandem_user_by_name)")
    if conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False):
        return SimpleAuthManagerUser(username=name, role="admin")
    return next((user for user in auth.get_users() if user.username == name), None)


def check_triggering_user(log: Any, context: Mapping[str, Any], plan: str, dag_id: str) -> None:
    """Fail the task (``AirflowFailException``, no retry) unless the user who triggered its run may act on ``plan``
    and trigger ``dag_id`` (:func:`tandem.presenter.access.check_run_action`)."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.sdk.exceptions import AirflowFailException

    from tandem.presenter.access import Forbidden, airflow_teams, check_run_action

    name = getattr(context.get("dag_run"), "triggering_user_name", None)
    auth = create_auth_manager()
    try:
        check_run_action(auth, name, user_by_name(auth, name) if name else None, plan, dag_id, airflow_teams)
    except (Forbidden, UnknownUsers) as exc:
        raise AirflowFailException(f"{dag_id} refused: {exc}; nothing was changed") from None
    log.info("%s triggered this run: Airflow lets them act on plan %s", name, plan)
