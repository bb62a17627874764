"""Airflow building blocks for Tandem: operators (and later sensors and triggers), DAG helpers.

Import the submodules (``tandem.airflow.operators``, ``tandem.airflow.dags``); this package
imports nothing from Airflow itself, so the library works where Airflow is not installed.
"""
