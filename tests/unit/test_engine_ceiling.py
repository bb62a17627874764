"""The engine anchor's ceiling (``bench/engine.py``): the highest Tandem ÷ engine-best the CPU allows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import engine  # noqa: E402


def run(wall_s: float, benchmark: float, postgresql: float = 0.0) -> dict:
    return {"wall_s": wall_s, "cpu_s": {"benchmark": benchmark, "postgresql": postgresql}}


def test_a_saturating_engine_leaves_no_room_for_postgresql() -> None:
    # the engine keeps both cores busy for 40 s; Tandem's PostgreSQL needs 20 CPU s more: 50 s at best
    ceiling = engine.ceiling([run(40, 80)], [run(100, 90, 20)], cores=2)
    assert ceiling["least_tandem_wall_s"] == 50.0
    assert ceiling["engine_ratio_ceiling"] == 0.8
    assert ceiling["engine_cores_busy"] == 2.0


def test_idle_cores_absorb_postgresql_up_to_the_engine_wall() -> None:
    # the engine uses one core of two for 40 s: 20 CPU s of PostgreSQL fit in the other
    ceiling = engine.ceiling([run(40, 40)], [run(100, 90, 20)], cores=2)
    assert ceiling["engine_ratio_ceiling"] == 1.0


def test_the_median_run_of_each_side_counts() -> None:
    ceiling = engine.ceiling([run(40, 80), run(44, 88), run(400, 800)], [run(1, 1, 10), run(1, 1, 12), run(1, 1, 99)],
                             cores=2)
    assert (ceiling["engine_wall_s"], ceiling["engine_cpu_s"], ceiling["tandem_postgresql_cpu_s"]) == (44, 88, 12)
    assert ceiling["engine_ratio_ceiling"] == round(44 / 50, 3)
