"""Publishing events to a ``nats`` stream from any Python service: the client contract of ``docs/partitions.md``.

Each event goes to the subject ``<prefix>.<stream>.<partition>`` of its key's partition, with a
``Nats-Msg-Id``; the call returns once JetStream acknowledged every event, and retries (with the
same ids, so nothing is stored twice) when a connection breaks. It needs no Tandem configuration:
the servers, the stream's name, its key field and its number of partitions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tandem.declarations import key_path, partition_of, value_at
from tandem.messaging import JetStream, partition_subject
from tandem.redaction import redact_url

log = logging.getLogger(__name__)


def content_id(event: dict[str, Any]) -> str:
    """The default message id: a hash of the event's JSON with sorted keys (the same event, the same id)."""
    return hashlib.sha256(json.dumps(event, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def publish_events(servers: Sequence[str], stream: str, events: Iterable[dict[str, Any]], *,
                   key: str | Sequence[str], partitions: int, prefix: str = "tandem",
                   id_of: Callable[[dict[str, Any]], str] = content_id, attempts: int = 5) -> list[int]:
    """Publish ``events`` to the partition subjects of ``stream``; return their stream sequences, in order.

    ``key``: where an event holds the stream's key, as the plan's key field reads it (its ``from``): a key
    (``room_no``), a path into nested objects (``device.id``), or a list of keys (``["a.b"]``: a key holding a dot).

    ``id_of`` gives each event's message id (default :func:`content_id`: two identical events sent
    within the stream's duplicate window are stored once; give ids of your own when that can happen).
    A broken connection is retried ``attempts`` times with the same ids.

    Raises:
        KeyError: an event without the ``key`` field (or null there).
        ConnectionError: no server could be reached within the attempts.
    """
    path = key_path(list(key) if not isinstance(key, str) else key)
    messages = [(partition_subject(prefix, stream, partition_of(_key_of(event, path), partitions)),
                 json.dumps(event).encode(), id_of(event)) for event in events]
    if not messages:
        return []
    for attempt in range(1, attempts + 1):
        try:
            with JetStream(servers, name=f"tandem-client-{stream}") as js:
                return [ack["seq"] for ack in js.publish(messages)]
        except (ConnectionError, OSError) as exc:
            if attempt == attempts:
                raise ConnectionError(f"publishing to {stream} on {', '.join(map(redact_url, servers))}: {exc}") \
                    from None
            log.warning("publishing to %s: %s; again in %.1f s (%d of %d)", stream, exc, attempt * 0.5, attempt,
                        attempts)
            time.sleep(attempt * 0.5)
    raise AssertionError("unreachable")


def _key_of(event: dict[str, Any], path: tuple[str, ...]) -> Any:
    value = value_at(event, path)
    if value is None:
        raise KeyError(".".join(path))
    return value
