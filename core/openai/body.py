"""An OpenAI request body as fsched's requests: one per choice, checked by the field table.

The same parser reads a batch line's `body`, a simple line and an online
request (`batchfile.py` and `online.py` call it), so every door takes the same
fields with the same checks. A field is looked up in `fields.FIELDS`: an
unknown one is refused naming it (with the likeliest intended name), one
fsched cannot honour is refused with the reason, a neutral value always
passes. The values that pass become `SamplingParams` (what the engine draws)
and `AnswerOptions` (how the API shows the answer), and the body becomes one
`RequestSpec` per choice: `n` per prompt, choice `i` answering prompt `i // n`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fsched.core.grammar import GrammarError, GrammarSource, compile_grammar
from fsched.core.jobs.inputs import InputError
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.fields import BodyField, Support, field_for, names_for, other_endpoint
from fsched.core.openai.toolcalls.families import AUTO, FAMILIES
from fsched.core.openai.toolcalls.forced import forced_format
from fsched.core.openai.toolcalls.template import is_template
from fsched.core.openai.values import INT64
from fsched.core.types import (
    AnswerOptions,
    ChatMessage,
    ChatRender,
    Endpoint,
    RequestSpec,
    ResponseFormat,
    ResponseFormatType,
    SamplingParams,
)

# Whether the model's chat template, given a chat's messages and what else it is given (as the daemon
# renders them: ChatMessage.to_json(), ChatRender.to_json()), leaves a reasoning block open at the prompt's
# end. Raises ValueError when the template refuses the messages.
PromptThinking = Callable[[list[dict], dict | None], bool]

MAX_CHOICES = 128  # rows one body may become: prompts x n (OpenAI's bound on n)


@dataclass(slots=True, frozen=True)
class ParsedBody:
    specs: tuple[RequestSpec, ...]  # one per choice, in choice order
    online: dict[str, Any]  # the HTTP request's own fields, checked: stream, stream_options, ...


def parse_body(
    endpoint: Endpoint, body: dict, limits: InputLimits, default_max_tokens: int,
    custom_id: str = "request", online: bool = False, tool_parser: str = AUTO,
    thinking: PromptThinking | None = None, tenant: str = "",
) -> ParsedBody:
    """The body's requests, or InputError naming the field (a path inside the body:
    "messages[0].role"). `online`: an HTTP request (it may stream, choose its class and priority);
    otherwise a batch or simple line. `tool_parser`: the family calls are read in (the operator's);
    `thinking`: the model's template's, when it may open a reasoning block (None: it never does);
    `tenant`: whose body it is (grammars are checked for the tenants in turn)."""
    values = checked_values(endpoint, body, limits, online)
    params = _sampling(endpoint, values, limits, default_max_tokens, tenant)
    answer = _answer(endpoint, values, tool_parser)
    params, answer, render = _tools(values, params, answer, tenant)
    # A grammar (response_format, a required or named call) holds the answer from its first token, so
    # the answer never starts inside the reasoning block a template may have opened: it is read as
    # content (or calls), not as reasoning that never closes.
    if thinking is not None and endpoint is Endpoint.CHAT and "messages" in values \
            and params.response_format is None:
        answer = replace(answer, thinking=_thinking(thinking, values["messages"], render))
    specs = _choices(endpoint, values, params, answer, custom_id, render)
    return ParsedBody(specs, {f: values[f] for f in ONLINE_FIELDS if f in values})


ONLINE_FIELDS = ("stream", "stream_options", "service_tier", "priority")


def checked_values(endpoint: Endpoint, body: dict, limits: InputLimits, online: bool) -> dict[str, Any]:
    """Every non-null field of the body, checked; neutral values of fields fsched cannot honour
    are dropped (they change nothing)."""
    values: dict[str, Any] = {}
    for key, value in body.items():
        spec = field_for(key, endpoint)
        if spec is None:
            raise InputError(_unknown(key, endpoint), key)
        if value is None:
            continue
        if spec.online and not online:
            if spec.is_neutral(value):
                continue
            raise InputError(f"an HTTP request's own field: a batch line takes {_neutrals(spec)} "
                             "only (its class and priority are the job's)", key)
        if spec.support in (Support.NEUTRAL, Support.REFUSED):
            if spec.is_neutral(value) or _neutral_here(key, value, body):
                continue
            raise InputError(f"{spec.note}; accepted: {_neutrals(spec)}", key)
        try:
            values[key] = spec.kind.check(value, limits)
        except InputError as exc:
            raise exc.within(key) from None
    return values


def _neutral_here(key: str, value: Any, body: dict) -> bool:
    """A value neutral in this body only: best_of equal to n asks for nothing more than n."""
    return key == "best_of" and value == (body.get("n") or 1) and not isinstance(value, bool)


def _neutrals(spec: BodyField) -> str:
    return ", ".join(["null", *(json.dumps(v) for v in spec.neutral)])


def _unknown(key: str, endpoint: Endpoint) -> str:
    if not key:
        return 'unknown field: the empty name ""'
    other = other_endpoint(key, endpoint)
    if other is not None:
        return f"not a field of {endpoint.value} ({other.value} takes it)"
    close = difflib.get_close_matches(key, names_for(endpoint), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown field{hint} (docs/http.md lists every field fsched takes)"


def _sampling(endpoint: Endpoint, values: dict, limits: InputLimits, default_max_tokens: int,
              tenant: str = "") -> SamplingParams:
    max_tokens = values.get("max_tokens")
    newer = values.get("max_completion_tokens")
    if newer is not None:
        if max_tokens is not None and max_tokens != newer:
            raise InputError("differs from max_tokens; give one of them", "max_completion_tokens")
        max_tokens = newer
    asked = max_tokens is not None
    max_tokens = max_tokens if asked else default_max_tokens
    if values.get("min_tokens", 0) > max_tokens:
        raise InputError(f"must not exceed max_tokens ({max_tokens:,})", "min_tokens")
    return SamplingParams(
        max_tokens=max_tokens,
        max_tokens_is_default=not asked,
        temperature=values.get("temperature", 1.0),
        top_p=values.get("top_p", 1.0),
        top_k=max(0, values.get("top_k", 0)),
        seed=values.get("seed"),
        stop=values.get("stop", ()),
        presence_penalty=values.get("presence_penalty", 0.0),
        frequency_penalty=values.get("frequency_penalty", 0.0),
        repetition_penalty=values.get("repetition_penalty", 1.0),
        logit_bias=values.get("logit_bias", ()),
        min_p=values.get("min_p", 0.0),
        min_tokens=values.get("min_tokens", 0),
        ignore_eos=values.get("ignore_eos", False),
        stop_token_ids=values.get("stop_token_ids", ()),
        include_stop_str_in_output=values.get("include_stop_str_in_output", False),
        skip_special_tokens=values.get("skip_special_tokens", True),
        logprobs=_logprobs(endpoint, values),
        response_format=_response_format(values.get("response_format"), tenant),
    )


def _logprobs(endpoint: Endpoint, values: dict) -> int | None:
    """The alternatives the engine reports with each token, or None for no logprobs."""
    if endpoint is Endpoint.COMPLETIONS:
        k = values.get("logprobs")
        if k is not None and values.get("echo"):
            raise InputError("echo with logprobs is not taken: fsched computes no log probabilities of "
                             "the prompt; ask for one of the two", "echo")
        return k
    top = values.get("top_logprobs", 0)
    if not values.get("logprobs"):
        if top:
            raise InputError("needs logprobs: true", "top_logprobs")
        return None
    return top


def _response_format(value: dict | None, tenant: str = "") -> ResponseFormat | None:
    """The format, its grammar compiled here (in the isolated worker, once per distinct schema) so that a
    schema the engine cannot use is refused before anything is stored."""
    if value is None or value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return ResponseFormat(ResponseFormatType.JSON_OBJECT)
    spec = value["json_schema"]
    try:
        chosen = ResponseFormat.json_schema(spec["schema"], spec["name"], spec["strict"])
        compile_grammar(GrammarSource.of(chosen), tenant)
    except GrammarError as exc:  # the field names the subject: the reason alone
        raise InputError(exc.reason, "response_format.json_schema.schema") from None
    except ValueError as exc:
        raise InputError(str(exc), "response_format.json_schema.schema") from None
    return chosen


def _answer(endpoint: Endpoint, values: dict, tool_parser: str) -> AnswerOptions:
    logprobs = values.get("logprobs") is not None if endpoint is Endpoint.COMPLETIONS \
        else bool(values.get("logprobs"))
    return AnswerOptions(
        n=values.get("n", 1),
        prompts=len(values.get("prompt", ("",))),
        echo=bool(values.get("echo")),
        logprobs=logprobs,
        token_ids=bool(values.get("return_token_ids")),
        tokens_as_ids=bool(values.get("return_tokens_as_token_ids")),
        tool_parser=tool_parser,
    )


def _tools(values: dict, params: SamplingParams, answer: AnswerOptions, tenant: str = ""
           ) -> tuple[SamplingParams, AnswerOptions, ChatRender]:
    """What the template is given (tools, template options), whether calls are read out of the
    answer, and, for a required or named call, the grammar that holds the answer to it."""
    tools = list(values.get("tools", ()))
    choice = values.get("tool_choice", "auto" if tools else "none")
    kwargs = dict(values.get("chat_template_kwargs", {}))
    if values.get("reasoning_effort", "medium") != "medium":
        kwargs["reasoning_effort"] = values["reasoning_effort"]
    render = ChatRender(tuple(tools), tuple(sorted(kwargs.items())))
    if choice == "none" or (choice == "auto" and not tools):
        # a model's own response template reads its reasoning with or without tools
        if is_template(answer.tool_parser) or answer.tool_parser == AUTO:
            return params, answer, render  # unchanged: no `replace` (17 µs of a 95 µs parse)
        return params, replace(answer, tool_parser=AUTO), render
    if not tools:
        raise InputError("needs tools (there is no function to call)", "tool_choice")
    named = choice["function"]["name"] if isinstance(choice, dict) else None
    if named is not None and named not in {t["function"]["name"] for t in tools}:
        raise InputError(f"names no tool of this request: {named!r}", "tool_choice.function.name")
    answer = replace(answer, tools=tuple(t["function"]["name"] for t in tools),
                     one_call=not values.get("parallel_tool_calls", True))
    if choice == "auto":
        family = FAMILIES.get(answer.tool_parser)
        if family is not None and family.keeps_special_tokens and "skip_special_tokens" not in values:
            params = replace(params, skip_special_tokens=False)  # the marker is a special token
        return params, answer, render
    if params.response_format is not None:
        raise InputError("a required or named tool call is held to its own grammar: not with "
                         "response_format", "response_format")
    try:
        fmt = forced_format(tools, named, values.get("parallel_tool_calls", True))
        compile_grammar(GrammarSource.of(fmt), tenant)  # isolated and budgeted, as any tenant's schema
    except GrammarError as exc:
        raise InputError(f"a tool's parameters cannot be used as a grammar: {exc.reason}", "tools") from None
    except ValueError as exc:
        raise InputError(f"a tool's parameters cannot be used as a grammar: {exc}", "tools") from None
    return replace(params, response_format=fmt), replace(answer, forced_tools=True), render


def _thinking(thinking: PromptThinking, messages: tuple[ChatMessage, ...], render: ChatRender) -> bool:
    try:
        return thinking([m.to_json() for m in messages], render.to_json())
    except ValueError as exc:
        raise InputError(f"the model's chat template cannot render these messages: {exc}", "messages") \
            from None


def _choices(endpoint: Endpoint, values: dict, params: SamplingParams, answer: AnswerOptions,
             custom_id: str, render: ChatRender) -> tuple[RequestSpec, ...]:
    wanted = "prompt" if endpoint is Endpoint.COMPLETIONS else "messages"
    if wanted not in values:
        raise InputError(f"missing ({endpoint.value} takes '{wanted}')", wanted)
    inputs: tuple[str, ...] | tuple[tuple[ChatMessage, ...]] = (
        values["prompt"] if endpoint is Endpoint.COMPLETIONS else (values["messages"],))
    if len(inputs) * answer.n > MAX_CHOICES:
        raise InputError(f"at most {MAX_CHOICES} choices in one request (prompts x n), "
                         f"asked for {len(inputs) * answer.n:,}", "n")
    specs = []
    for p, given in enumerate(inputs):
        for j in range(answer.n):
            seed = None if params.seed is None else (params.seed + j) % INT64
            chosen = params if seed == params.seed else replace(params, seed=seed)
            prompt, messages = (given, ()) if endpoint is Endpoint.COMPLETIONS else (None, given)
            specs.append(RequestSpec(custom_id=custom_id, endpoint=endpoint, params=chosen, prompt=prompt,
                                     messages=messages, model=values.get("model"),
                                     choice=p * answer.n + j, answer=answer, render=render))
    return tuple(specs)
