"""Tandem's Airflow UI plugin: the presenter's page and REST endpoints inside Airflow's API server.

``fastapi_apps`` mounts :func:`tandem.presenter.api.create_app` under ``/tandem`` (page at ``/tandem/``,
endpoints under ``/tandem/api/v1``, OpenAPI at ``/tandem/openapi.json``). ``external_views`` adds a
"Tandem" entry to Airflow's navigation that shows the page inside the UI (``/plugin/tandem``): the
page is plain HTML served by the same app, so it needs no JavaScript build, and it is reachable on
its own for a kiosk screen. The app checks Airflow's JWT itself (Airflow does not protect plugin apps).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tandem.presenter.api import create_app

URL_PREFIX = "/tandem"


class TandemUIPlugin(AirflowPlugin):
    name = "tandem_ui"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Tandem presenter"}]
    external_views = [{"name": "Tandem", "href": f"{URL_PREFIX}/", "url_route": "tandem", "destination": "nav",
                       "icon": f"{URL_PREFIX}/icon.svg"}]
