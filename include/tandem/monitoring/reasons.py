"""Quarantine reasons as a bounded label: the class of a reason's first problem.

A reason quotes the values it refuses (``field 'price' must be > 0 (got -1.5)``), so reasons themselves are
unbounded; their classes are not. The words matched are the ones :mod:`tandem.runtime.records`,
:mod:`tandem.event_checks` and the outputs' stores write.
"""

from __future__ import annotations

from tandem.event_checks import WITHOUT_ZONE

REASON_CLASSES = ("too_long", "encoding", "malformed_json", "duplicate_key", "missing_field", "wrong_type",
                  "check_failed", "output_refused", "other")


def reason_class(reason: str | None) -> str:
    """The class of the first problem a quarantine reason names (pure)."""
    first = (reason or "").split("; ", 1)[0]
    if first.startswith("line of ") and "max_line_bytes" in first:
        return "too_long"
    if first.startswith(("line is not valid UTF-8", "line holds an unpaired")):
        return "encoding"
    if first.startswith(("invalid JSON", "not a JSON object", "malformed JSON")):  # the last: older rows' words
        return "malformed_json"
    if first.startswith("duplicate key "):
        return "duplicate_key"
    if first.startswith("missing field "):
        return "missing_field"
    if first.startswith("output "):
        return "output_refused"
    if first.startswith("field '"):
        rest = first.split("' ", 1)[-1]
        if rest.startswith(("is not ", "is outside the 64-bit integer range", WITHOUT_ZONE)):
            return "wrong_type"
        return "check_failed"
    return "other"
