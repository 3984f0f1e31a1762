"""loads_object: fsched's one reading of a JSON object, for every body and line."""

import json

import pytest

from fsched.core.jobs.inputs import InputError
from fsched.core.jobs.jsontext import loads_object


def nested(depth: int) -> str:
    """An object `depth` containers deep (the object itself the first)."""
    return '{"a": ' + ("[" * (depth - 1) + "]" * (depth - 1) if depth > 1 else "1") + "}"


@pytest.mark.parametrize("bound", [1, 2, 8, 64])
def test_depth_is_refused_just_past_the_bound_and_taken_at_it(bound):
    assert loads_object(nested(bound), bound)
    with pytest.raises(InputError, match=f"deeper than {bound} levels"):
        loads_object(nested(bound + 1), bound)


def test_brackets_inside_strings_count_for_nothing():
    text = json.dumps({"content": "{[" * 100, "list": [[1], [2], {"x": [3]}]})
    assert loads_object(text, 4)["content"] == "{[" * 100
    with pytest.raises(InputError, match="deeper than 3 levels"):
        loads_object(text, 3)


def test_many_shallow_containers_are_taken_past_the_bound_in_count():
    text = json.dumps({"messages": [{"role": "user", "content": str(i)} for i in range(200)]})
    assert len(loads_object(text, 3)["messages"]) == 200


def test_refusals_name_what_json_loads_would():
    with pytest.raises(InputError, match="Unexpected UTF-8 BOM"):
        loads_object('\ufeff{"a": 1}', 64)
    with pytest.raises(InputError, match="duplicate key"):
        loads_object('{"a": 1, "a": 2}', 64)
    with pytest.raises(InputError, match="NaN is not valid JSON"):
        loads_object('{"a": NaN}', 64)
    with pytest.raises(InputError, match="invalid JSON"):
        loads_object('{"a": 1', 64)
