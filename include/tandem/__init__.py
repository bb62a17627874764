"""Tandem: highly available stream processing on Airflow, Spark, Delta and PostgreSQL."""

__version__ = "0.1.0"
