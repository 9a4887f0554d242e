"""describe_validation_error is bounded: a record with 20,000 bad fields gave an 80,000-error, 5 MB line
(a dead-letter reason beyond Kafka's 1 MB, seconds to build). Now the first errors, each cut, then how many more."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from opsloop.validation import MAX_DESCRIBED_ERRORS, MAX_ERROR_PART, describe_validation_error


class _Fields(BaseModel):
    fields: dict[str, float]


def _error(doc: dict) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        _Fields.model_validate(doc)
    return e.value


def test_many_errors_give_the_first_ones_and_a_count() -> None:
    e = _error({"fields": {f"f{i}": [1] for i in range(5000)}})
    text = describe_validation_error(e)
    assert text.startswith("fields.f0: Input should be a valid number (got [1])")
    assert text.count("; ") == MAX_DESCRIBED_ERRORS   # the parts, then the count
    assert text.endswith(f"; and {5000 - MAX_DESCRIBED_ERRORS} more errors")
    assert len(text) < (MAX_DESCRIBED_ERRORS + 1) * MAX_ERROR_PART


def test_a_huge_field_name_is_cut_and_a_password_is_masked_before_the_cut() -> None:
    name = "https://ops:s3cret@am:9093/" + "x" * 100_000
    text = describe_validation_error(_error({"fields": {name: "banana"}}))
    assert len(text) <= MAX_ERROR_PART and "s3cret" not in text and text.startswith("fields.https://***@am:9093/xxx")
    # the key is shortened in the path, so the reason after it stays readable
    assert "...(100020 chars): Input should be a valid number" in text, text   # counted once masked


def test_few_errors_are_described_whole() -> None:
    text = describe_validation_error(_error({"fields": {"a": "x", "b": "y"}}), prefix="metrics.3.")
    assert text == ("metrics.3.fields.a: Input should be a valid number, unable to parse string as a number "
                    "(got 'x'); metrics.3.fields.b: Input should be a valid number, unable to parse string as a "
                    "number (got 'y')")
