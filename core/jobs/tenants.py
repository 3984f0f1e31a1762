"""Rules for tenant names and weights, shared by every command that sets them."""

from __future__ import annotations

import math
import re

MAX_WEIGHT = 1e6
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")


def validate_weight(weight: float) -> float:
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ValueError(f"weight must be a number, got {weight!r}")
    weight = float(weight)
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"weight must be a finite number > 0, got {weight}")
    if weight > MAX_WEIGHT:
        raise ValueError(f"weight must be at most {MAX_WEIGHT:g}, got {weight:g}")
    return weight


def validate_tenant_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"tenant name {name!r} is not valid: 1-128 characters of letters, digits "
            "and _ . @ + -, not starting with a punctuation mark"
        )
    return name
