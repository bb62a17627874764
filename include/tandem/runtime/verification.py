"""A shadow standby's side of an upgrade's verification (issue 48 §2).

A node launched as the shadow of an upgrade under way (:mod:`tandem.supervisor.upgrade`) — the upgrade names
its node and the version it runs — compares each row it trims with the row the ACTIVE (the old version)
published for it (:meth:`tandem.outputs.base.HeldUntilPublished.trim`) and adds the counts to
``upgrade_checks``, where the upgrade reads them.
"""

from __future__ import annotations

import logging

from tandem.store import upgrades
from tandem.store.db import Database
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


class ShadowVerification:
    """Records what this shadow compared, per output, for the upgrade to ``to_version``."""

    def __init__(self, key: InstanceKey, database_url: str, to_version: str) -> None:
        self.key = key
        self.to_version = to_version
        self.db = Database(database_url, "tandem-verification")

    def record(self, output: str, checked: int, differences: list[str]) -> None:
        upgrades.record_check(self.db, self.key.plan, self.key.instance, self.key.node, self.to_version, output,
                              checked, differences)
        if differences:
            log.warning("%s: %d of %d rows differ from what the active published, e.g. %s", output,
                        len(differences), checked, differences[0][:300])


def shadow_verification(db: Database, key: InstanceKey, version: str, database_url: str) -> ShadowVerification | None:
    """The verification this node does, when it is the shadow of an upgrade to ``version`` under way."""
    upgrade = upgrades.current(db, key.plan, key.instance)
    if upgrade is None or upgrade.state != upgrades.VERIFYING or upgrade.shadow_node != key.node \
            or upgrade.to_version != version:
        return None
    log.info("%s: the shadow of the upgrade %s -> %s: comparing with what %s publishes", key.id,
             upgrade.from_version, version, upgrade.from_node)
    return ShadowVerification(key, database_url, version)
