"""The partials of ``distinct_exact`` measures (pure): the set of distinct values, or an HLL sketch past a bound.

A stored partial (bytes) is one of

- an **exact set**: the distinct values as a JSON array of strings, sorted by code point, compact (``["u1","u2"]``:
  UTF-8, readable with ``convert_from(column, 'UTF8')``); Spark's partials are this (``to_json`` of the sorted
  ``collect_set``), and so is every union that holds at most ``max_values`` values and :data:`MAX_SET_BYTES`;
- an **approximate** partial: ``H`` then an HLL sketch (:mod:`tandem.aggregation.sketches`, the format of a
  ``distinct`` measure), once a union would hold more; it stays a sketch in every union that includes it;
- (read only) a bare HLL sketch: a ``distinct`` measure's partial, kept beside the new ones by a cut-over that
  made the measure ``distinct_exact``; it reads as approximate.

Merge = union; read = the size of the union, exact while every partial merged is a set.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tandem.aggregation import sketches

SET_START = b"["
SKETCH_TAG = b"H"
MAX_SET_BYTES = 64 * 1024 * 1024
"""An exact set is stored while its JSON text holds at most this many bytes, whatever ``max_values`` says (a
partial travels to and from PostgreSQL whole, as hex text twice its size); past it, a sketch."""


def encode(values: Iterable[str]) -> bytes:
    """The exact set of ``values`` (every value a string): sorted by code point, as Spark's ``array_sort`` of UTF-8
    strings, and written compact, as Spark's ``to_json``."""
    return json.dumps(sorted(set(values)), ensure_ascii=False, separators=(",", ":")).encode()


def decode(partial: bytes | memoryview) -> set[str] | bytes:
    """The values of an exact set, or the HLL sketch of an approximate partial (raw DataSketches bytes)."""
    data = bytes(partial)
    if data.startswith(SET_START):
        return set(json.loads(data))
    return data[len(SKETCH_TAG):] if data.startswith(SKETCH_TAG) else data


def is_exact(partial: bytes | memoryview | None) -> bool:
    """Whether ``partial`` is an exact set (no partial is: nothing counted yet)."""
    return partial is None or bytes(partial[:1]) == SET_START


def of(values: Iterable[str | None], max_values: int | None) -> bytes | None:
    """The partial of ``values`` (``None`` ignored, as Spark's ``collect_set`` does; ``None`` when none is left)."""
    kept = {v for v in values if v is not None}
    return union([encode(kept)], max_values) if kept else None


def _split(partials: Iterable[bytes | memoryview | None]) -> tuple[set[str], list[bytes], bool]:
    """The values of the exact sets among ``partials``, the sketches of the others, and whether there was any."""
    values: set[str] = set()
    found: list[bytes] = []
    seen = False
    for partial in partials:
        if partial is None:
            continue
        seen = True
        decoded = decode(partial)
        if isinstance(decoded, set):
            values |= decoded
        else:
            found.append(decoded)
    return values, found, seen


def union(partials: Iterable[bytes | memoryview | None], max_values: int | None) -> bytes | None:
    """The partial of the union of ``partials`` (``None`` when there is none): an exact set while every partial is
    one and the union holds at most ``max_values`` values (``None``: any number) and :data:`MAX_SET_BYTES`; else
    ``H`` and the sketch of every value and sketch."""
    values, found, seen = _split(partials)
    if not seen:
        return None
    if not found and (max_values is None or len(values) <= max_values):
        exact = encode(values)
        if len(exact) <= MAX_SET_BYTES:
            return exact
    return SKETCH_TAG + sketches.union([*found, sketches.of(sorted(values))])


def bounded(partial: bytes | memoryview | None, max_values: int) -> bytes | None:
    """``partial`` as stored: itself while it is a sketch or a set within the bounds, else the sketch of its
    values."""
    if partial is None or not is_exact(partial):
        return None if partial is None else bytes(partial)
    data = bytes(partial)
    if len(data) <= MAX_SET_BYTES and len(decode(data)) <= max_values:
        return data
    return union([data], max_values)


def count(partial: bytes | memoryview | None) -> tuple[int, bool]:
    """The number of distinct values in ``partial`` and whether it is exact (``(0, True)`` for none): a set's
    size, or a sketch's estimate (rounded)."""
    return count_union([partial])


def count_union(partials: Iterable[bytes | memoryview | None]) -> tuple[int, bool]:
    """:func:`count` of the :func:`union` of ``partials`` without a bound (a merge on read), without writing the
    union: exact while every partial is a set."""
    values, found, _ = _split(partials)
    if not found:
        return len(values), True
    return sketches.estimate(sketches.union([*found, sketches.of(sorted(values))])), False


def as_sketch(partial: bytes | memoryview | None) -> bytes | None:
    """``partial`` as a bare HLL sketch (a ``distinct`` measure's partial): what a cut-over that made a
    ``distinct_exact`` measure ``distinct`` again reads its older partials as."""
    if partial is None:
        return None
    decoded = decode(partial)
    return sketches.of(sorted(decoded)) if isinstance(decoded, set) else decoded
