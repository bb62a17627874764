"""The thread that publishes a plan's events outputs to their NATS streams while this instance is ACTIVE.

Every ACTIVE instance of the plan relays every such output (all instances' events: the outbox is the
output's, not the instance's); they cannot store an event twice (:mod:`tandem.outputs.relay`), so no
election is needed, and the output keeps being published while any instance is ACTIVE.

It never dies silently: any error of a round (NATS or PostgreSQL out of reach, a stream that cannot say
how far publishing got, a malformed header, anything unexpected) is caught, logged once per distinct
error, recorded for the instance (``plan_instances.relay_error``: ``tandem status`` and the Tandem page
show it), and the output is tried again after a back-off that doubles from the round interval up to
:data:`MAX_BACKOFF_S`. The events wait in PostgreSQL meanwhile, and the queries go on. The record is
cleared once every output goes through again, when the instance is no longer ACTIVE, and when the thread
stops. An event no message can carry (over the server's ``max_payload``) goes to the plan's quarantine.
"""

from __future__ import annotations

import logging
import threading
import time

from tandem.config import ClusterConfig, PlanConfig, quarantine_output
from tandem.errors import TandemError
from tandem.layout import delta_table_dir
from tandem.messaging.wire import ProtocolError
from tandem.outputs.relay import Relay, RelayQuarantine
from tandem.runtime.roles import RoleController
from tandem.store.db import Database
from tandem.store.heartbeats import record_relay_error

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0
"""The longest wait between two tries of an output whose rounds keep failing."""
EXPECTED_ERRORS = (TandemError, ProtocolError, OSError)
"""Errors a relay expects now and then (logged without a traceback); any other is logged with one."""


def published_to_streams(plan: PlanConfig) -> list[str]:
    """The plan's outputs published to a stream, in declaration order."""
    return [name for name, output in plan.outputs.items() if output.stream is not None]


class RelayThread(threading.Thread):
    """Runs :meth:`Relay.publish_pending` for each of the plan's published outputs every ``interval_s`` while
    ``roles`` says ACTIVE; a failing output is recorded and tried again with back-off (see the module)."""

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig, roles: RoleController, interval_s: float, *,
                 max_backoff_s: float = MAX_BACKOFF_S) -> None:
        super().__init__(name=f"tandem-relay-{plan.name}", daemon=True)
        if cluster.nats is None:
            raise ValueError("a plan that publishes to a stream needs the messaging layer")
        self.cluster, self.plan, self.roles, self.interval_s = cluster, plan, roles, interval_s
        self.max_backoff_s = max(max_backoff_s, interval_s)
        self.stopped = threading.Event()
        self.errors: dict[str, str] = {}
        """The error of each output's last round (absent: it went through)."""
        self.failures: dict[str, int] = {}
        """How many rounds in a row of each output failed."""
        self._due: dict[str, float] = {}
        self._recorded: str | None = None
        self._db = Database(cluster.database_url, "tandem-relay")  # lazy: connects when first used
        self._relays: dict[str, Relay] = {}

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        try:
            self._record(force=True)  # an error left by an earlier run of this instance
            while not self.stopped.wait(self.interval_s):
                self._rounds()
            self._rounds(final=True)  # what the last batches wrote, before the lease is given up
        finally:
            for relay in self._relays.values():
                relay.close()
            self.errors.clear()
            self._record()
            self._db.close()

    def _rounds(self, final: bool = False) -> None:
        if self.roles.epoch is None:
            self.errors.clear()  # a standby relays nothing: nothing of it fails
        else:
            now = time.monotonic()
            for output in published_to_streams(self.plan):
                if final or self._due.get(output, 0.0) <= now:
                    self._round(output)
        self._record()

    def _round(self, output: str) -> None:
        relay = self._relays.get(output)
        try:
            if relay is None:
                quarantine = RelayQuarantine(
                    delta_table_dir(self.cluster, self.plan.name, quarantine_output(self.plan)), self.roles.instance,
                    self._db, lambda: self.roles.epoch)
                relay = self._relays[output] = Relay(self.plan, output, self.cluster.nats, self._db, quarantine)
            stored = relay.publish_pending()
        except Exception as exc:  # noqa: BLE001 - recorded, shown and tried again: the relay never dies
            self._failed(output, relay, exc)
            return
        self.failures.pop(output, None)
        self._due.pop(output, None)
        if self.errors.pop(output, None) is not None:
            log.info("publishing %s to stream %s again", output, relay.stream)
        if stored:
            log.debug("%s: %d events published to stream %s", output, stored, relay.stream)

    def _failed(self, output: str, relay: Relay | None, exc: Exception) -> None:
        if relay is not None:
            relay.close()  # a broken or half-read connection: a new one next time
        failures = self.failures[output] = self.failures.get(output, 0) + 1
        wait_s = min(self.interval_s * 2 ** min(failures - 1, 30), self.max_backoff_s)
        self._due[output] = time.monotonic() + wait_s
        text = f"{type(exc).__name__}: {exc}"
        if self.errors.get(output) != text:
            log.error("publishing %s to stream %s: %s (trying again with back-off, now in %.1f s)", output,
                      self.plan.outputs[output].stream, text, wait_s,
                      exc_info=not isinstance(exc, EXPECTED_ERRORS))
        self.errors[output] = text

    def error_text(self) -> str | None:
        """What is recorded for the instance: each failing output and its error (``None``: none fails)."""
        if not self.errors:
            return None
        return "; ".join(f"{output} -> NATS stream {self.plan.outputs[output].stream}: {text}"
                         for output, text in sorted(self.errors.items()))

    def _record(self, force: bool = False) -> None:
        text = self.error_text()
        if text == self._recorded and not force:
            return
        try:
            record_relay_error(self._db, self.roles.instance.id, text)
        except Exception as exc:  # noqa: BLE001 - PostgreSQL may be what fails: logged, recorded on a later round
            log.warning("cannot record the relay's error for %s: %s: %s", self.roles.instance.id,
                        type(exc).__name__, exc)
            return
        self._recorded = text
