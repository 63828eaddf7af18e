"""Request bodies that cannot be stored are refused naming the field, whether the
quick scan of the body or the walk of the parsed JSON finds them."""

import json

import pytest

from gpulayer.contracts import JobSpec, TaskCompletion
from gpulayer.errors import ValidationError
from jupyter_ext.api.bodies import decode_json


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"command": ["true"], "env": {"A": "\\ud800"}}', "env.A"),  # an escape
        ('{"command": ["true"], "env": {"A": "\ud800"}}'.encode("utf-8", "surrogatepass"),
         "env.A"),  # raw bytes of a surrogate (json.loads passes them)
        ('{"command": ["true"], "env": {"A": "x"}}'.encode("utf-16"), None),  # fine
        ('{"command": ["true"], "priority": 9223372036854775808}'.encode("utf-16"),
         "priority"),  # digits not in a row
        (b'{"command": ["true"], "priority": 9223372036854775808}', "priority"),
        (b'{"command": ["true"], "priority": -9223372036854775809}', "priority"),
        (b'{"command": ["true"], "priority": "9223372036854775808"}', "priority"),
        (b'{"command": ["true"], "priority": "9_223_372_036_854_775_808"}', "priority"),
        (b'{"command": ["true"], "priority": 1e19}', "priority"),  # pydantic refuses it
    ],
)  # fmt: skip
def test_an_unstorable_value_is_refused_naming_its_field(body, field):
    if field is None:
        assert decode_json(body, JobSpec).env == {"A": "x"}
        return
    with pytest.raises(ValidationError) as e:
        decode_json(body, JobSpec)
    assert e.value.field == field


def test_ordinary_bodies_parse_as_before():
    spec = {"command": ["echo", "héllo"], "env": {"N": "1234567890123456789"}, "priority": 7}
    for body in (json.dumps(spec).encode(), json.dumps(spec, ensure_ascii=False).encode()):
        assert decode_json(body, JobSpec).model_dump(include={"command", "env", "priority"}) == spec
    done = decode_json(b'{"state": "succeeded", "exit_code": 0, "result": "LQ=="}', TaskCompletion)
    assert done.result == b"-"


@pytest.mark.parametrize(
    "value",
    [
        b'"9223372036854775808"',
        b'"+9_2_2_3_3_7_2_0_3_6_8_5_4_7_7_5_8_0_8"',  # digits apart: "_" counts as one
        b'" 9223372036854775808.0 "',
        b"-9223372036854775809",
    ],
)
def test_an_unbounded_integer_read_from_text_is_refused(value):
    """An integer field without bounds of its own (``exit_code``): pydantic reads
    these as integers past 64 bits, which the store cannot keep."""
    with pytest.raises(ValidationError) as e:
        decode_json(b'{"state": "failed", "exit_code": ' + value + b"}", TaskCompletion)
    assert e.value.field == "exit_code"
    assert (
        decode_json(b'{"state": "failed", "exit_code": "1_000"}', TaskCompletion).exit_code == 1000
    )
