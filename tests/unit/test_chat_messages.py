"""An assistant message's `reasoning_content`, as an answer gave it and a framework sends it back (the
openai SDK's message dumped whole, pydantic-ai), is taken and handed to the template; on another role,
or not a string, it is refused by name."""

from __future__ import annotations

import pytest

from fsched.core.jobs.inputs import InputError
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.messages import messages


def test_an_assistants_reasoning_is_taken_and_given_to_the_template():
    (user, assistant) = messages([{"role": "user", "content": "?"},
                                  {"role": "assistant", "content": "Hi.", "reasoning_content": "Easy."}],
                                 InputLimits())
    assert assistant.to_json() == {"role": "assistant", "content": "Hi.", "reasoning_content": "Easy."}
    assert "reasoning_content" not in user.to_json()


@pytest.mark.parametrize("message", [{"role": "user", "content": "?", "reasoning_content": "x"},
                                     {"role": "assistant", "content": "", "reasoning_content": 3}])
def test_reasoning_elsewhere_or_not_text_is_refused_by_name(message):
    with pytest.raises(InputError) as refused:
        messages([message], InputLimits())
    assert refused.value.field == "[0].reasoning_content"
