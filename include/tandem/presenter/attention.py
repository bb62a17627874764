"""What about one group instance the Tandem page (and ``tandem status``) points out, and how loudly (pure).

Three levels:

========= ============================================================================================================
alarm     red: something is wrong and may need a person: a node DEAD, FAILED, BLOCKED or STALLED (input waits, nothing
          is read: it lags), its relay to NATS failing, or no ACTIVE while the instance should run (the lease lost:
          expired, or released otherwise than by a clean stop)
pending   yellow: the supervisor has something to do for an instance that runs (a standby to launch, ...)
note      grey: how things are, nothing wrong: a node stopped cleanly (at an operator's request, by a supervisor), and
          what the supervisor would do for an instance that was stopped (it does it only while its DAG runs)
========= ============================================================================================================

An instance is *stopped* when no node runs it any more and every node that ran it ended cleanly (STOPPED; none
FAILED or BLOCKED, none still recorded as running): its vacant lease and its due launches are then no alarm.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.presenter.models import LeaseState, NodeState, Notice

ALARM = "alarm"
PENDING = "pending"
NOTE = "note"

ALARMING_HEALTH = ("DEAD", "FAILED", "BLOCKED", "STALLED")
"""Health states that are an alarm whatever else holds (STALLED: input waits and nothing reads it, the node lags)."""
FAILED_STATUSES = ("FAILED", "BLOCKED")


def is_stopped(nodes: Sequence[NodeState]) -> bool:
    """No node runs the instance and at least one ran it and ended cleanly (STOPPED), none with a failure."""
    statuses = [node.status for node in nodes]
    return "STOPPED" in statuses and all(status in (None, "STOPPED") for status in statuses)


def notices(nodes: Sequence[NodeState], lease: LeaseState | None, due: Sequence[str]) -> list[Notice]:
    """What to point out about one instance, in the order to show it: each node's, the lease's, then the due
    actions (pending while the instance runs; notes once it was stopped)."""
    stopped = is_stopped(nodes)
    found: list[Notice] = []
    for node in nodes:
        if node.error and node.status in FAILED_STATUSES:
            found.append(Notice(severity=ALARM, kind="error", node=node.node,
                                text=f"{node.node} {node.status}: {node.error}"))
        elif node.error and node.status == "STOPPED":
            found.append(Notice(severity=NOTE, kind="error", node=node.node,
                                text=f"{node.node} STOPPED: {node.error}"))
        elif node.health in ALARMING_HEALTH:
            found.append(Notice(severity=ALARM, kind="health", node=node.node,
                                text=f"{node.node} {node.health}: {node.evidence}"))
        if node.relay_error:
            found.append(Notice(severity=ALARM, kind="relay", node=node.node,
                                text=f"{node.node} relay to NATS failing: {node.relay_error}"))
    if stopped:
        found.append(Notice(severity=NOTE, kind="stopped", node=None,
                            text="stopped cleanly: no node runs it" + ("; while its supervision DAG runs, the "
                                                                       "supervisor would:" if due else "")))
    elif lease is not None and not lease.valid and lease.state in ("expired", "released"):
        found.append(Notice(severity=ALARM, kind="lease", node=None,
                            text=f"no ACTIVE: the lease {lease.vacancy or lease.state}"))
    found += [Notice(severity=NOTE if stopped else PENDING, kind="due", node=None, text=f"due: {action}")
              for action in due]
    return found
