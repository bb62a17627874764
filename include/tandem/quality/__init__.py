"""Data quality: Great Expectations suites (``conf/expectations/``, or implied by a plan's declarations) over
Tandem's outputs, each validated as its output kind says."""

from tandem.quality.outputs import validate_output, validate_plan_outputs, validate_serving_table
from tandem.quality.suites import ExpectationOutcome, ValidationError, ValidationReport

__all__ = ["ExpectationOutcome", "ValidationError", "ValidationReport", "validate_output", "validate_plan_outputs",
           "validate_serving_table"]
