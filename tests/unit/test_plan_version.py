"""A plan's version: its YAML, its module and Tandem's version, and nothing else (tandem.plan_version)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tandem.config import load_cluster, load_plan
from tandem.plan_version import VERSION_LENGTH, module_source, plan_version

BUNDLED = Path(__file__).resolve().parents[2] / "include" / "tandem" / "plans" / "trades.py"


def test_the_version_follows_the_yaml_and_the_module_and_nothing_else(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    plan = load_plan("trades", cluster)
    first = plan_version(plan)
    assert len(first) == VERSION_LENGTH and int(first, 16) >= 0
    assert module_source(plan) == BUNDLED.read_bytes()  # the bundled module, found without importing it
    assert plan_version(load_plan("trades", cluster)) == first  # loading again changes nothing
    yaml = conf / "plans" / "trades.yaml"
    yaml.write_text(yaml.read_text() + "# a comment\n")
    edited = plan_version(load_plan("trades", cluster))
    assert edited != first
    beside = conf / "plans" / "trades.py"  # a module beside the YAML is the plan's module
    beside.write_bytes(BUNDLED.read_bytes())
    assert module_source(plan) == BUNDLED.read_bytes() and plan_version(plan) == edited
    beside.write_bytes(BUNDLED.read_bytes() + b"\n# refactored\n")
    assert plan_version(plan) not in (first, edited)


def test_a_module_in_a_zip_is_read_without_importing_pyspark(tmp_path: Path) -> None:
    """As a driver that imports Tandem from the packaged zip finds it; the status computes versions too."""
    archive = tmp_path / "tandem.zip"
    include = BUNDLED.parents[2]
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted((include / "tandem").rglob("*.py")):
            zipped.write(path, path.relative_to(include))
    script = (f"import sys; sys.path.insert(0, {str(archive)!r})\n"
              "import tandem; assert tandem.__file__.startswith(sys.path[0]), tandem.__file__\n"
              "from tandem.config import load_cluster, load_plan\n"
              "from tandem.plan_version import module_source, plan_version\n"
              "plan = load_plan('trades', load_cluster())\n"
              f"assert module_source(plan) == open({str(BUNDLED)!r}, 'rb').read()\n"
              "print(plan_version(plan), 'pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=BUNDLED.parents[3]).stdout.split()
    assert out == [plan_version(load_plan("trades", load_cluster())), "False"]
