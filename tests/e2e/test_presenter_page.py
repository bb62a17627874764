"""The Tandem page in the Airflow UI, in headless Chromium (Debian's, driven by Playwright's client).

A hot pair of the trades plan runs (node-a ACTIVE, node-b PASSIVE) beside a real Airflow stack. The
test logs into Airflow, opens the Tandem entry of the navigation and sees both nodes; kill -9 of the
active: the page shows node-b as the holder at the next epoch and the PROMOTED event within 10 s of
the kill; with node-a back as PASSIVE, "Failover now" (a tandem_ops run triggered as the logged-in
user) moves the epoch again. Screenshots of each step are kept in the test's tmp dir.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from _ha import Pair, configure_one_shard, lease, wait_for
from tandem.airflow_rest import admin_password
from tandem.config import load_cluster, load_plan
from tandem.packaging import build_dist

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"
SHARD = "shard-1"
PAGE_UPDATE_S = 10


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


def test_page_follows_a_kill_and_fails_over_on_request(project: Path, database_url: str, process_groups: list[int],
                                                        airflow, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    configure_one_shard(project, "hot")
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    pair = Pair(cluster, plan, build_dist(project), process_groups, shard=SHARD)
    pair.start_pair("node-a", "node-b")
    shots = tmp_path / "screenshots"
    shots.mkdir()

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{airflow.base_url}/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(admin_password(tmp_path / "airflow" / "simple_auth_manager_passwords.json"))
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="Tandem").click()  # the plugin's entry in Airflow's navigation
    page.wait_for_url("**/plugin/tandem")
    tandem = page.frame_locator("iframe").first
    tandem.get_by_role("button", name="trades").click()
    expect(tandem.get_by_test_id(f"node-{SHARD}-node-a")).to_be_visible(timeout=30_000)
    expect(tandem.get_by_test_id(f"node-{SHARD}-node-b")).to_be_visible()
    before = lease(pair.url, "trades", SHARD)
    expect(tandem.get_by_test_id(f"holder-{SHARD}")).to_have_text("node-a", timeout=30_000)
    expect(tandem.get_by_test_id(f"epoch-{SHARD}")).to_have_text(str(before["epoch"]))
    page.screenshot(path=shots / "1-pair.png", full_page=True)

    killed = pair.kill("node-a", signal.SIGKILL)
    expect(tandem.get_by_test_id(f"holder-{SHARD}")).to_have_text("node-b", timeout=PAGE_UPDATE_S * 1000)
    promoted = lease(pair.url, "trades", SHARD)
    assert promoted["holder"] == "node-b" and promoted["epoch"] > before["epoch"]
    expect(tandem.get_by_test_id(f"epoch-{SHARD}")).to_have_text(str(promoted["epoch"]))
    expect(tandem.get_by_test_id(f"last-failover-{SHARD}")).to_contain_text("PROMOTED node-b (from node-a)")
    shown_after_s = time.time() - killed
    assert shown_after_s <= PAGE_UPDATE_S
    pair.note(f"the page showed node-b at epoch {promoted['epoch']} {shown_after_s:.1f} s after the kill")
    page.screenshot(path=shots / "2-after-kill.png", full_page=True)

    pair.wait_group_gone("node-a")
    pair.launch("node-a", "PASSIVE")
    pair.wait_running("node-a")
    expect(tandem.get_by_test_id(f"node-{SHARD}-node-a")).to_be_visible()
    tandem.get_by_test_id(f"failover-{SHARD}").click()
    expect(tandem.get_by_test_id("action-run")).to_contain_text("tandem_ops run", timeout=30_000)
    expect(tandem.get_by_test_id(f"holder-{SHARD}")).to_have_text("node-a", timeout=180_000)
    moved = lease(pair.url, "trades", SHARD)
    assert moved["holder"] == "node-a" and moved["epoch"] > promoted["epoch"]
    expect(tandem.get_by_test_id(f"epoch-{SHARD}")).to_have_text(str(moved["epoch"]))
    page.screenshot(path=shots / "3-after-failover-now.png", full_page=True)
    run = airflow.runs("tandem_ops")[0]
    assert run["conf"]["action"] == "failover_now" and run["triggering_user_name"] == "admin"
    wait_for(lambda: airflow.run_state("tandem_ops", run["dag_run_id"]) == "success", 120, "the tandem_ops run")
