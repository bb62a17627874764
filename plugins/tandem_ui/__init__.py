"""Tandem's Airflow UI plugin (placeholder: the page and its REST endpoints come with the UI issue)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class TandemUIPlugin(AirflowPlugin):
    name = "tandem_ui"
