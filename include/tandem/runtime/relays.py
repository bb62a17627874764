"""The thread that publishes a plan's events outputs to their NATS streams while this instance is ACTIVE.

Every ACTIVE instance of the plan relays every such output (all instances' events: the outbox is the
output's, not the instance's); they cannot store an event twice (:mod:`tandem.outputs.relay`), so no
election is needed, and the output keeps being published while any instance is ACTIVE. A relay that
cannot reach NATS or PostgreSQL tries again on the next round: the events wait in PostgreSQL, and the
queries go on.
"""

from __future__ import annotations

import logging
import threading

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import TandemError
from tandem.messaging.wire import ProtocolError
from tandem.outputs.relay import Relay
from tandem.runtime.roles import RoleController
from tandem.store.db import Database

log = logging.getLogger(__name__)


def published_to_streams(plan: PlanConfig) -> list[str]:
    """The plan's outputs published to a stream, in declaration order."""
    return [name for name, output in plan.outputs.items() if output.stream is not None]


class RelayThread(threading.Thread):
    """Runs :meth:`Relay.publish_pending` for each of the plan's published outputs every ``interval_s`` while
    ``roles`` says ACTIVE; a failing round is logged (once per distinct error) and tried again."""

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig, roles: RoleController, interval_s: float) -> None:
        super().__init__(name=f"tandem-relay-{plan.name}", daemon=True)
        if cluster.nats is None:
            raise ValueError("a plan that publishes to a stream needs the messaging layer")
        self.cluster, self.plan, self.roles, self.interval_s = cluster, plan, roles, interval_s
        self.stopped = threading.Event()
        self.errors: dict[str, str] = {}
        """The error of each output's last round (absent: it went through)."""

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        with Database(self.cluster.database_url, "tandem-relay") as db:
            relays = [Relay(self.plan, output, self.cluster.nats, db) for output in published_to_streams(self.plan)]
            try:
                while not self.stopped.wait(self.interval_s):
                    self._rounds(relays)
                self._rounds(relays)  # what the last batches wrote, before the lease is given up
            finally:
                for relay in relays:
                    relay.close()

    def _rounds(self, relays: list[Relay]) -> None:
        if self.roles.epoch is not None:
            for relay in relays:
                self._round(relay)

    def _round(self, relay: Relay) -> None:
        try:
            stored = relay.publish_pending()
        except (TandemError, ProtocolError, OSError) as exc:
            text = f"{type(exc).__name__}: {exc}"
            if self.errors.get(relay.output) != text:
                log.error("publishing %s to stream %s: %s (trying again every %.1f s)", relay.output, relay.stream,
                          text, self.interval_s)
            self.errors[relay.output] = text
            return
        if self.errors.pop(relay.output, None) is not None:
            log.info("publishing %s to stream %s again", relay.output, relay.stream)
        if stored:
            log.debug("%s: %d events published to stream %s", relay.output, stored, relay.stream)
