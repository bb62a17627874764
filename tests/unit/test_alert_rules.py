"""conf/prometheus/tandem-rules.yml: valid for Prometheus, each alert tested by ``promtool test rules`` (the test file
holds the series and the alerts expected), and no rule reads a metric the exporter does not serve."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tandem.monitoring.catalog import BY_NAME

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "conf" / "prometheus" / "tandem-rules.yml"
RULE_TESTS = ROOT / "tests" / "support" / "data" / "prometheus" / "tandem_rules_test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_and_reads_exported_metrics() -> None:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert {rule["alert"] for rule in rules} == tested
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        for name in re.findall(r"\btandem_[a-z_]+\b", rule["expr"]):
            assert name in BY_NAME, f"{rule['alert']} reads {name}, which the exporter does not serve"
