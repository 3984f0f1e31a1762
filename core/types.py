"""Domain vocabulary shared by every layer: classes, states, sampling parameters.

Pure data, no I/O. The job table (storage), the scheduler and the engine all
speak in these types; strings appear only at the edges (JSON, SQL columns).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field

# A request's id everywhere in fsched: the job table's key, as text. The
# scheduler, the engine, the runners, the records and the API key requests by
# it; storage converts it to and from its integer column at its own boundary
# (storage/rows.py), and nowhere else.
RequestId = str


class RequestClass(enum.StrEnum):
    """Service class of a job; its band order is realtime < streaming < batch."""

    REALTIME = "realtime"
    STREAMING = "streaming"
    BATCH = "batch"

    @property
    def band(self) -> int:
        """The class's precedence: 0 is served first."""
        return _BANDS[self]


_BANDS = {RequestClass.REALTIME: 0, RequestClass.STREAMING: 1, RequestClass.BATCH: 2}


class JobState(enum.StrEnum):
    """A job's life, in the OpenAI batch vocabulary where it fits."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in _FINISHED_JOB_STATES


_FINISHED_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class JobOrigin(enum.StrEnum):
    """Which door a job came in by: listings show submitted files and batches as jobs, and the
    one-request jobs of online requests and `fsched generate` grouped apart."""

    SUBMIT = "submit"  # fsched submit: a file
    BATCH = "batch"  # the Batch API: an uploaded file
    ONLINE = "online"  # /v1/completions, /v1/chat/completions: one request
    GENERATE = "generate"  # fsched generate: one prompt

    @property
    def interactive(self) -> bool:
        """One request someone waits on, rather than a file of work."""
        return self in (JobOrigin.ONLINE, JobOrigin.GENERATE)


class RequestStatus(enum.IntEnum):
    """A request's life, in order: waiting < running < preempted < finished.

    One status from claim to completion (as vLLM's `RequestStatus`): a
    finished status names why it finished, so there is no separate finish
    reason and no "no reason means failed". `preempted` waits again, holding
    its tokens so far (and its KV in the host pool when it was parked).

    The job table stores it as two columns, a state word and OpenAI's finish
    reason; storage maps them at its own boundary (storage/rows.py, and the
    in-memory table keeps the status itself).
    """

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3  # EOS, a stop token or a stop string
    FINISHED_LENGTH = 4  # max_tokens, or the model's context is full
    FINISHED_CANCELLED = 5  # its job was cancelled (or the request, by its caller)
    FINISHED_FAILED = 6  # an error ended it (stored beside it)

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def is_waiting(self) -> bool:
        """Waiting to run: new, or preempted."""
        return self in (RequestStatus.WAITING, RequestStatus.PREEMPTED)

    @property
    def succeeded(self) -> bool:
        """Finished with its output whole (stopped or at its length)."""
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish reason of a request that succeeded ("stop", "length"); None otherwise."""
        return _FINISH_REASONS.get(self)

    @property
    def word(self) -> str:
        """Its name in text (JSON, status views): "waiting", "finished_length"..."""
        return self.name.lower()

    @classmethod
    def of_word(cls, word: str) -> RequestStatus:
        """The status `word` names (the inverse of `word`)."""
        return cls[word.upper()]

    @classmethod
    def finished_by(cls, reason: str | None) -> RequestStatus:
        """The status of a request that ended for OpenAI's `reason` (a remote engine's word: anything
        but "length" stopped it)."""
        return cls.FINISHED_LENGTH if reason == "length" else cls.FINISHED_STOPPED


_FINISH_REASONS = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length"}


@dataclass(slots=True, frozen=True)
class StopCheck:
    """Whether a request's output has ended after its last token, and how its text ends: what a
    runner's stop check says of each token, and what a request's live record keeps of the one that
    ended it."""

    finished: RequestStatus | None  # FINISHED_STOPPED or FINISHED_LENGTH; None: going on
    text_end: int | None = None  # cut the text here (before, or just after, a stop string)
    on_token: bool = False  # ended by its last token (EOS or a stop token), which the text leaves out


class Endpoint(enum.StrEnum):
    """Which OpenAI response shape a request's result takes."""

    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


MAX_SEED = 2**63 - 1
# The bounds every door checks a sampling field against (one definition each).
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty and frequency_penalty, as OpenAI defines them
LOGIT_BIAS_RANGE = (-100.0, 100.0)
MAX_LOGPROBS = 20  # top alternatives a token may report (OpenAI's top_logprobs, vLLM's default cap)
MAX_TOKEN_ID = 2**31 - 1  # any vocabulary fits; the engine checks a token against its own
# What a logprob of minus infinity (a token the request's processors ruled out) is
# reported as: JSON has no infinity, and vLLM reports the same floor.
LOGPROB_FLOOR = -9999.0


class ResponseFormatType(enum.StrEnum):
    """Structured output: what the generated text must be."""

    TEXT = "text"  # no constraint (OpenAI's default)
    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # JSON valid against `ResponseFormat.schema`


@dataclass(slots=True, frozen=True)
class ResponseFormat:
    """A constraint on the output's text, enforced token by token by a grammar.

    `schema` is the JSON schema as canonical JSON text (sorted keys, no
    spaces), so two requests with the same schema compare and hash equal and
    a compiled grammar can be cached by it. `name` and `strict` are OpenAI's
    fields of `json_schema`, passed through to a remote engine unchanged.
    """

    type: ResponseFormatType
    schema: str | None = None
    name: str | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        if self.type is ResponseFormatType.TEXT:
            raise ValueError("a text response format is no constraint: use none")
        if (self.schema is None) != (self.type is not ResponseFormatType.JSON_SCHEMA):
            raise ValueError("json_schema takes a schema; json_object takes none")
        if self.schema is not None and not isinstance(json.loads(self.schema), dict | bool):
            raise ValueError("a JSON schema is an object (or true/false)")

    @classmethod
    def json_schema(cls, schema: dict | bool, name: str | None = None, strict: bool | None = None
                    ) -> ResponseFormat:
        return cls(ResponseFormatType.JSON_SCHEMA, canonical_json(schema), name, strict)

    @property
    def schema_object(self) -> dict | bool | None:
        return None if self.schema is None else json.loads(self.schema)

    def to_json(self) -> dict:
        out: dict = {"type": self.type.value}
        if self.schema is not None:
            out["schema"] = json.loads(self.schema)
        if self.name is not None:
            out["name"] = self.name
        if self.strict is not None:
            out["strict"] = self.strict
        return out

    @classmethod
    def from_json(cls, data: dict) -> ResponseFormat:
        schema = data.get("schema")
        return cls(ResponseFormatType(data["type"]), None if schema is None else canonical_json(schema),
                   data.get("name"), data.get("strict"))


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to draw tokens. `temperature == 0` means greedy.

    `seed` is always set once a request is stored, so a preempted, recomputed
    or restarted request draws the same tokens.

    `max_tokens_is_default`: the request did not ask for `max_tokens` (a
    default filled it in). The engine then caps it at the room the model's
    context leaves; a `max_tokens` asked for that does not fit is refused
    instead (the OpenAI/vLLM convention).

    The rest are OpenAI's and vLLM's sampling fields, with their names and
    meanings; each default is the neutral value (the field changes nothing):
    - `presence_penalty`, `frequency_penalty`: subtracted from a token's logit
      once if it occurs in the output so far, and once per occurrence;
    - `repetition_penalty`: a logit of a token seen in the prompt or the
      output is divided by it when positive, multiplied when negative;
    - `logit_bias`: (token id, bias) pairs added to the logits, sorted by id;
    - `min_p`: drop tokens less likely than `min_p` times the likeliest;
    - `min_tokens`: no end (EOS, stop token, stop string) before this many;
    - `ignore_eos`: the model's end-of-sequence token does not end the output;
    - `stop_token_ids`: tokens that end the output, as EOS does;
    - `include_stop_str_in_output`: keep the stop string (or stop token) that
      ended the output in its text;
    - `skip_special_tokens`: leave special tokens out of the text;
    - `logprobs`: None for none; else each generated token's log probability
      and this many top alternatives (0: the chosen token's alone);
    - `response_format`: structured output (a JSON object, or JSON valid
      against a schema), or None.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    max_tokens_is_default: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    response_format: ResponseFormat | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 2.0):
            raise ValueError("temperature must be within [0, 2]")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be within (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 turns it off)")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be within [0, {MAX_SEED}]")
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{name} must be within [{low:g}, {high:g}]")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError("repetition_penalty must be > 0 (1 turns it off)")
        self._check_logit_bias()
        if not (math.isfinite(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise ValueError("min_p must be within [0, 1]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be within [0, max_tokens]")
        if any(not 0 <= t <= MAX_TOKEN_ID for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be token ids (integers >= 0)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be within [0, {MAX_LOGPROBS}]")

    def _check_logit_bias(self) -> None:
        low, high = LOGIT_BIAS_RANGE
        ids = [t for t, _ in self.logit_bias]
        if ids != sorted(set(ids)):
            raise ValueError("logit_bias must hold each token id once, sorted (use with_logit_bias)")
        for token, bias in self.logit_bias:
            if not 0 <= token <= MAX_TOKEN_ID:
                raise ValueError(f"logit_bias: {token} is not a token id")
            if not (math.isfinite(bias) and low <= bias <= high):
                raise ValueError(f"logit_bias of token {token} must be within [{low:g}, {high:g}]")

    @staticmethod
    def logit_bias_of(bias: dict[int, float]) -> tuple[tuple[int, float], ...]:
        """A {token id: bias} mapping in the form `logit_bias` holds."""
        return tuple(sorted((int(t), float(b)) for t, b in bias.items()))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (they need the tokens so far)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def plain(self) -> bool:
        """Whether the request asks for nothing beyond temperature, top-p and top-k: the fast path."""
        return not (self.penalized or self.logit_bias or self.min_p or self.min_tokens
                    or self.logprobs is not None or self.response_format is not None)

    def to_json(self) -> dict:
        out = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": list(self.stop),
            "max_tokens_is_default": self.max_tokens_is_default,
        }
        # The later fields only where they differ from their neutral value: a
        # plain request's row is as it always was, and an old row reads as neutral.
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value != neutral:
                out[name] = _field_json(name, value)
        return out

    @classmethod
    def from_json(cls, data: dict) -> SamplingParams:
        extra = {name: _field_of_json(name, data[name]) for name in _NEUTRAL if data.get(name) is not None}
        return cls(
            max_tokens=int(data["max_tokens"]),
            temperature=float(data.get("temperature", 1.0)),
            top_p=float(data.get("top_p", 1.0)),
            top_k=int(data.get("top_k", 0)),
            seed=data.get("seed"),
            stop=tuple(data.get("stop", ())),
            # Rows stored before the flag existed were always capped, as now a default is.
            max_tokens_is_default=bool(data.get("max_tokens_is_default", True)),
            **extra,
        )


_NEUTRAL: dict[str, object] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": (),
    "min_p": 0.0,
    "min_tokens": 0,
    "ignore_eos": False,
    "stop_token_ids": (),
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "logprobs": None,
    "response_format": None,
}


def _field_json(name: str, value):
    if name == "logit_bias":
        return [[token, bias] for token, bias in value]
    if name == "stop_token_ids":
        return list(value)
    if name == "response_format":
        return value.to_json()
    return value


def _field_of_json(name: str, value):
    if name == "logit_bias":
        return tuple((int(token), float(bias)) for token, bias in value)
    if name == "stop_token_ids":
        return tuple(int(t) for t in value)
    if name == "response_format":
        return ResponseFormat.from_json(value)
    if name in ("min_tokens", "logprobs"):
        return int(value)
    if name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
        return bool(value)
    return float(value)


@dataclass(slots=True, frozen=True)
class Logprob:
    """One token and its log probability; `text` is the token's own text (decoded alone)."""

    token: int
    logprob: float
    text: str


@dataclass(slots=True, frozen=True)
class TokenLogprobs:
    """What a runner reports with each generated token when the request asks for logprobs.

    `chosen` is the generated token; `top` the `logprobs` likeliest tokens,
    likeliest first (the chosen one among them only when it is one of them).
    Log probabilities are of the distribution the token was drawn from (see
    the runner) and never below `LOGPROB_FLOOR`.
    Stored as compact JSON, one array per token: [id, logprob, text, [[id, logprob, text], ...]].
    """

    chosen: Logprob
    top: tuple[Logprob, ...] = ()

    def to_json(self) -> list:
        c = self.chosen
        return [c.token, c.logprob, c.text, [[t.token, t.logprob, t.text] for t in self.top]]

    @classmethod
    def from_json(cls, data: list) -> TokenLogprobs:
        token, logprob, text, top = data
        return cls(Logprob(int(token), float(logprob), text),
                   tuple(Logprob(int(t), float(lp), s) for t, lp, s in top))


@dataclass(slots=True, frozen=True)
class ChatMessage:
    role: str
    content: str
    name: str | None = None  # a participant's name, handed to the chat template
    # An assistant's calls, as OpenAI shapes them: {id, type: "function", function: {name, arguments}}
    # with `arguments` a JSON text.
    tool_calls: tuple[dict, ...] = ()
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant's reasoning, as its answer gave it

    def to_json(self) -> dict:
        out: dict = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out


@dataclass(slots=True, frozen=True)
class ChatRender:
    """What the model's chat template is given besides the messages: the tools (OpenAI's
    `{"type": "function", "function": {name, description, parameters}}`) and the caller's
    `chat_template_kwargs` (with `reasoning_effort` among them when asked)."""

    tools: tuple[dict, ...] = ()
    kwargs: tuple[tuple[str, object], ...] = ()  # sorted by name

    def to_json(self) -> dict | None:
        """None when the template is given nothing more (most requests)."""
        if not self.tools and not self.kwargs:
            return None
        return {"tools": list(self.tools), "kwargs": dict(self.kwargs)}

    @classmethod
    def from_json(cls, data: dict | None) -> ChatRender:
        if not data:
            return cls()
        return cls(tuple(data.get("tools") or ()), tuple(sorted((data.get("kwargs") or {}).items())))


@dataclass(slots=True, frozen=True)
class AnswerOptions:
    """How an answer is shown, beyond the text the engine generates: the API's side of a request.

    A body asking for `n` choices (or, on completions, several prompts) is
    stored as one request a choice; all of them carry the same options.
    `n` is the choices per prompt, so choice `i` answers prompt `i // n`.
    """

    n: int = 1
    prompts: int = 1  # completions: the prompts of the body (a line's choices are prompts x n)
    echo: bool = False  # completions: the prompt before the generated text
    logprobs: bool = False  # show the engine's log probabilities (chat's logprobs, completions' logprobs)
    token_ids: bool = False  # vLLM's return_token_ids: the prompt's and the output's token ids
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:N"
    # Tool calls are read out of the text (tools given, tool_choice not "none"): their names.
    tools: tuple[str, ...] = ()
    # tool_choice required or named: the grammar made the whole text a JSON array of calls.
    forced_tools: bool = False
    tool_parser: str = "auto"  # the family whose syntax calls are read in ("auto": any known one)
    one_call: bool = False  # parallel_tool_calls false: the first call alone is the answer's
    # The rendered prompt left a reasoning block open (the template wrote `<think>` for the model): the
    # answer's text starts inside its reasoning. Stored with the request, so every reader of the answer
    # (a stream, a resumed stream, a batch's results) reads it alike.
    thinking: bool = False

    def __post_init__(self) -> None:
        if self.n < 1 or self.prompts < 1:
            raise ValueError("n and prompts must be >= 1")

    def to_json(self) -> dict:
        """Only what differs from the defaults: most requests store an empty object."""
        default = _DEFAULT_ANSWER
        return {name: getattr(self, name) for name in self.__slots__
                if getattr(self, name) != getattr(default, name)}

    @classmethod
    def from_json(cls, data: dict | None) -> AnswerOptions:
        if not data:
            return _DEFAULT_ANSWER
        values = {name: data[name] for name in cls.__slots__ if name in data}
        if "tools" in values:
            values["tools"] = tuple(values["tools"])
        return cls(**values)


_DEFAULT_ANSWER = AnswerOptions()


@dataclass(slots=True, frozen=True)
class RequestSpec:
    """One validated request, before it is stored: a line of a file, or one choice of it."""

    custom_id: str
    endpoint: Endpoint
    params: SamplingParams
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] = field(default=())
    model: str | None = None  # the name the submitter asked for; echoed in results
    choice: int = 0  # the choice's index within its line (0 for a line of one choice)
    answer: AnswerOptions = _DEFAULT_ANSWER
    render: ChatRender = ChatRender()  # chat: the tools and template options the template is given

    def __post_init__(self) -> None:
        if (self.prompt is None) == (not self.messages):
            raise ValueError("a request has either a prompt or messages, not both")
        if self.choice < 0:
            raise ValueError("choice must be >= 0")
