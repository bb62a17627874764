"""Role names and DAG ids are spelled in one place, tandem.names (pure)."""

from __future__ import annotations

import io
import re
import tokenize
import typing
from pathlib import Path

import pytest

from tandem.names import OPS_DAG_ID, PLAN_DAG_PURPOSES, RESTORE_DAG_ID, ROLES, plan_dag_id
from tandem.presenter.models import Role

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("include", "dags", "plugins", "jobs")
DAG_ID_TEXT = re.compile(r"tandem_\{[^}]*\}_(" + "|".join(PLAN_DAG_PURPOSES) + r")\b")


def test_plan_dag_ids() -> None:
    assert [plan_dag_id("trades", p) for p in PLAN_DAG_PURPOSES] == [
        "tandem_trades_run", "tandem_trades_supervise", "tandem_trades_snapshot", "tandem_trades_maintenance",
        "tandem_trades_validate", "tandem_trades_backfill", "tandem_trades_reconcile"]
    with pytest.raises(ValueError, match="has no 'ops' DAG"):
        plan_dag_id("trades", "ops")


def test_the_api_schema_names_the_same_roles() -> None:
    assert typing.get_args(Role) == ROLES  # a schema's Literal spells its values; it must spell these


def spellings(path: Path) -> list[str]:
    """The string literals of ``path`` that spell a role name or build a DAG id by hand."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type != tokenize.STRING:
            continue
        text = token.string
        value = text.strip("rbfuRBFU").strip("\"'")
        if value in ROLES or value in (OPS_DAG_ID, RESTORE_DAG_ID) or DAG_ID_TEXT.search(text):
            found.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {text}")
    return found


def test_no_module_spells_a_role_or_a_dag_id_but_names() -> None:
    own = {ROOT / "include/tandem/names.py", ROOT / "include/tandem/presenter/models.py"}
    files = [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py")) if p not in own]
    assert len(files) > 50
    assert [s for p in files for s in spellings(p)] == []
