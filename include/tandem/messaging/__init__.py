"""The messaging layer: NATS JetStream streams, producers' publishing and ranges read back by sequence.

- :mod:`~tandem.messaging.jetstream`: JetStream for Tandem (streams it owns, publishing with message
  ids, reading one subject's sequence range); :mod:`~tandem.messaging.wire`: the NATS protocol over a
  blocking socket, under it;
- :mod:`~tandem.messaging.server`: an embedded ``nats-server`` for the demo, tests and benches.
"""

from tandem.messaging.jetstream import (
    Bounds,
    JetStream,
    StreamMismatch,
    StreamSpec,
    ensure_declared,
    partition_subject,
    stream_name,
    stream_spec,
)

__all__ = ["Bounds", "JetStream", "StreamMismatch", "StreamSpec", "ensure_declared", "partition_subject", "stream_name",
           "stream_spec"]
