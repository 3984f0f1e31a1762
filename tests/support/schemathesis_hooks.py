"""schemathesis's extra check for fsched (loaded by SCHEMATHESIS_HOOKS): every error OpenAI-shaped."""

from __future__ import annotations

import json

import schemathesis


@schemathesis.check
def openai_error_shape(ctx, response, case):
    """A 4xx or 5xx answers {"error": {"message", "type", "param", "code"}} with a message and a type."""
    if response.status_code < 400:
        return None
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{response.status_code} without an OpenAI error body: "
                             f"{response.content[:200]!r}") from None
    if not (isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
            and isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)):
        raise AssertionError(f"{response.status_code} with an error not in OpenAI's shape: {error!r}")
    return None
