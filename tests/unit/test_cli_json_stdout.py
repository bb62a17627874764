"""What the CLI prints where: a command's own output on stdout, alone; logs on stderr; tables as wide as the
terminal or ``COLUMNS`` says."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from tandem import cli


def test_a_json_answer_is_alone_on_stdout_when_a_library_logs_to_stdout(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Airflow, imported in the middle of a command (``tandem launch``), sets up a log handler on ``sys.stdout``:
    its lines went before the JSON answer (issue: a script's ``json.load`` failed)."""
    root = logging.getLogger()

    def command(args) -> int:
        handler = logging.StreamHandler(sys.stdout)  # what Airflow's configure_logging does at import
        root.addHandler(handler)
        try:
            logging.getLogger("tandem.supervisor.launcher").warning("instance x: launching")
            print("a library's stray print")
            cli.emit(json.dumps({"instance_id": "trades/shard-1/node-a"}))
        finally:
            root.removeHandler(handler)
        return 0

    monkeypatch.setattr(cli, "cmd_stop", command)
    assert cli.main(["stop", "trades", "shard-1", "node-a", "--json"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out) == {"instance_id": "trades/shard-1/node-a"}
    assert "instance x: launching" in shown.err and "a library's stray print" in shown.err


def test_the_stdout_is_given_back_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    before = sys.stdout
    monkeypatch.setattr(cli, "cmd_stop", lambda args: 0)
    assert cli.main(["stop", "trades", "shard-1", "node-a"]) == 0
    assert sys.stdout is before and cli.STDOUT.stream is None


@pytest.mark.parametrize("is_terminal, environ, expected", [
    (True, {}, None),  # Rich measures the terminal
    (True, {"COLUMNS": "200"}, None),  # Rich reads COLUMNS itself
    (False, {"COLUMNS": "200"}, None),  # a pipe with COLUMNS: Rich's width is COLUMNS (was cut at 120)
    (False, {}, cli.PIPE_WIDTH),
    (False, {"COLUMNS": "wide"}, cli.PIPE_WIDTH),
])
def test_the_output_width_honours_columns(is_terminal: bool, environ: dict[str, str], expected: int | None) -> None:
    assert cli.output_width(is_terminal, environ) == expected


def test_a_console_in_a_pipe_is_as_wide_as_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setenv("COLUMNS", "200")
    assert Console(file=cli.CommandStdout(), width=cli.output_width(False, {"COLUMNS": "200"})).width == 200
