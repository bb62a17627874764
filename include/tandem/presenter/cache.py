"""Answers computed from a versioned source (a Delta table), reused while its version stays the same.

Purpose:
    The quarantine panel of every open page asks for the same summary every few seconds; reading
    the whole quarantine table for each of them costs the API server a table scan per request.

How it works:
    :class:`VersionedCache` keeps one value per key with the source version it was computed at.
    Within ``ttl_s`` of the last look at the version, the value is served as it is; after that the
    version is read again (for Delta, the table's log: cheap) and the value is recomputed only when
    the version changed. Concurrent requests for one key wait for one computation instead of each
    doing their own. At most ``max_entries`` keys are kept (the least recently used go first).

What it does not do:
    It does not notice a change of the source within ``ttl_s``: a reader may see an answer up to
    ``ttl_s`` old.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class _Entry(Generic[V]):
    version: Hashable
    value: V
    checked_at: float


class VersionedCache(Generic[V]):
    """One value per key, recomputed only when its source's version changed (looked at every ``ttl_s``)."""

    def __init__(self, ttl_s: float, max_entries: int = 32, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._entries: OrderedDict[Hashable, _Entry[V]] = OrderedDict()
        self._key_locks: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.computed = 0
        """How many times a value was computed (for tests and the benchmark)."""

    def get(self, key: Hashable, version_of: Callable[[], Hashable], compute: Callable[[Hashable], V]) -> V:
        """The value for ``key``: cached, or ``compute(version)`` when the source's version changed."""
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
            now = self.clock()
            if entry is not None and now - entry.checked_at < self.ttl_s:
                return entry.value
            version = version_of()
            if entry is None or entry.version != version:
                entry = _Entry(version, compute(version), now)
                self.computed += 1
            else:
                entry.checked_at = now
            with self._lock:
                self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    evicted, _ = self._entries.popitem(last=False)
                    self._key_locks.pop(evicted, None)
            return entry.value
