"""HLL sketches of distinct measures (Apache DataSketches format, as Spark's ``hll_sketch_agg`` writes them)."""

from __future__ import annotations

from collections.abc import Iterable

import datasketches

from tandem.aggregation.spec import HLL_LG_K


def union(sketches: Iterable[bytes | memoryview | None]) -> bytes | None:
    """One sketch of the union of ``sketches`` (``None`` when there is none)."""
    merged = datasketches.hll_union(HLL_LG_K)
    seen = False
    for sketch in sketches:
        if sketch is not None:
            merged.update(datasketches.hll_sketch.deserialize(bytes(sketch)))
            seen = True
    return merged.get_result().serialize_compact() if seen else None


def estimate(sketch: bytes | memoryview | None) -> int:
    """The estimated number of distinct values in ``sketch`` (rounded; 0 for none)."""
    return 0 if sketch is None else round(datasketches.hll_sketch.deserialize(bytes(sketch)).get_estimate())


EMPTY_STRING = "\u0000"
"""What an empty string is counted as: DataSketches ignores an empty string (Spark's ``hll_sketch_agg`` too), and
no field holds a NUL (the streams refuse it), so this stands for ``""`` alone."""


def of(values: Iterable[str]) -> bytes | None:
    """A sketch of ``values`` (``None`` when there is none); ``""`` counts as a value (as :data:`EMPTY_STRING`)."""
    sketch = datasketches.hll_sketch(HLL_LG_K)
    seen = False
    for value in values:
        sketch.update(value or EMPTY_STRING)
        seen = True
    return sketch.serialize_compact() if seen else None
