"""Tandem's notifications through Airflow's notifier interface: failovers, BLOCKED instances, snapshot failures,
backfill and reconcile results.

Purpose
    Tell an operator, by mail or a webhook (or Slack where its provider is installed), what Tandem did or could
    not do, through the Airflow connections they name.

How it works
    The environment variable ``TANDEM_NOTIFY_CONN_IDS`` (comma-separated connection ids, read where the DAGs are
    built: :func:`notify_conn_ids`) names the connections. Each connection's type picks its notifier when a
    notice is sent (:func:`choose_notifier`; nothing is read at DAG parse time): ``smtp`` the SMTP provider's
    ``SmtpNotifier`` (``to`` and optionally ``from_email`` in its extra), ``http`` / ``https`` / ``generic``
    :class:`TandemWebhookNotifier` (JSON POSTed to the connection's URL, its password as a bearer token),
    ``slack`` / ``slackwebhook`` the Slack provider's notifiers when that provider is installed.

    - Snapshot failures, backfill and reconcile results: task callbacks (:class:`TandemNotifier`, built by
      :func:`tandem.airflow.dags.notify_callbacks`) of the tasks that end those runs.
    - Failovers and BLOCKED instances: the supervision DAG's ``ensure`` and ``react`` tasks read the plan's new
      ``tandem.failover_events`` (:func:`notify_supervision_events`); the id of the last event seen is kept in the
      Airflow Variable ``tandem_notified_<plan>`` (:func:`supervision_notices` decides, pure), so a failover is
      notified once, whatever the sensor's pokes and the tasks' retries.

What it does not do
    A notifier that fails is logged and never fails the task (at most once: the Variable moves on before sending).
    An operator's own action from ``tandem_ops`` (a handover) is notified by the next supervision task (the start
    of the next supervision run at the latest). No connection's password or token is ever logged.
"""

from __future__ import annotations

import html
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from airflow.sdk import BaseNotifier

NOTIFY_ENV = "TANDEM_NOTIFY_CONN_IDS"
"""The environment variable naming the Airflow connections to notify (comma-separated ids)."""
FAILOVER, BLOCKED = "failover", "blocked"
SNAPSHOT_FAILED = "snapshot_failed"
BACKFILL_DONE, BACKFILL_FAILED = "backfill_done", "backfill_failed"
RECONCILE_DONE, RECONCILE_FAILED = "reconcile_done", "reconcile_failed"
EVENTS = (FAILOVER, BLOCKED, SNAPSHOT_FAILED, BACKFILL_DONE, BACKFILL_FAILED, RECONCILE_DONE, RECONCILE_FAILED)
"""The ``event`` of every notice."""
WEBHOOK_TYPES = ("http", "https", "generic")
SMTP_TYPES = ("smtp", "email")
TEXT_LIMIT = 2000
"""Longest reason or error text a notice carries."""
REPAIR_TASK_ID = "reconcile"
"""The reconcile DAG's Spark task, whose XCom ``repaired`` names the repair's backfill."""
FIRST_WINDOW = timedelta(hours=1)
"""Before any supervision event was notified (no Variable yet): how far back events are notified."""
EVENTS_READ = 500
"""How many of a plan's newest supervision events one notification pass reads."""
CLEARS_BLOCK = ("LAUNCH", "RESTARTED", "UNDRAINED", "PROMOTED", "HANDOVER")
"""Events after which a node (or its instance) notified as blocked is notified again when it is blocked again."""


def notify_conn_ids(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The connection ids ``TANDEM_NOTIFY_CONN_IDS`` names, in order, without blanks or repeats."""
    text = (os.environ if environ is None else environ).get(NOTIFY_ENV, "")
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def _text(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 1] + "…"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class Notice:
    """One thing to tell the operator: what happened (``event``, one of :data:`EVENTS`) to which plan, where, why."""

    event: str
    plan: str
    summary: str
    instance: str | None = None
    node: str | None = None
    epoch: int | None = None
    reason: str = ""
    at: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def subject(self) -> str:
        """A mail subject or a chat message's first line."""
        return f"[tandem] {self.plan} {self.event.replace('_', ' ')}: {self.summary}"

    def text(self, refs: Mapping[str, Any] | None = None) -> str:
        """The notice as plain text: the subject, then one ``name: value`` line per field and detail."""
        lines = [self.subject(), ""]
        for name in ("plan", "instance", "node", "epoch", "reason", "at"):
            value = getattr(self, name)
            if value not in (None, ""):
                lines.append(f"{name}: {value}")
        for name, value in self.details.items():
            lines.append(f"{name}: {value if isinstance(value, str) else json.dumps(value, default=str)}")
        for name, value in (refs or {}).items():
            if value not in (None, ""):
                lines.append(f"airflow {name}: {value}")
        return "\n".join(lines)

    def payload(self, refs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON a webhook receives: ``source: tandem``, the fields, ``details`` and ``airflow`` (dag, run, task,
        log URL)."""
        return _jsonable({"source": "tandem", **asdict(self), "details": dict(self.details),
                          "airflow": dict(refs or {})})


def context_refs(context: Mapping[str, Any]) -> dict[str, Any]:
    """Where a notice came from in Airflow: DAG, run, task, try and the task log's URL (whatever the context has)."""
    ti = context.get("ti")
    if ti is None:
        return {}
    refs = {name: getattr(ti, name, None) for name in ("dag_id", "run_id", "task_id", "try_number")}
    try:
        refs["log_url"] = ti.log_url
    except Exception:  # noqa: BLE001 - a context without Airflow's configuration: no URL
        pass
    return {k: v for k, v in refs.items() if v is not None}


# --- choosing a notifier per connection ------------------------------------------------------------------------


class ConnectionLike(Protocol):
    """What :func:`choose_notifier` reads of an Airflow connection (``airflow.sdk.Connection`` has it)."""

    conn_id: str
    conn_type: str | None
    host: str | None
    schema: str | None
    port: int | None
    password: str | None

    @property
    def extra_dejson(self) -> dict: ...


@dataclass(frozen=True)
class Choice:
    """The notifier a connection gets for a notice, or ``None`` and why not."""

    notifier: BaseNotifier | None
    why: str


def webhook_url(conn: ConnectionLike) -> str:
    """The URL a webhook connection posts to: its host when it is a URL, else ``<schema or https>://host[:port]``;
    then the extra's ``endpoint``. Only http and https; plain http only when spelled out (pure).

    Raises:
        ValueError: no host, or another scheme.
    """
    host = (conn.host or "").strip()
    if not host:
        raise ValueError(f"connection {conn.conn_id}: no host (the webhook's URL)")
    if "://" in host:
        url = host
    else:
        url = f"{conn.schema or 'https'}://{host}" + (f":{conn.port}" if conn.port else "")
    endpoint = str((conn.extra_dejson or {}).get("endpoint") or "")
    if endpoint:
        url = url.rstrip("/") + "/" + endpoint.lstrip("/")
    if urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https"):
        raise ValueError(f"connection {conn.conn_id}: a webhook URL must be http or https")
    return url


def webhook_headers(conn: ConnectionLike) -> dict[str, str]:
    """The request headers of a webhook connection: JSON, the extra's ``headers``, and the password as a bearer
    token (never log them)."""
    headers = {"Content-Type": "application/json", "User-Agent": "tandem-notifier"}
    headers.update({str(k): str(v) for k, v in ((conn.extra_dejson or {}).get("headers") or {}).items()})
    if conn.password:
        headers["Authorization"] = f"Bearer {conn.password}"
    return headers


def webhook_target(url: str) -> str:
    """What a log may say of a webhook URL: its scheme, host and port (a path or query may hold a secret)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def redirect_refusal(url: str, status: int, location: str | None) -> str:
    """Why a webhook's redirect (``status`` with ``location``, relative or absolute) of a POST to ``url`` is not
    followed (pure). None is: to another host or scheme it would carry the bearer token (and the notice) where the
    connection does not point; a 301/302/303 turns the POST into a GET without the notice, and a 307/308 means the
    connection's URL is not the webhook's own. The reason names the target's scheme, host and port only."""
    if not location:
        return f"answered HTTP {status}, a redirect without a Location: not followed"
    target = urllib.parse.urljoin(url, location)
    where = "the same host" if _origin(target) == _origin(url) else "another host or scheme"
    return (f"answered HTTP {status}, a redirect to {where} ({webhook_target(target)}): not followed (the token "
            f"goes to the connection's URL only); set the connection's URL to the webhook's final one")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Hands every redirect back as the answer (an ``HTTPError``) instead of following it."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, msg, headers, fp)


def choose_notifier(conn: ConnectionLike, notice: Notice, refs: Mapping[str, Any] | None = None) -> Choice:
    """The notifier of ``notice`` through ``conn``, picked by the connection's type (pure but for the providers'
    imports): smtp → ``SmtpNotifier``, http / https / generic → :class:`TandemWebhookNotifier`, slack /
    slackwebhook → the Slack provider's notifier when it is installed."""
    kind = (conn.conn_type or "").lower()
    extra = conn.extra_dejson or {}
    if kind in SMTP_TYPES:
        if not extra.get("to"):
            return Choice(None, f"the smtp connection {conn.conn_id} has no 'to' (addresses) in its extra")
        try:
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier
        except ImportError:
            return Choice(None, "the SMTP provider (apache-airflow-providers-smtp) is not installed")
        body = f"<pre>{html.escape(notice.text(refs))}</pre>"
        return Choice(SmtpNotifier(to=extra["to"], from_email=extra.get("from_email"), subject=notice.subject(),
                                   html_content=body, smtp_conn_id=conn.conn_id), "smtp")
    if kind in WEBHOOK_TYPES:
        try:
            webhook_url(conn)
        except ValueError as exc:
            return Choice(None, str(exc))
        return Choice(TandemWebhookNotifier(webhook_conn_id=conn.conn_id, payload=notice.payload(refs)), "webhook")
    if kind in ("slack", "slackwebhook"):
        try:
            if kind == "slack":
                from airflow.providers.slack.notifications.slack import SlackNotifier

                channel = {"channel": extra["channel"]} if extra.get("channel") else {}
                return Choice(SlackNotifier(slack_conn_id=conn.conn_id, text=notice.text(refs), **channel), "slack")
            from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

            return Choice(SlackWebhookNotifier(slack_webhook_conn_id=conn.conn_id, text=notice.text(refs)),
                          "slack webhook")
        except ImportError:
            return Choice(None, f"the Slack provider (apache-airflow-providers-slack) is not installed: connection "
                                f"{conn.conn_id} ({kind}) cannot be notified")
    return Choice(None, f"connection {conn.conn_id} is of type {kind or 'none'!r}: Tandem notifies smtp, http, "
                        f"https, generic, slack and slackwebhook connections")


class WebhookError(Exception):
    """A webhook did not take a notification (its message names the connection and host, never the token)."""


class TandemWebhookNotifier(BaseNotifier):
    """POST a JSON notification to the URL of an Airflow connection (type http, https or generic).

    The URL is the connection's host (a whole URL, or a host with ``schema`` (default https) and ``port``) and the
    extra's ``endpoint``; its password, when set, goes as ``Authorization: Bearer <password>``; the extra's
    ``headers`` are added. A redirect is never followed: it is a failed delivery (:func:`redirect_refusal`).
    Usable as any notifier, e.g. ``on_failure_callback=TandemWebhookNotifier(webhook_conn_id="ops")``: without a
    ``payload`` it posts the DAG, run, task and error of the callback's context.

    :param webhook_conn_id: the Airflow connection.
    :param payload: the JSON to post (default: from the context).
    :param timeout_s: how long the POST may take.
    """

    template_fields = ()

    def __init__(self, *, webhook_conn_id: str, payload: Mapping[str, Any] | None = None,
                 timeout_s: float = 10.0) -> None:
        super().__init__()
        self.webhook_conn_id = webhook_conn_id
        self.payload = payload
        self.timeout_s = timeout_s

    def notify(self, context: Mapping[str, Any]) -> None:
        from airflow.sdk import Connection

        conn = Connection.get(self.webhook_conn_id)
        url = webhook_url(conn)
        payload = dict(self.payload) if self.payload is not None else {
            "source": "airflow", "airflow": context_refs(context), "error": _text(context.get("exception")) or None}
        request = urllib.request.Request(url, data=json.dumps(payload, default=str).encode(), method="POST",
                                         headers=webhook_headers(conn))
        target = webhook_target(url)
        try:
            with urllib.request.build_opener(_NoRedirects).open(request, timeout=self.timeout_s) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            exc.close()
            answer = (redirect_refusal(url, exc.code, (exc.headers or {}).get("Location")) if 300 <= exc.code < 400
                      else f"answered HTTP {exc.code}")
            raise WebhookError(f"the webhook of connection {self.webhook_conn_id} ({target}) {answer}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise WebhookError(f"the webhook of connection {self.webhook_conn_id} ({target}) is unreachable: "
                               f"{type(reason).__name__}") from None
        self.log.info("posted %s to the webhook of connection %s (%s): HTTP %s",
                      payload.get("event", "a notification"), self.webhook_conn_id, target, status)


def send_notice(notice: Notice, conn_ids: Sequence[str], context: Mapping[str, Any], log: Any) -> list[str]:
    """Send ``notice`` through each connection (best effort: a missing connection, an unusable type or a failed
    send is logged); the connection ids it went through."""
    from airflow.sdk import Connection

    refs = context_refs(context)
    sent = []
    for conn_id in conn_ids:
        try:
            conn = Connection.get(conn_id)
        except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException, a secrets backend down
            log.warning("notification %s not sent: connection %s: %s", notice.event, conn_id, type(exc).__name__)
            continue
        choice = choose_notifier(conn, notice, refs)
        if choice.notifier is None:
            log.warning("notification %s not sent through %s: %s", notice.event, conn_id, choice.why)
            continue
        try:
            choice.notifier.notify(dict(context))
        except Exception as exc:  # noqa: BLE001 - a notification never fails the task
            log.warning("notification %s through %s (%s) failed: %s: %s", notice.event, conn_id, choice.why,
                        type(exc).__name__, _text(exc)[:300])
            continue
        log.info("notified %s (%s) through %s (%s)", notice.event, notice.summary, conn_id, choice.why)
        sent.append(conn_id)
    return sent


# --- notices of task callbacks: snapshots, backfills, reconciles ----------------------------------------------


def _pull(ti: Any, task_id: str, key: str = "return_value") -> Any:
    try:
        return ti.xcom_pull(task_ids=task_id, key=key)
    except Exception:  # noqa: BLE001 - a notice goes out without it
        return None


def notice_from_callback(event: str, plan: str, context: Mapping[str, Any]) -> Notice | None:
    """The notice of a task callback's context (``ti``, ``task``, ``exception``, XComs); ``None`` when another
    task's callback tells it (a backfill's report after its register failed)."""
    ti, task = context.get("ti"), context.get("task")
    task_id = getattr(ti, "task_id", "") or getattr(task, "task_id", "")
    error = _text(context.get("exception"))
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if event == SNAPSHOT_FAILED:
        instance = getattr(task, "instance", None)
        host = task_id.rsplit("_on_", 1)[1] if "_on_" in task_id else None
        what = "marked BAD" if error.startswith("snapshots marked BAD") else "failed"
        return Notice(event, plan, f"snapshot of {instance} {what}", instance=instance, node=host, reason=error,
                      at=at, details={"task": task_id})
    if event == BACKFILL_FAILED:
        backfill_id = getattr(task, "backfill_id", None)
        if backfill_id is not None and str(backfill_id) in ("", "None"):
            return None  # nothing was registered: the register task's own notice said why
        details = {k: getattr(task, k) for k in ("start", "end") if getattr(task, k, None)}
        refused = type(context.get("exception")).__name__ == "AirflowFailException"
        summary = (f"backfill {backfill_id} failed" if backfill_id else
                   "backfill refused" if refused else "backfill not registered")
        return Notice(event, plan, summary, instance=getattr(task, "instance", None) or None, reason=error, at=at,
                      details={**details, "task": task_id})
    if event == BACKFILL_DONE:
        from tandem.airflow.assets import backfill_changes

        result = _pull(ti, task_id) or {}
        changed = sorted(backfill_changes(result.get("report") or {}, backfill_id=result.get("id", ""),
                                          start=result.get("start", ""), end=result.get("end", "")))
        summary = (f"backfill {result.get('id')} {result.get('status', 'DONE')} ({result.get('start')} .. "
                   f"{result.get('end')}), outputs changed: {', '.join(changed) or 'none'}")
        return Notice(event, plan, summary, at=at, details={"backfill_id": result.get("id"), "outputs_changed": changed,
                                                            "report": result.get("report") or {}})
    if event == RECONCILE_DONE:
        result = _pull(ti, task_id) or {}
        repaired = _pull(ti, REPAIR_TASK_ID, "repaired")
        counts = {k: result[k] for k in ("late", "extra", "different") if k in result}
        summary = f"reconcile of {result.get('day', '?')}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
        if repaired:
            summary += f"; repaired by backfill {repaired.get('backfill_id')} ({repaired.get('status')})"
        return Notice(event, plan, summary, at=at, details={"run_id": result.get("run_id"), "day": result.get("day"),
                                                            **counts, "repaired": repaired})
    if event == RECONCILE_FAILED:
        return Notice(event, plan, f"reconcile failed in task {task_id}", reason=error, at=at,
                      details={"task": task_id, "day": _pull(ti, "day")})
    raise ValueError(f"no callback notice for event {event!r}")


class TandemNotifier(BaseNotifier):
    """A task callback that sends one kind of Tandem notice through the named connections.

    The connections are resolved when the callback runs (never at DAG parse time); each one's type picks the
    notifier (:func:`choose_notifier`).

    :param event: one of :data:`EVENTS` that callbacks send (snapshot, backfill, reconcile).
    :param plan: the plan the DAG runs for.
    :param conn_ids: the Airflow connections to notify.
    """

    template_fields = ()

    def __init__(self, event: str, plan: str, conn_ids: Sequence[str]) -> None:
        super().__init__()
        if event not in EVENTS:
            raise ValueError(f"unknown notification event {event!r} (expected one of {', '.join(EVENTS)})")
        self.event = event
        self.plan = plan
        self.conn_ids = tuple(conn_ids)

    def notify(self, context: Mapping[str, Any]) -> None:
        notice = notice_from_callback(self.event, self.plan, context)
        if notice is None:
            self.log.info("no %s notice for this task: another task's notice tells it", self.event)
            return
        send_notice(notice, self.conn_ids, context, self.log)


# --- notices of the supervisor: failovers and BLOCKED instances ----------------------------------------------


@dataclass(frozen=True)
class NotifyState:
    """What the supervision notifications of a plan have seen: the last ``failover_events`` id, and the
    (instance, node) pairs notified as blocked (``"<instance>/<node>"``, ``"<instance>/"`` for the whole instance)."""

    after_id: int | None = None
    blocked: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str | None) -> "NotifyState":
        if not text:
            return cls()
        data = json.loads(text)
        return cls(data.get("after_id"), dict(data.get("blocked") or {}))

    def to_json(self) -> str:
        return json.dumps({"after_id": self.after_id, "blocked": dict(self.blocked)}, sort_keys=True)


def state_key(plan: str) -> str:
    """The Airflow Variable that holds a plan's :class:`NotifyState`."""
    return f"tandem_notified_{plan}"


def _event_notice(plan: str, event: Mapping[str, Any], cause: str) -> Notice | None:
    kind, node, previous = event["kind"], event.get("node"), event.get("previous_node")
    instance = event["instance"]
    at = event["happened_at"].isoformat() if isinstance(event.get("happened_at"), datetime) else \
        str(event.get("happened_at") or "")
    details: dict[str, Any] = {"kind": kind, "event_id": event["id"]}
    if previous:
        details["previous_node"] = previous
    if cause:
        details["detected"] = cause
    if kind == "PROMOTED" and previous and previous != node:
        summary = f"{instance}: {node} took over from {previous} at epoch {event.get('epoch')}"
    elif kind == "HANDOVER":
        summary = f"{instance}: the ACTIVE role was handed from {previous} to {node} at epoch {event.get('epoch')}"
    elif kind == "BLOCK":
        summary = f"{instance}: {node} is BLOCKED (no relaunch until an operator restarts it)"
    elif kind == "BLOCKED":
        summary = f"{instance}: the supervisor is blocked{' on ' + node if node else ''}: an operator must look"
    else:
        return None
    return Notice(FAILOVER if kind in ("PROMOTED", "HANDOVER") else BLOCKED, plan, summary, instance=instance,
                  node=node, epoch=event.get("epoch"), reason=_text(event.get("reason")), at=at, details=details)


def supervision_notices(plan: str, events: Sequence[Mapping[str, Any]], state: NotifyState, *, now: datetime,
                        cause: str = "", first_window: timedelta = FIRST_WINDOW) -> tuple[list[Notice], NotifyState]:
    """The notices of a plan's supervision events not notified yet, and the state after them (pure).

    A failover is a PROMOTED event whose node differs from the one before, or a HANDOVER: notified once (events
    after ``state.after_id``). A BLOCK or BLOCKED event is notified once per (instance, node) until the node is
    launched, restarted or takes the lease again (the supervisor records BLOCKED at every reconcile). Without a
    state, only events of the last ``first_window`` are notified.

    Args:
        events: ``tandem.failover_events`` rows (``id``, ``instance``, ``kind``, ``node``, ``previous_node``,
            ``epoch``, ``reason``, ``happened_at``), in any order.
        cause: what the supervision task detected, added to the notices' details.
    """
    ordered = sorted(events, key=lambda e: e["id"])
    if state.after_id is None:
        fresh = [e for e in ordered if e.get("happened_at") is None or e["happened_at"] >= now - first_window]
    else:
        fresh = [e for e in ordered if e["id"] > state.after_id]
    blocked = dict(state.blocked)
    notices = []
    for event in fresh:
        instance, node = event["instance"], event.get("node") or ""
        if event["kind"] in CLEARS_BLOCK:
            blocked.pop(f"{instance}/{node}", None)
            blocked.pop(f"{instance}/", None)
        elif event["kind"] in ("BLOCK", "BLOCKED"):
            if f"{instance}/{node}" in blocked:
                continue
            blocked[f"{instance}/{node}"] = event["id"]
        notice = _event_notice(plan, event, cause)
        if notice is not None:
            notices.append(notice)
    seen = [e["id"] for e in ordered] + ([state.after_id] if state.after_id is not None else [])
    return notices, NotifyState(max(seen) if seen else None, blocked)


def notify_supervision_events(log: Any, db: Any, plan: str, conn_ids: Sequence[str], context: Mapping[str, Any], *,
                              cause: str = "") -> list[Notice]:
    """Notify a plan's failovers and BLOCKED instances recorded since the last call (see
    :func:`supervision_notices`); the state moves on before sending (at most once). Never raises."""
    if not conn_ids:
        return []
    try:
        from airflow.sdk import Variable

        from tandem.store.leases import recent_events

        state = NotifyState.from_json(Variable.get(state_key(plan), default=None))
        events = recent_events(db, plan, None, EVENTS_READ)
        oldest = min((e["id"] for e in events), default=0)
        if state.after_id is not None and len(events) == EVENTS_READ and oldest > state.after_id + 1:
            log.warning("more than %d supervision events of %s since the last notification: older ones are not "
                        "notified", EVENTS_READ, plan)
        notices, after = supervision_notices(plan, events, state, now=datetime.now(timezone.utc), cause=cause)
        if after != state:
            Variable.set(state_key(plan), after.to_json())
    except Exception as exc:  # noqa: BLE001 - notifying never fails supervision
        log.warning("supervision notifications of %s skipped: %s: %s", plan, type(exc).__name__, _text(exc)[:300])
        return []
    for notice in notices:
        send_notice(notice, conn_ids, context, log)
    return notices
