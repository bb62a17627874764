"""Partial aggregates per instance: granularities, publishing, and merge on read.

The ``aggregation`` output kind (:mod:`tandem.outputs.aggregation`) reads merged aggregates from PostgreSQL
(indexed, for serving) or from Delta (the same numbers, for the lake); :func:`tandem.reading.read_output` reads
any output.
"""

from __future__ import annotations

from tandem.aggregation import delta as _delta
from tandem.aggregation import postgres as _postgres
from tandem.aggregation.granularity import GRANULARITIES, bucket_end, bucket_start
from tandem.aggregation.merge import MergedRow, merge_partials
from tandem.aggregation.spec import AggregationSpec, aggregation_outputs, spec_for

__all__ = ["GRANULARITIES", "AggregationSpec", "MergedRow", "bucket_end", "bucket_start", "merge_partials", "spec_for"]
