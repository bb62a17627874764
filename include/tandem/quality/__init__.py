"""Data quality: Great Expectations suites (``conf/expectations/``) over Tandem's serving tables."""

from tandem.quality.serving import (
    ExpectationOutcome,
    ValidationError,
    ValidationReport,
    serving_frame,
    validate_serving_table,
)

__all__ = ["ExpectationOutcome", "ValidationError", "ValidationReport", "serving_frame", "validate_serving_table"]
