"""How one value of a request body is checked: the kinds the field table names.

Each kind is a small frozen object whose `check(value, limits)` returns the
value as fsched keeps it, or raises `InputError` saying what is wrong (and, for
a value inside an object or array, where: a path relative to the value). Pure:
no I/O, no knowledge of the field it checks, so one kind serves every field of
its shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsched.core.jobs.inputs import InputError, json_type, printable, shown, storable
from fsched.core.jobs.limits import InputLimits

INT64 = 2**63


def same_value(value: Any, neutral: Any) -> bool:
    """JSON equality that keeps booleans apart from numbers (`0` is not `false`)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return isinstance(value, bool) and isinstance(neutral, bool) and value is neutral
    if isinstance(value, int | float) and isinstance(neutral, int | float):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


def integer(value: Any, low: int, high: int, where: str = "") -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"must be an integer, got {json_type(value)}", where)
    if not low <= value <= high:
        raise InputError(f"must be within {low:,}..{high:,}, got {printable(f'{value:,}')}", where)
    return value


@dataclass(slots=True, frozen=True)
class Boolean:
    def check(self, value: Any, limits: InputLimits) -> bool:
        if not isinstance(value, bool):
            raise InputError(f"must be a boolean, got {json_type(value)}")
        return value


@dataclass(slots=True, frozen=True)
class Integer:
    low: int
    high: int | None = None  # None: the limits' max_tokens

    def check(self, value: Any, limits: InputLimits) -> int:
        return integer(value, self.low, limits.max_tokens if self.high is None else self.high)


@dataclass(slots=True, frozen=True)
class Number:
    low: float
    high: float
    low_open: bool = False  # the low end itself is excluded

    def check(self, value: Any, limits: InputLimits) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"must be a number, got {json_type(value)}")
        value = float(value)
        if not math.isfinite(value):
            raise InputError("must be a finite number (this one overflows a float)")
        if not (self.low <= value <= self.high) or (self.low_open and value == self.low):
            bracket = "(" if self.low_open else ""
            raise InputError(f"must be within {bracket}{self.low:g}..{self.high:g}, got {value:g}")
        return value


@dataclass(slots=True, frozen=True)
class Text:
    max_chars: int = 512
    choices: tuple[str, ...] = ()

    def check(self, value: Any, limits: InputLimits) -> str:
        if not isinstance(value, str):
            raise InputError(f"must be a string, got {json_type(value)}")
        if self.choices and value not in self.choices:
            raise InputError(f"must be one of {', '.join(self.choices)}, got {shown(value)}")
        if len(value) > self.max_chars:
            raise InputError(f"longer than {self.max_chars:,} characters")
        return storable(value)


@dataclass(slots=True, frozen=True)
class Seed:
    """Any 64-bit integer, as OpenAI and vLLM take it; a negative one is folded into 0..2^63-1."""

    def check(self, value: Any, limits: InputLimits) -> int:
        return integer(value, -INT64, INT64 - 1) % INT64


@dataclass(slots=True, frozen=True)
class Stop:
    """A stop string or up to `max_stop_sequences` of them."""

    def check(self, value: Any, limits: InputLimits) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise InputError("must be a non-empty string or an array of non-empty strings")
        if len(value) > limits.max_stop_sequences:
            raise InputError(f"at most {limits.max_stop_sequences} stop sequences")
        return tuple(storable(s) for s in value)


@dataclass(slots=True, frozen=True)
class TokenIds:
    """An array of token ids (vLLM's stop_token_ids)."""

    max_items: int = 1024

    def check(self, value: Any, limits: InputLimits) -> tuple[int, ...]:
        if not isinstance(value, list):
            raise InputError(f"must be an array of token ids, got {json_type(value)}")
        if len(value) > self.max_items:
            raise InputError(f"at most {self.max_items:,} token ids")
        return tuple(integer(v, 0, INT64 - 1, f"[{i}]") for i, v in enumerate(value))


@dataclass(slots=True, frozen=True)
class LogitBias:
    """OpenAI's logit_bias: token ids (as JSON object keys) to a bias within -100..100."""

    max_items: int = 1024

    def check(self, value: Any, limits: InputLimits) -> tuple[tuple[int, float], ...]:
        if not isinstance(value, dict):
            raise InputError(f"must be an object of token id -> bias, got {json_type(value)}")
        if len(value) > self.max_items:
            raise InputError(f"at most {self.max_items:,} token ids")
        out: dict[int, float] = {}
        for key, bias in value.items():
            if not key.isdigit() or not key.isascii() or len(key) > 19:
                raise InputError(f"keys must be token ids (non-negative integers), got {shown(key)}")
            token = int(key)
            if token in out:  # "5" and "05": one token, two biases
                raise InputError(f"names token {token} more than once ({shown(key)}); give each token once")
            try:
                out[token] = _BIAS.check(bias, limits)
            except InputError as exc:
                raise exc.within(f".{key}") from None
        return tuple(sorted(out.items()))


_BIAS = Number(-100.0, 100.0)


@dataclass(slots=True, frozen=True)
class Custom:
    """A shape of its own (messages, a response format): `fn(value, limits)` checks it."""

    fn: Callable[[Any, InputLimits], Any]
    shape: str  # what the docs call it

    def check(self, value: Any, limits: InputLimits) -> Any:
        return self.fn(value, limits)


Kind = Boolean | Integer | Number | Text | Seed | Stop | TokenIds | LogitBias | Custom
