"""Airflow building blocks for Tandem: operators, sensors, triggers, DAG helpers.

Import the submodules (``tandem.airflow.operators``, ``.sensors``, ``.triggers``, ``.dags``);
this package imports nothing from Airflow itself, so the library works where Airflow is not
installed.
"""
