"""Finite jobs over a plan's retained data beside its streams: storage upkeep (:mod:`tandem.batch.upkeep`)."""
