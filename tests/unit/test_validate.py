"""Unit tests of helpers.validate and of the modules that use it instead of their own copies."""

from __future__ import annotations

import math

import pytest

from helpers import ddp_math, launchers, memory, validate


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "2", None])
def test_positive_int_refuses(value):
    with pytest.raises(ValueError, match=r"^n=.*: must be an integer >= 1$"):
        validate.positive_int(value, "n")


def test_accepted_values_come_back():
    assert validate.positive_int(3, "n") == 3 and validate.positive_int(0, "n", 0) == 0
    assert validate.whole_number(1.3e9, "params") == 1_300_000_000 and isinstance(validate.whole_number(2.0, "x"), int)
    assert validate.tcp_port(65535, "port") == 65535
    assert validate.positive_float(2, "lr") == 2.0
    assert validate.one_of("b", "x", ("a", "b")) == "b"


@pytest.mark.parametrize("value", [1.5, math.inf, math.nan, -1, True, "3"])
def test_whole_number_refuses(value):
    with pytest.raises(ValueError, match="params="):
        validate.whole_number(value, "params")


@pytest.mark.parametrize("value", [0, 65536, True, 29500.0, "29500"])
def test_tcp_port_refuses(value):
    with pytest.raises(ValueError, match=r"master_port=.*1\.\.65535"):
        validate.tcp_port(value, "master_port")


@pytest.mark.parametrize("value", [0, -0.1, math.inf, math.nan, True, "1"])
def test_positive_float_refuses(value):
    with pytest.raises(ValueError, match="base_lr="):
        validate.positive_float(value, "base_lr")


def test_one_of_lists_the_choices():
    with pytest.raises(ValueError, match="kind='x': accepted values are a, b"):
        validate.one_of("x", "kind", ["a", "b"])


def test_callers_use_validate():
    assert launchers.positive_int is validate.positive_int and launchers.tcp_port is validate.tcp_port
    with pytest.raises(ValueError, match="base_lr=0: must be a finite number > 0"):
        ddp_math.linear_scaled_lr(0, 256, 512)
    with pytest.raises(ValueError, match="params=1.5: must be an integer >= 0"):
        memory.estimate(1.5, 2, "ddp")
    with pytest.raises(ValueError, match="params=inf"):
        memory.estimate(math.inf, 2, "ddp")  # used to be an OverflowError
    assert memory.estimate(1.3e9, 2, "ddp").n_params == 1_300_000_000
