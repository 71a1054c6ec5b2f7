"""Argument checks shared by every module: each returns the value or raises ``ValueError`` naming the field.

The message always has the form ``NAME=value: must be ...`` so that a user who typed the value
(a notebook parameter, a CLI flag, a widget field) sees which one and what is accepted.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def positive_int(value: object, name: str, minimum: int = 1) -> int:
    """``value`` when it is an int (not a bool) >= ``minimum``.

    Raises:
        ValueError: ``NAME=value: must be an integer >= minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
    return value


def whole_number(value: object, name: str, minimum: int = 0) -> int:
    """``value`` as an int when it is an int or an integral float (``1.3e9``) >= ``minimum``.

    For counts typed in scientific notation (parameter counts); bools are refused.

    Raises:
        ValueError: ``NAME=value: must be an integer >= minimum``.
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and (not math.isfinite(value) or value != int(value)))
            or int(value) < minimum):
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
    return int(value)


def tcp_port(value: object, name: str) -> int:
    """``value`` when it is an int (not a bool) in 1..65535.

    Raises:
        ValueError: ``NAME=value: must be an integer in 1..65535``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{name}={value!r}: must be an integer in 1..65535")
    return value


def positive_float(value: object, name: str) -> float:
    """``value`` as a float when it is a finite number > 0 (bools refused).

    Raises:
        ValueError: ``NAME=value: must be a finite number > 0``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name}={value!r}: must be a finite number > 0")
    return float(value)


def one_of(value: T, name: str, choices: Iterable[T]) -> T:
    """``value`` when it is one of ``choices``.

    Raises:
        ValueError: ``NAME=value: accepted values are a, b, c``.
    """
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name}={value!r}: accepted values are {', '.join(str(c) for c in options)}")
    return value
