"""ddp_uneven.py (chapter 02, D9): the ``--shards`` parser names bad input."""

from __future__ import annotations

import pytest


def test_uneven_shards_bad_input_is_named():
    from helpers.scenarios import ddp_uneven

    assert ddp_uneven.parse_shards("13,8") == [13, 8]
    for bad in ("13,x", "0,8", ""):
        with pytest.raises(ValueError, match="shards"):
            ddp_uneven.parse_shards(bad)
