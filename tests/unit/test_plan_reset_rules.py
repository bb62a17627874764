"""When ``tandem plan reset`` counts a plan as running, and what it would remove (pure, or a temp folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan
from tandem.layout import plan_dirs
from tandem.plan_reset import folder_size, output_streams, running_reasons

TIMEOUTS = {"heartbeat_timeout_s": 3.0, "launch_timeout_s": 120.0}


def instance(status: str, *, beat: float | None = None, launched: float | None = None, here: bool = True,
             alive: bool = False) -> dict:
    return {"instance_id": "p/g-1/node-a", "status": status, "host": "h1", "beat_age_s": beat,
            "launched_age_s": launched, "recorded_here": here, "process_alive": alive}


def lease(valid: bool, left_s: float = 4.25) -> dict:
    return {"instance": "g-1", "holder": "node-a", "epoch": 3, "valid": valid, "left_s": left_s}


@pytest.mark.parametrize(("row", "reason"), [
    (instance("RUNNING", beat=0.5, alive=True), "p/g-1/node-a is RUNNING: its process runs on this host"),
    (instance("RUNNING", beat=1.5), "p/g-1/node-a is RUNNING: its driver beat 1.5s ago on host h1"),  # `tandem run`
    (instance("STARTING", beat=0.2, here=False), "p/g-1/node-a is STARTING: its driver beat 0.2s ago on host h1"),
    (instance("LAUNCHING", launched=10.0, here=False), "p/g-1/node-a is LAUNCHING: launched 10.0s ago on host h1"),
])
def test_an_instance_runs_while_its_process_lives_or_its_driver_beats(row, reason) -> None:
    assert running_reasons([row], [], **TIMEOUTS) == [reason]


@pytest.mark.parametrize("row", [
    instance("STOPPED", beat=0.5),                       # it ended: a beat of its last moments does not count
    instance("FAILED"),
    instance("BLOCKED"),
    instance("RUNNING", beat=3.5),                       # killed: its beat is older than the heartbeat timeout
    instance("LAUNCHING", launched=10.0, here=True),     # launched here, spark-submit gone
    instance("LAUNCHING", launched=121.0, here=False),   # launched elsewhere, never came up
])
def test_an_instance_that_ended_or_died_does_not_run(row) -> None:
    assert running_reasons([row], [lease(False, -3600.0)], **TIMEOUTS) == []


def test_a_valid_lease_runs_whatever_the_instance_rows_say() -> None:
    assert running_reasons([instance("STOPPED")], [lease(True)], **TIMEOUTS) == [
        "node-a holds the lease of instance g-1 (epoch 3, 4.2s left)"]


def test_the_plan_folders_are_its_own_and_their_size_is_counted(conf: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "data"))
    cluster = load_cluster(conf / "cluster.yaml")
    folders = plan_dirs(cluster, "trades")
    assert folders == {name: tmp_path / "data" / name / "trades" for name in ("checkpoints", "delta", "snapshots",
                                                                             "backfills", "cuts")}
    (folders["delta"] / "t").mkdir(parents=True)
    (folders["delta"] / "t" / "a").write_bytes(b"x" * 10)
    (folders["delta"] / "b").write_bytes(b"y" * 5)
    assert folder_size(folders["delta"]) == (2, 15) and folder_size(folders["snapshots"]) == (0, 0)


def test_the_nats_streams_removed_are_those_the_plans_outputs_publish_to(conf: Path, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_NATS_URL", "nats://127.0.0.1:4222")
    cluster = load_cluster(conf / "cluster.yaml")
    assert output_streams(load_plan("hot_rooms", cluster)) == {"hot": "hot_readings"}  # not temps: its input
    assert output_streams(load_plan("trades", cluster)) == {}
