"""Pure parts of Tandem's notifications: which notifier a connection gets, the notices' texts, which supervision
events are notified (once), and the notices task callbacks build."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tandem.airflow.notifications import (
    BACKFILL_DONE,
    BACKFILL_FAILED,
    BLOCKED,
    FAILOVER,
    RECONCILE_DONE,
    SNAPSHOT_FAILED,
    Notice,
    NotifyState,
    TandemNotifier,
    TandemWebhookNotifier,
    choose_notifier,
    notice_from_callback,
    notify_conn_ids,
    redirect_refusal,
    supervision_notices,
    webhook_headers,
    webhook_target,
    webhook_url,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
NOTICE = Notice(FAILOVER, "trades", "shard-1: node-b took over from node-a at epoch 7", instance="shard-1",
                node="node-b", epoch=7, reason="lease expired 3.1 s ago", at=NOW.isoformat(),
                details={"previous_node": "node-a"})


@dataclass
class FakeConnection:
    """What an Airflow connection has, written by hand."""

    conn_id: str
    conn_type: str | None
    host: str | None = None
    schema: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def extra_dejson(self) -> dict[str, Any]:
        return self.extra


def test_the_connection_ids_come_from_the_environment_in_order_without_blanks_or_repeats():
    assert notify_conn_ids({}) == ()
    assert notify_conn_ids({"TANDEM_NOTIFY_CONN_IDS": " ops_hook, ops_mail,,ops_hook "}) == ("ops_hook", "ops_mail")


def test_an_smtp_connection_gets_the_smtp_providers_notifier_with_the_notice_as_subject_and_body():
    conn = FakeConnection("ops_mail", "smtp", host="mail.example.com",
                          extra={"to": "oncall@example.com", "from_email": "tandem@example.com"})
    choice = choose_notifier(conn, NOTICE, {"dag_id": "tandem_trades_supervise"})
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    assert isinstance(choice.notifier, SmtpNotifier) and choice.why == "smtp"
    assert choice.notifier.smtp_conn_id == "ops_mail" and choice.notifier.to == "oncall@example.com"
    assert choice.notifier.from_email == "tandem@example.com"
    assert choice.notifier.subject == "[tandem] trades failover: shard-1: node-b took over from node-a at epoch 7"
    assert "epoch: 7" in choice.notifier.html_content and "airflow dag_id: tandem_trades_supervise" in \
        choice.notifier.html_content


def test_an_smtp_connection_without_recipients_is_not_used_and_says_why():
    choice = choose_notifier(FakeConnection("ops_mail", "smtp", host="mail"), NOTICE)
    assert choice.notifier is None and "'to'" in choice.why and "ops_mail" in choice.why


@pytest.mark.parametrize("conn, url", [
    (FakeConnection("h", "http", host="http://127.0.0.1:8000/hooks/tandem"), "http://127.0.0.1:8000/hooks/tandem"),
    (FakeConnection("h", "http", host="hooks.example.com", schema="https", port=8443, extra={"endpoint": "/t"}),
     "https://hooks.example.com:8443/t"),
    (FakeConnection("h", "https", host="hooks.example.com"), "https://hooks.example.com"),
    (FakeConnection("h", "generic", host="hooks.example.com", port=8443), "https://hooks.example.com:8443"),
    (FakeConnection("h", "http", host="hooks.example.com"), "https://hooks.example.com"),
    (FakeConnection("h", "http", host="127.0.0.1", schema="http", port=8000), "http://127.0.0.1:8000"),
])
def test_a_webhook_connection_posts_to_its_url(conn, url):
    assert webhook_url(conn) == url
    choice = choose_notifier(conn, NOTICE, {"run_id": "r1"})
    assert isinstance(choice.notifier, TandemWebhookNotifier) and choice.notifier.webhook_conn_id == "h"
    assert choice.notifier.payload["event"] == FAILOVER and choice.notifier.payload["airflow"] == {"run_id": "r1"}


@pytest.mark.parametrize("conn, why", [
    (FakeConnection("h", "http"), "no host"),
    (FakeConnection("h", "generic", host="file:///etc/passwd"), "http or https"),
    (FakeConnection("db", "postgres", host="db"), "type 'postgres'"),
    (FakeConnection("x", None, host="x"), "type 'none'"),
])
def test_a_connection_that_cannot_notify_is_left_out_with_the_reason(conn, why):
    choice = choose_notifier(conn, NOTICE)
    assert choice.notifier is None and why in choice.why


@pytest.mark.parametrize("conn_type", ["slack", "slackwebhook"])
def test_a_slack_connection_needs_the_slack_provider(conn_type):
    choice = choose_notifier(FakeConnection("chat", conn_type, password="xoxb-1"), NOTICE)
    if importlib.util.find_spec("airflow.providers.slack") is None:
        assert choice.notifier is None and "apache-airflow-providers-slack" in choice.why
    else:
        assert choice.notifier is not None


def test_the_token_goes_in_a_header_and_never_in_what_a_log_may_show():
    conn = FakeConnection("h", "http", host="https://user:pw@hooks.example.com/T000/secret-path?key=s3",
                          password="tok-123", extra={"headers": {"X-Team": "ops"}})
    assert webhook_headers(conn) == {"Content-Type": "application/json", "User-Agent": "tandem-notifier",
                                     "X-Team": "ops", "Authorization": "Bearer tok-123"}
    target = webhook_target(webhook_url(conn))
    assert target == "https://hooks.example.com"
    assert "Authorization" not in webhook_headers(FakeConnection("h", "http", host="http://x"))


@pytest.mark.parametrize("status, location, says", [
    (302, "http://127.0.0.1:9001/collect?k=s3", "another host or scheme (http://127.0.0.1:9001)"),
    (308, "https://hooks.example.com/t", "another host or scheme (https://hooks.example.com)"),
    (301, "http://hooks.example.com:8080/t", "another host or scheme (http://hooks.example.com:8080)"),
    (307, "/t/", "the same host"),
    (303, "http://HOOKS.example.com:80/other", "the same host"),
])
def test_a_webhook_redirect_is_never_followed_and_the_reason_names_only_where_it_pointed(status, location, says):
    reason = redirect_refusal("http://hooks.example.com/t?key=s3", status, location)
    assert reason.startswith(f"answered HTTP {status}, a redirect to ") and says in reason
    assert "not followed" in reason and "s3" not in reason and "collect" not in reason
    assert redirect_refusal("https://hooks.example.com/t", 302, None) == \
        "answered HTTP 302, a redirect without a Location: not followed"


def test_a_notice_reads_as_text_and_as_json():
    assert NOTICE.subject() == "[tandem] trades failover: shard-1: node-b took over from node-a at epoch 7"
    text = NOTICE.text({"dag_id": "tandem_trades_supervise", "log_url": ""})
    assert text.splitlines()[2:7] == ["plan: trades", "instance: shard-1", "node: node-b", "epoch: 7",
                                      "reason: lease expired 3.1 s ago"]
    assert "previous_node: node-a" in text and "airflow dag_id: tandem_trades_supervise" in text
    assert "log_url" not in text, "empty references are left out"
    payload = NOTICE.payload({"dag_id": "d"})
    assert json.loads(json.dumps(payload)) == payload
    assert {k: payload[k] for k in ("source", "event", "plan", "instance", "node", "epoch", "reason")} == {
        "source": "tandem", "event": "failover", "plan": "trades", "instance": "shard-1", "node": "node-b",
        "epoch": 7, "reason": "lease expired 3.1 s ago"}
    assert payload["details"] == {"previous_node": "node-a"} and payload["airflow"] == {"dag_id": "d"}


def event(id: int, kind: str, instance: str = "shard-1", node: str | None = "node-b", previous: str | None = None,
          epoch: int | None = None, reason: str = "why", ago: timedelta = timedelta(minutes=1)) -> dict[str, Any]:
    return {"id": id, "plan": "trades", "instance": instance, "kind": kind, "node": node, "previous_node": previous,
            "epoch": epoch, "reason": reason, "happened_at": NOW - ago, "detail": {}}


def test_a_takeover_by_another_node_is_a_failover_notified_once():
    events = [event(1, "PROMOTED", node="node-a", epoch=1, reason="lease free"),  # the first start: no failover
              event(2, "DETECTED", node="node-a"),
              event(3, "PROMOTED", node="node-b", previous="node-a", epoch=2, reason="lease expired 3 s ago"),
              event(4, "LAUNCH", node="node-a"),
              event(5, "PROMOTED", node="node-a", previous="node-a", epoch=3)]  # a restart on the same node
    notices, state = supervision_notices("trades", events, NotifyState(), now=NOW, cause="DEAD on node-a")
    assert [(n.event, n.instance, n.node, n.epoch, n.reason) for n in notices] == [
        (FAILOVER, "shard-1", "node-b", 2, "lease expired 3 s ago")]
    assert notices[0].summary == "shard-1: node-b took over from node-a at epoch 2"
    assert notices[0].details == {"kind": "PROMOTED", "event_id": 3, "previous_node": "node-a",
                                  "detected": "DEAD on node-a"}
    assert state.after_id == 5
    again, same = supervision_notices("trades", events, state, now=NOW)
    assert again == [] and same == state, "a poke or a retry later: nothing twice"


def test_a_handover_is_a_failover_and_the_standbys_own_promotion_after_it_is_not():
    events = [event(7, "HANDOVER", node="node-b", previous="node-a", epoch=4, reason="operator: failover now"),
              event(8, "PROMOTED", node="node-b", previous="node-b", epoch=5)]
    notices, _ = supervision_notices("trades", events, NotifyState(after_id=6), now=NOW)
    assert [(n.event, n.summary) for n in notices] == [
        (FAILOVER, "shard-1: the ACTIVE role was handed from node-a to node-b at epoch 4")]


def test_a_blocked_node_is_notified_once_until_it_runs_again():
    first = [event(10, "BLOCK", node="node-b", reason="failed the same way at batch 7 again"),
             event(11, "BLOCKED", node="node-b", reason="BLOCKED: failed at batch 7; restart the node"),
             event(12, "BLOCKED", node=None, instance="shard-2", reason="every node of plan trades is drained")]
    notices, state = supervision_notices("trades", first, NotifyState(after_id=9), now=NOW)
    assert [(n.event, n.instance, n.node) for n in notices] == [(BLOCKED, "shard-1", "node-b"),
                                                               (BLOCKED, "shard-2", None)]
    assert notices[0].summary == "shard-1: node-b is BLOCKED (no relaunch until an operator restarts it)"
    assert state.blocked == {"shard-1/node-b": 10, "shard-2/": 12}
    repeated = [event(13, "BLOCKED", node="node-b"), event(14, "BLOCKED", node=None, instance="shard-2")]
    notices, state = supervision_notices("trades", repeated, state, now=NOW)
    assert notices == [], "the supervisor records BLOCKED at every reconcile: notified once"
    after_restart = [event(15, "RESTARTED", node="node-b"), event(16, "LAUNCH", node="node-a", instance="shard-2"),
                     event(17, "BLOCK", node="node-b", reason="again")]
    notices, state = supervision_notices("trades", after_restart, state, now=NOW)
    assert [(n.instance, n.reason) for n in notices] == [("shard-1", "again")]
    assert state.blocked == {"shard-1/node-b": 17}


def test_without_a_state_only_recent_events_are_notified_and_the_state_starts_after_all_of_them():
    events = [event(1, "PROMOTED", previous="node-a", epoch=2, ago=timedelta(days=3)),
              event(2, "PROMOTED", node="node-a", previous="node-b", epoch=3, ago=timedelta(minutes=5))]
    notices, state = supervision_notices("trades", events, NotifyState(), now=NOW)
    assert [n.epoch for n in notices] == [3] and state.after_id == 2
    assert supervision_notices("trades", [], NotifyState(), now=NOW) == ([], NotifyState())


def test_the_state_round_trips_through_json():
    state = NotifyState(after_id=42, blocked={"shard-1/node-b": 40})
    assert NotifyState.from_json(state.to_json()) == state
    assert NotifyState.from_json(None) == NotifyState()


@dataclass
class FakeTI:
    task_id: str
    xcom: dict[tuple[str, str], Any] = field(default_factory=dict)
    dag_id: str = "tandem_trades_x"
    run_id: str = "manual__1"
    try_number: int = 1

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcom.get((task_ids, key))


@dataclass
class FakeTask:
    task_id: str
    instance: str = ""
    backfill_id: str | None = None
    start: str = ""
    end: str = ""


def callback_context(task: FakeTask, error: BaseException | str | None = None, **xcom: Any) -> dict[str, Any]:
    ti = FakeTI(task.task_id, {tuple(k.split(".")): v for k, v in xcom.items()})
    return {"ti": ti, "task": task, "exception": error}


def test_a_bad_snapshot_notice_names_the_instance_and_the_host():
    task = FakeTask("snapshot_shard-1_on_node-b", instance="shard-1")
    notice = notice_from_callback(SNAPSHOT_FAILED, "trades", callback_context(
        task, "snapshots marked BAD: snapshot 3 of trades/shard-1: BAD (2 expectations failed)"))
    assert (notice.event, notice.instance, notice.node) == (SNAPSHOT_FAILED, "shard-1", "node-b")
    assert notice.summary == "snapshot of shard-1 marked BAD" and "2 expectations failed" in notice.reason


def test_a_failed_backfill_is_told_once_by_the_task_that_knows_why():
    from airflow.sdk.exceptions import AirflowFailException

    register = FakeTask("register", start="2026-12-02T10:00:00Z", end="2026-12-02T13:00:00Z")
    refused = notice_from_callback(BACKFILL_FAILED, "trades", callback_context(
        register, AirflowFailException("the range ends after the slowest instance's watermark")))
    assert refused.summary == "backfill refused" and "watermark" in refused.reason
    assert refused.details["end"] == "2026-12-02T13:00:00Z"
    broken = notice_from_callback(BACKFILL_FAILED, "trades", callback_context(register, OSError("db down")))
    assert broken.summary == "backfill not registered" and broken.reason == "db down"
    nothing_registered = callback_context(FakeTask("report", backfill_id="None"), "no backfill was registered")
    assert notice_from_callback(BACKFILL_FAILED, "trades", nothing_registered) is None
    failed = notice_from_callback(BACKFILL_FAILED, "trades", callback_context(
        FakeTask("report", backfill_id="b-1"), "backfill b-1 of trades: FAILED"))
    assert failed.summary == "backfill b-1 failed"


def test_a_done_backfill_names_the_outputs_it_changed():
    report = {"shard-1": {"trade_aggregates": {"recomputed": True, "seconds_before": 3, "events_before": 10,
                                               "seconds_after": 3, "events_after": 12, "rows_written": 3},
                          "alerts": {"recomputed": True, "rows": 2, "published": 0, "already_published": 2}}}
    context = callback_context(FakeTask("report"), **{"report.return_value": {
        "id": "b-1", "status": "DONE", "report": report, "start": "2026-12-02T10:00:00+00:00",
        "end": "2026-12-02T11:00:00+00:00"}})
    notice = notice_from_callback(BACKFILL_DONE, "trades", context)
    assert notice.summary == ("backfill b-1 DONE (2026-12-02T10:00:00+00:00 .. 2026-12-02T11:00:00+00:00), outputs "
                              "changed: trade_aggregates")
    assert notice.details["report"] == report


def test_a_reconcile_notice_gives_the_counts_and_the_repair():
    context = callback_context(FakeTask("verdict"), **{
        "verdict.return_value": {"run_id": "r", "day": "2026-12-01", "late": 3, "extra": 0, "different": 1},
        "reconcile.repaired": {"backfill_id": "b-9", "status": "DONE", "outputs": ["trade_aggregates"]}})
    notice = notice_from_callback(RECONCILE_DONE, "trades", context)
    assert notice.summary == "reconcile of 2026-12-01: 3 late, 0 extra, 1 different; repaired by backfill b-9 (DONE)"


def test_a_notifier_of_an_unknown_event_is_refused_when_the_dag_is_built():
    with pytest.raises(ValueError, match="unknown notification event 'lunch'"):
        TandemNotifier("lunch", "trades", ["ops"])


def test_dags_get_callbacks_only_when_connections_are_named():
    from tandem.airflow.dags import notify_callbacks

    assert notify_callbacks("trades", failure=SNAPSHOT_FAILED, environ={}) == {}
    callbacks = notify_callbacks("trades", success=BACKFILL_DONE, failure=BACKFILL_FAILED,
                                 environ={"TANDEM_NOTIFY_CONN_IDS": "ops_hook"})
    assert set(callbacks) == {"on_success_callback", "on_failure_callback"}
    [done] = callbacks["on_success_callback"]
    assert (done.event, done.plan, done.conn_ids) == (BACKFILL_DONE, "trades", ("ops_hook",))
