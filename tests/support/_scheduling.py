"""The suite's xdist scheduler: whole modules per worker, never two heavy modules at once.

A heavy module runs several Spark drivers under a steady load (an HA pair, an Airflow stack on hosts). Two of
them side by side saturate a 2-core machine: batches took minutes, standbys could not catch up within their
tests' waits, and leases changed hands nobody asked for (CI's failures of stops 42–44). So while one worker runs
a heavy module, the other takes the next light module in the queue, or waits when only heavy ones are left.
"""

from __future__ import annotations

from collections.abc import Collection

from xdist.scheduler import LoadFileScheduling


class OneHeavyModuleAtATime(LoadFileScheduling):
    """``--dist loadfile`` (modules in queue order) with at most one unfinished heavy module at a time."""

    def __init__(self, config, log=None, heavy: Collection[str] = ()) -> None:
        super().__init__(config, log)
        self.heavy = frozenset(heavy)

    def _is_heavy(self, scope: str) -> bool:
        return scope.removeprefix("tests/") in self.heavy

    def _heavy_running_elsewhere(self, node) -> bool:
        return any(self._is_heavy(scope) and not all(tests.values())
                   for other, units in self.assigned_work.items() if other is not node
                   for scope, tests in units.items())

    def _assign_work_unit(self, node) -> None:
        """xdist's own assignment of the queue's first module, once the first this node may run is put first."""
        blocked = self._heavy_running_elsewhere(node)
        scope = next((s for s in self.workqueue if not (blocked and self._is_heavy(s))), None)
        if scope is None:  # only heavy modules left and one runs elsewhere: this node waits for it
            self.assigned_work.setdefault(node, {})  # xdist's _reschedule reads it
            return
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # a heavy module that just ended may let a waiting node go on
            if other is not node and not self._pending_of(self.assigned_work.get(other, {})):
                self._reschedule(other)
