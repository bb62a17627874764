"""A private Airflow stack (API server, scheduler, triggerer, DAG processor) for end-to-end tests, and a
headless Chromium (Debian's, driven by Playwright's client: no browser download)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _airflow import airflow_stack as _airflow_stack

from tandem.airflow_rest import AirflowClient


@pytest.fixture
def airflow(project: Path, tmp_path: Path) -> Iterator[AirflowClient]:
    """A private Airflow stack in a temp home, over the temp project's configuration."""
    with _airflow_stack(tmp_path / "airflow") as client:
        yield client


@pytest.fixture
def airflow_stack():
    """``airflow_stack(home, extra_env)``: a context manager for tests that start the stack themselves."""
    return _airflow_stack


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test-tools` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()
