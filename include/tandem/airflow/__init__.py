"""Airflow building blocks for Tandem: operators, sensors, triggers, DAG helpers.

Import the submodules (the operators of ``tandem.airflow.instance_operators``, ``.supervision_operators``,
``.snapshot_operators`` and ``.validation_operators``; ``.sensors``, ``.triggers``, ``.dags``);
this package imports nothing from Airflow itself, so the library works where Airflow is not
installed.
"""
