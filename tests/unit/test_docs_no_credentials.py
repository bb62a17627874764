"""No documented command line carries a credential (issue 46, §5): every user of a host reads every process's
command line (``ps``, ``/proc/<pid>/cmdline``) and a shell keeps what was typed in its history. Pure: reads the
shell blocks of the README, docs/ (every page) and bench/README.md, and the Dockerfile's comments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CREDENTIALS = {
    "a URL with a password": re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/@:'\"]+:[^\s/@'\"]+@"),
    "a password option or parameter": re.compile(r"(--password[=\s]|\bpassword=|PGPASSWORD=)", re.IGNORECASE),
    "a token in a header argument": re.compile(r"-H\s*['\"]?Authorization:", re.IGNORECASE),
    "a token or secret given inline": re.compile(r"\b[A-Z][A-Z0-9_]*(TOKEN|SECRET|PASSWORD|KEY)=(?!\$\(cat\b)\S"),
}


def shell_lines(document: Path) -> list[str]:
    blocks = re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", document.read_text(), re.DOTALL)
    return [line for block in blocks for line in block.splitlines()]


def dockerfile_lines() -> list[str]:
    return [line.lstrip("# ") for line in (REPO / "Dockerfile").read_text().splitlines()
            if line.startswith(("#", "RUN", "CMD", "ENTRYPOINT"))]


@pytest.mark.parametrize("source", [*DOCUMENTS, REPO / "Dockerfile"], ids=lambda path: path.relative_to(REPO).as_posix())
def test_no_documented_command_line_carries_a_credential(source: Path) -> None:
    lines = dockerfile_lines() if source.name == "Dockerfile" else shell_lines(source)
    found = [f"{what}: {line.strip()}" for line in lines for what, pattern in CREDENTIALS.items()
             if pattern.search(line)]
    assert found == []


def test_the_check_finds_what_it_is_for() -> None:
    for line in ("  -e TANDEM_DATABASE_URL=postgresql://user:password@db-host:5432/tandem \\",
                 "curl -H 'Authorization: Bearer eyJhbGci' http://127.0.0.1:8080/api/v2/dags",
                 "TANDEM_RECEIVER_TOKEN=s3cret tandem receive", "psql --password=x", "PGPASSWORD=x psql"):
        assert any(pattern.search(line) for pattern in CREDENTIALS.values()), line
    for line in ("api() { printf 'Authorization: Bearer %s\\n' \"$TOKEN\" | curl -s -H @- \"$@\"; }",
                 "export TANDEM_AIRFLOW_DB_URL=postgresql+psycopg2://airflow@pg.example:5432/airflow",
                 "-e AIRFLOW__API_AUTH__JWT_SECRET -e TANDEM_DATABASE_URL \\"):
        assert not any(pattern.search(line) for pattern in CREDENTIALS.values()), line
