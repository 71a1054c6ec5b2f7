"""A checkpoint writer that dies mid-write: the crash chapter 07 and ``resume.crash_mid_write`` reproduce.

Writes ``{"step": 2, "weight": <256 KiB of 2.0>}`` to ``--path`` with :func:`helpers.checkpoint.save_checkpoint`
(``--atomic``: temporary file, fsync, rename) or :func:`helpers.checkpoint.naive_save` (``torch.save`` straight
onto the destination), through a file object that ends the process (exit 137, as a SIGKILL would) once
``--die-after-bytes`` bytes are written.  What is on disk afterwards is the evidence: the naive write leaves a
truncated file that does not load, the atomic one leaves the previous checkpoint (or none) and no partial file.

Example:
    python helpers/scenarios/crash_write.py --path build/ckpt.pt --atomic --die-after-bytes 4096
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


class Dying:
    """A file object that dies with the process after ``die_after`` bytes (``os._exit(137)``): a crash mid-write."""

    def __init__(self, fh: Any, die_after: int) -> None:
        self.fh, self.n, self.die_after = fh, 0, die_after

    def write(self, b: bytes) -> int:
        """Write ``b``; past ``die_after`` bytes in all, write up to it, flush, and end the process."""
        if self.n + len(b) > self.die_after:
            self.fh.write(bytes(b)[: self.die_after - self.n])
            self.fh.flush()
            os._exit(137)
        self.n += len(b)
        return self.fh.write(b)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)


def main(argv: list[str] | None = None) -> int:
    """Write the checkpoint and die after ``--die-after-bytes`` (exit 137), or print "write completed" (exit 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Example: python helpers/scenarios/crash_write.py --path build/ckpt.pt --atomic "
                                            "--die-after-bytes 4096")
    parser.add_argument("--path", required=True, help="the checkpoint file to write")
    parser.add_argument("--atomic", action="store_true", help="save_checkpoint (temp file + rename) instead of naive_save")
    parser.add_argument("--die-after-bytes", type=int, required=True, help="bytes written before the process dies (>= 0)")
    args = parser.parse_args(argv)
    if args.die_after_bytes < 0:
        parser.error(f"--die-after-bytes={args.die_after_bytes}: a byte count >= 0")
    import torch

    from helpers import checkpoint

    state = {"step": 2, "weight": torch.full((1 << 16,), 2.0)}
    real = checkpoint._serialize
    checkpoint._serialize = lambda s, fh: real(s, Dying(fh, args.die_after_bytes))
    (checkpoint.save_checkpoint if args.atomic else checkpoint.naive_save)(args.path, state)
    print("write completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
