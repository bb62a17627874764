"""CLI errors are one literal line on stderr with exit 2, never a traceback or a Rich markup error (issue 9, item 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = {
    "plan name that is Rich markup": (["status", "[/x]"], "[/x]"),
    "plan name over the length limit": (["status", "a" * 300], "a" * 60),
    "the name pattern is shown as written": (["status", "Trades"], "^[a-z0-9][a-z0-9_-]{0,62}$"),
    "bad --since": (["query", "trades", "--since", "lots"], "argument --since"),
    "bad --start": (["query", "trades", "--start", "2026-13-45T00:00:00"], "argument --start"),
    "bad --end": (["query", "trades", "--end", "yesterday"], "argument --end"),
    "bad --duration": (["produce", "trades", "--duration", "forever"], "argument --duration"),
    "unknown granularity": (["query", "trades", "--granularity", "week"], "argument --granularity"),
}


@pytest.mark.parametrize("argv, expected", CASES.values(), ids=CASES.keys())
def test_a_bad_request_is_one_literal_line_and_exit_2(conf: Path, argv: list[str], expected: str) -> None:
    env = {**os.environ, "TANDEM_CONF_DIR": str(conf), "TANDEM_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    done = subprocess.run([sys.executable, "-m", "tandem.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


@pytest.mark.parametrize("argv, expected", [
    (["snapshot", "trades", "--shard", "shard-2"], "shard-2"),
    (["restore", "trades", "--shard", "shard-2"], "shard-2"),
    (["backfill", "trades", "--shard", "shard-1", "--instance", "shard-2"], ["shard-1", "shard-2"]),
    (["backfill", "trades", "--instance", "shard-2"], ["shard-2"]),
    (["run", "--plan", "trades", "--node", "node-a", "--shard", "shard-1"], "shard-1"),
])
def test_shard_is_a_deprecated_alias_of_instance(capsys: pytest.CaptureFixture, argv: list[str], expected) -> None:
    from tandem.cli import build_parser

    assert build_parser().parse_args(argv).instance == expected
    warned = capsys.readouterr().err
    assert ("--shard is deprecated: use --instance" in warned) == ("--shard" in argv), warned
