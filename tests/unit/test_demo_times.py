"""The demo's closing table counts the set-up's steps only when ``make demo`` ran them just before it."""

from __future__ import annotations

import os
from pathlib import Path

from tandem.demo import setup_times


def write_times(root: Path, text: str, written_ns: int) -> None:
    path = root / ".tandem" / "setup-times.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, ns=(written_ns, written_ns))


def test_the_steps_of_a_set_up_written_after_make_started_are_read_in_order(tmp_path: Path) -> None:
    write_times(tmp_path, "Java 17 check\t0.120\nPython dependencies\t14.500\nAirflow home, .tandem/env.sh\t6.000\n",
                2_000_000_000_000_000_000)
    assert setup_times(tmp_path, "1999999999000000000") == [
        ("Java 17 check", 0.12), ("Python dependencies", 14.5), ("Airflow home, .tandem/env.sh", 6.0)]


def test_an_older_file_no_make_or_a_line_without_seconds_is_not_counted(tmp_path: Path) -> None:
    write_times(tmp_path, "virtualenv\t3.000\nbroken line\nPostgreSQL\tx\n", 1_000_000_000_000_000_000)
    assert setup_times(tmp_path, "1000000000000000001") == []       # written before make started: another run's
    assert setup_times(tmp_path, None) == []                        # `tandem demo` alone
    assert setup_times(tmp_path, "not a time") == []
    assert setup_times(tmp_path, "999999999999999999") == [("virtualenv", 3.0)]
    assert setup_times(tmp_path / "elsewhere", "1") == []           # no file
