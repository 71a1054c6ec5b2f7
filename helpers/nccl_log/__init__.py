"""Read ``NCCL_DEBUG=INFO`` logs: one summary per rank, then verdicts that name the culprit and the fix.

The package (the shape ``helpers/lint/`` has): :mod:`~helpers.nccl_log.reading` (lines -> model),
:mod:`~helpers.nccl_log.model` (:class:`RankInfo`, :class:`NcclLog`), :mod:`~helpers.nccl_log.catalog` (what the
reader knows about each message: the catalog generated from NCCL's, its plugins' and PyTorch's sources by
:mod:`~helpers.nccl_log.generate`, the hand-written failure catalog, the known-bug table by release),
:mod:`~helpers.nccl_log.rules` (verdicts as :class:`helpers.checks.Check` records) and
:mod:`~helpers.nccl_log.reports` (text, JSON, the job hook).

``parse(text)`` turns the interleaved output of any number of ranks and hosts into one
:class:`RankInfo` per process (and GPU): host, NCCL version, bootstrap interface, network
(IB or sockets) and its devices, the transport of every channel connection, ``Init COMPLETE``
and the WARN lines.  ``interpret(log)`` turns that into :class:`helpers.checks.Check` records (status,
ranks and hosts involved in ``values``, evidence lines, the fix as ``remediation``, and whether the verdict states a
cause or names a suspect); ``render`` prints both as text; the
``nccl-log FILE [FILE...] [--json]`` command does all three (exit 1 when a verdict is FAIL).

Lines it reads (prefixes and timestamps before them are ignored, except these labels):

* NCCL's own prefix ``host:pid:tid [cudaDev] [file.cc:line] NCCL INFO|WARN msg``; a rank is
  keyed ``host:pid[cudaDev]``.
* torchrun's ``[rank3]:`` / ``[default0]:`` labels, the project's ``[rank 3] `` (helpers.jobs),
  and ``host: `` labels (pdsh/srun style, as in the Gilbreth guide's 8.9 excerpt).
* Excerpts without any prefix (``NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct``,
  as the Gilbreth guide quotes them): keyed ``rank0`` from the rank the line names (for a
  channel line, the sender, or the receiver of a ``[receive]`` line); known NCCL messages
  without ``NCCL INFO`` (``Bootstrap : no socket interface found`` as torch's "Last error:"
  quotes it) are read too.  A bare ``NCCL version 2.x`` line (NCCL 2.19+ prints it without a
  prefix) goes to the rank of the line before it; other lines that name no rank go to
  :attr:`NcclLog.unattributed`.
* Lines starting with ``#`` are comments (the sample logs under tests/data/nccl/ use them).

Formats follow NCCL's source (https://github.com/NVIDIA/nccl: ``src/bootstrap.cc`` prints
``Bootstrap : Using%s`` and warns ``Bootstrap : no socket interface found`` /
``NET/Socket : No usable listening interface found``; ``src/init.cc`` prints the three
``... - Init COMPLETE`` forms of 2.1x (``comm %p rank %d nranks %d cudaDev %d busId %lx``),
2.18-2.20 (``... nvmlDev %d busId %lx commId 0x%llx``) and 2.21+ (``ncclCommInitRank comm ...``
/ ``ncclCommSplit comm ...``), ``comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d
MNNVL %d`` and ``Mismatched NCCL version detected : rank %d version %d rank %d version %d``;
``NET/IB : No device found.`` comes from the IB transport) and real logs quoted in
https://github.com/NVIDIA/nccl/issues/286, /issues/952, /issues/1053, /issues/1504,
/issues/1609, /issues/1814, https://github.com/NVIDIA/nccl-tests/issues/273,
https://github.com/pytorch/pytorch/issues/68893, https://github.com/sgl-project/sglang/issues/3820
and https://github.com/espnet/espnet/issues/1940.  Verdicts and fixes cite the seeds
MN1, MN2, Gilbreth 4.1, Gilbreth 6.3, Gilbreth 8.3, Gilbreth 8.12, Gilbreth 9.2, Gilbreth 9.4 (docs/sources.md).

Known failure messages (``/dev/shm`` full, ``Duplicate GPU detected``, NVLS/fabric manager, CUDA
802, ``AF_INET`` family errors, IB completion errors, ``wrong type 4 != 3``...) come from a catalog
in data, ``helpers/data/nccl_catalog.yaml`` (:func:`load_catalog`), each entry backed by a public
issue whose cause was confirmed; cross-host verdicts compare networks, net plugins, announced and
dialled addresses, hostnames (hosts are told apart by host + pid + bootstrap address) and
``NCCL_HOSTID``.  Inputs are streamed (``-`` is stdin) with bounded memory; an unreadable input is
reported in one line while the others are read (issue 15; docs/nccl-log.md has the scored corpus).

Nothing runs at import; the standard library only, plus PyYAML when the catalog is first loaded.
"""

from __future__ import annotations

from helpers.nccl_log.catalog import CATALOG_PATH, load_catalog, load_sites, load_versions, match_site
from helpers.nccl_log.model import (
    SEVERITIES,
    STAGES,
    TOPOLOGIES,
    CatalogHit,
    Channel,
    Iface,
    InitComplete,
    NcclLog,
    RankInfo,
    bad_interface_reason,
)
from helpers.nccl_log.reading import collector_paused, parse, parse_files
from helpers.nccl_log.reports import checks_for_job, render, to_json
from helpers.nccl_log.rules import KINDS, interpret, verdict

__all__ = ["CATALOG_PATH", "KINDS", "SEVERITIES", "STAGES", "TOPOLOGIES", "CatalogHit", "Channel", "Iface",
           "InitComplete", "NcclLog", "RankInfo", "bad_interface_reason", "checks_for_job", "collector_paused", "interpret",
           "load_catalog", "load_sites", "load_versions", "match_site", "parse", "parse_files", "render",
           "to_json", "verdict"]
