"""Reading ``NCCL_DEBUG=INFO`` output into the model: :func:`parse` (a string) and :func:`parse_files` (files, stdin).

The lines it reads, the prefixes it strips and how a line is attributed to a rank are described in
:mod:`helpers.nccl_log`.  Files come in through :func:`_feed_one` (regular files only, bounded, BOM stripped,
stdin read whole).
"""

from __future__ import annotations

import gc
import io
import itertools
import operator
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from helpers import inputs
from helpers.nccl_log.catalog import _CATALOG_KEYS, _catalog_regex, load_catalog, load_sites, match_site
from helpers.nccl_log.model import (
    _CHANNELS_MAX,
    _EVIDENCE_MAX,
    _KEEP_MAX,
    _LINE_MAX,
    _MEMO_MAX,
    _READ_MAX,
    _SCAN_MAX,
    _STAGE_INDEX,
    CatalogHit,
    Channel,
    Iface,
    InitComplete,
    NcclLog,
    RankInfo,
    _cut,
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MARK = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b ?")
# NCCL <= 2.3 printed WARN lines without the NCCL marker: "include/socket.h:344 WARN Socket creation failed"
_OLD_WARN = re.compile(r"(?:^|\s)[\w/.\-]+\.(?:cc|cu|h|c|cpp):\d+ WARN ")
_RECONSTRUCTED = "  # reconstructed"
# the prefix may end in a bare "INFO " marker (no "NCCL"), as in the NCCL 2.4-era excerpt of NVIDIA/nccl#187.
# The look-behind only skips starts inside a host name: a match there would extend one character to the left, so the
# leftmost match is the same, found in one pass instead of one per character of every word.
_PREFIX = re.compile(r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>\S+:\d+) )?"
                     r"(?:(?:INFO|WARN) )?$")
_BARE_HEAD = re.compile(
    r"(?:(?<=\s)|(?<=:)|^)(?:Bootstrap ?: |NET/[\w.\-]+ ?: |(?:Channel|Ring) \d+(?:/\d+)? : \d+\[|"
    r"(?:\w+ )?comm \S+ rank \d+ n[Rr]anks \d+|NCCL version \d|socket\w+: |Call to connect |"
    r"Mismatched NCCL version )")
_PREFIX_ANY = re.compile(r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
_LABEL_RANK = re.compile(r"\[rank(\d+)\]:|\[rank (\d+)\]")
_LABEL_LOCAL = re.compile(r"\[(default\d+)\]:")
_JOINED = re.compile(r"(?:\S+:\d+:\d+ )?\[\d+\] NCCL (?:INFO|WARN) ")
"""The head of an NCCL line (``host:pid:tid [0] NCCL INFO ``, or ``[0] NCCL INFO `` as some pastes show it): a second
one inside a physical line starts another NCCL line (a log pasted where the newlines were lost, an issue comment
rendered as one paragraph)."""


_HEADS = operator.methodcaller("count", "] NCCL ")
"""How many NCCL heads (``[0] NCCL INFO``: a closing bracket, then NCCL) a line holds; one for an NCCL line."""


_UNJOIN_BATCHES = 16
"""Blocks of an input (256 KiB each, :data:`helpers.inputs._TEXT_CHUNK`: the first 4 MiB) searched for joined lines."""


def _unjoin(batch: list[str]) -> list[str]:
    """``batch`` with each line that holds several NCCL lines (a second :data:`_JOINED` head) split before each head
    after the first; the same list when none does (one ``str.count`` per line through ``map``)."""
    if max(map(_HEADS, batch), default=0) < 2:
        return batch
    out: list[str] = []
    for line in batch:
        starts = [m.start() for m in _JOINED.finditer(line)] if _HEADS(line) > 1 else []
        if len(starts) < 2:
            out.append(line)
            continue
        cuts = [0, *starts[1:], len(line)]
        out.extend(line[a:b].rstrip() for a, b in zip(cuts, cuts[1:]))
    return out


_QUOTE_LABEL = re.compile(r"^\s*\[(?:rank\s?\d+|default\d+)\]:\s*")
"""torch's rank label before a line it prints (``[rank0]: ``), dropped from the message torch's ``Last error:`` quotes."""
_LABEL_HOST = re.compile(r"(?:^|\s)([A-Za-z][\w.\-]*): *$")

_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+(?:\+[\w.]+)?)")
_DRIVER = re.compile(r"^cudaDriverVersion (\d+)")
# "NCCL_X set by environment to V" (NCCL_PARAM, socket.cc...) and "NCCL_IB_HCA set to V" (net_ib.cc since 2.8)
_ENV = re.compile(r"^(NCCL_\w+) set (?:by environment to (\S+?)|to (\S.*?))\.?$")
# a pasted command line that sets NCCL variables: "NCCL_DEBUG=INFO NCCL_IB_HCA='^=mlx5_8' srun ...",
# "export NCCL_SOCKET_IFNAME=eth0", "$ env NCCL_P2P_DISABLE=1 torchrun ..." (the run's own settings, as typed)
_CMD_ENV = re.compile(r"^\s*(?:\$\s*)?(?:export\s+|env\s+)?(?:[A-Za-z_]\w*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)*NCCL_\w+=")
_ENV_ASSIGN = re.compile(r"(?:^|\s)(?:export\s+|env\s+)?(NCCL_\w+)=('[^']*'|\"[^\"]*\"|[^\s;&|]*)")
_GID = re.compile(r"\bGID (\d+) \(([0-9A-Fa-f]+)/([0-9A-Fa-f]+)\)")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (.+)$")
_NET_USING = re.compile(r"^NET/(?P<net>[\w.\-]+) ?: Using(?: (?!interface )(?P<devs>.+))?$")
_OLD_SIDEBAND = re.compile(r"^NET/IB ?: Using interface (\S+) for sideband")
_OLD_NET_IFACE = re.compile(r"^NET ?: Using interface (\S+)")
_OLD_INTERNAL = re.compile(r"^Using internal Network (\w+)")
_PLUGIN_OK = re.compile(r"^NET/Plugin ?: ?(?:Loaded|Plugin loaded|Using) (?!internal)|^Using network (?:IBext|AWS|Libfabric|COLLNET)")
_PLUGIN_NONE = re.compile(r"^NET/Plugin ?: ?(?:No plugin found|Plugin load \(?\S*\)? ?returned|Failed to find|dlerror|Could not find:)")
_IB_NODEV = re.compile(r"^NET/IB ?: No device found")
_NETWORK = re.compile(r"^Using network (\S+)")
_IFACE = re.compile(r"(?<!\S)(?:\[(?P<idx>\d+)\])?(?P<name>[^\s:\[\];]+):(?P<addr>\S+)")
_INIT = re.compile(r"(?:^|\s)comm (?P<comm>\S+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)\b(?P<rest>.*?)"
                   r"- Init (?P<what>COMPLETE|START)", re.IGNORECASE)
_TOPO = re.compile(r"(?:^|\s)comm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
                   r"localRanks (?P<local>\d+)")
_CUDADEV = re.compile(r"\bcudaDev (\d+)")
_LOCALRANKS = re.compile(r"\blocalRanks (\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_CHANNEL = re.compile(r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<sdev>[0-9a-fA-F]+)\] -> "
                      r"(?P<dst>\d+)\[(?P<ddev>[0-9a-fA-F]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$")
_MISMATCH = re.compile(r"Mismatched NCCL version detected : rank (\d+) version (\d+) rank (\d+) version (\d+)")
_CONNECT_REASONS = ("Connection refused", "No route to host", "Network is unreachable", "Connection timed out",
                    "Software caused connection abort")
_CONNECT_ANY = re.compile("|".join(re.escape(r) for r in _CONNECT_REASONS) + r"|[Cc]onnect to \S+ failed")
_DIALED = re.compile(r"[Cc]onnect to (\S+?)<(\d+|[^>]{0,8})>")  # the port, or what an excerpt left of it (<...>)
_NO_IFACE = re.compile(r"Socket creation failed : Address family not supported|Bootstrap ?: no socket interface found|NET/Socket ?: No usable listening interface found|"
                       r"NET/Socket ?: no interface found|No interface found in the same subnet")
_IBVERBS = re.compile(r"Failed to open libibverbs")
_ABORT = re.compile(r"Abort COMPLETE")
_S_BOOTSTRAP, _S_NETWORK, _S_INIT, _S_CHANNELS, _S_COMPLETE = (
    _STAGE_INDEX[n] for n in ("bootstrap", "network", "init-start", "channels", "init-complete"))
_ERROR_CHAIN = re.compile(r"^(?:[\w/]+/)?(\w+)\.(?:cc|cu|h):\d+ -> [1-9]\d*\b")
# what _Parser._plan says a line is (compared by identity in the loop)
_SKIP, _SUMMARY, _OTHER, _NCCL = "skip", "summary", "other", "nccl"
_PLAN_SKIP, _PLAN_SUMMARY = (_SKIP,), (_SUMMARY,)
_TESTS_RANK = "tests-rank"
_TESTS_RANK_LINE = re.compile(r"#\s+Rank\s+(\d{1,7})\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s")
"""nccl-tests' device table, one line per rank of the whole job, gathered to rank 0 in rank order before it prints
(src/common.cu: ``"#  Rank %2d Group %2d Pid %6d on %10s device %2d ..."`` after ``MPI_Gather``)."""
_PLAN_MAX = 16384           # distinct lines whose plan _Parser.feed keeps (then the table starts again)
_PLAN_LINE_MAX = 512        # longer lines are planned each time (a kept plan holds the line about three times)
# events that a second reading of the same line for the same rank leaves as they are: deduplicated lists and sets
# (error chain, channels, GIDs), maxima (topology: nranks, nodes, local ranks, stage), the plugin flag (once True,
# stays True); the other kinds count or assign, and are replayed
_ONCE_PER_RANK = frozenset({"chain", "channel", "gid", "topo", "plugin"})

def _ifaces(text: str) -> list[Iface]:
    """Interfaces of a ``[0]eth0:10.0.0.1<0> [1]ib0:...`` or ``eth0:10.0.0.1<0>`` list."""
    out = []
    for m in _IFACE.finditer(text):
        out.append(Iface(m["name"], m["addr"], int(m["idx"]) if m["idx"] is not None else None))
    return out


def _keep(bucket: list[str], line: str) -> None:
    """Append ``line`` unless ``bucket`` already holds ``_KEEP_MAX`` lines (bounded memory)."""
    if len(bucket) < _KEEP_MAX:
        bucket.append(line)



class _Parser:
    """Accumulates lines of one or more inputs into an :class:`NcclLog`."""

    def __init__(self) -> None:
        self.log = NcclLog()
        self._rank_from_label: dict[str, int] = {}
        self._label_to_key: dict[int, str] = {}
        self._local_label_last: dict[str, str] = {}
        self._best_nranks: dict[str, int] = {}
        # memo tables (bounded): big logs repeat the same heads and messages millions of times
        self._heads: dict[str, tuple] = {}
        self._hits: dict[str, tuple] = {}      # ckey -> _memo()
        # head ("host:pid:tid [dev] ", with any label) -> its rank, for heads whose attribution never changes
        # (NCCL's prefix, no torchrun local label); _rank_of_pre holds the heads that are a prefix alone, by the prefix
        # without its "] "; cleared by finish(), which merges records
        self._rank_of: dict[str, RankInfo] = {}
        self._rank_of_pre: dict[str, RankInfo] = {}
        self._plans: dict[str, tuple] = {}     # input line -> _plan(line), for lines up to _PLAN_LINE_MAX characters
        self.nul_line = 0   # line number of the first NUL byte in the last input fed (0: none)

    def _info(self, key: str | None, host: str | None = None, pid: int | None = None,
              dev: int | None = None) -> RankInfo:
        if key is None:
            return self.log.unattributed
        info = self.log.ranks.get(key)
        if info is None:
            info = self.log.ranks[key] = RankInfo(key=key, host=host, pid=pid, cuda_dev=dev)
        return info

    def feed(self, lines: Iterable[str], source: str) -> int:
        """Read ``lines`` one at a time (a file object or :class:`helpers.inputs.Lines` streams); return how many were
        NCCL or catalog lines.

        Lines longer than ``_READ_MAX`` characters are cut; nothing but counters and a few
        examples per kind is kept, so memory stays bounded on a log of any size.  The loop is the
        hot path of a 200 MB log (2.3 M lines), and big logs repeat their lines: everything that depends on a
        line's text alone (comment or not, the prefix, the catalog hit, the NCCL split, the events, which memo table
        holds its head's rank) is worked out once per distinct line (:meth:`_plan`, kept in ``_plans``, bounded), so
        a line seen before costs one dict lookup on its text plus what it changes: the rank its head maps to
        (``_rank_of``, ``_rank_of_pre``, else :meth:`_attribute`), the counters, the events (channel and error-chain
        lines, the most frequent, recorded here, the others by :meth:`_apply`) and the catalog/site hits
        (:meth:`_hit`).  A line read again for the same rank replays only what counts or assigns (the bounded lists,
        sets and maxima hold its part already; ``_ONCE_PER_RANK``), and when its head is in the rank table the
        plan keeps that rank (the plans are dropped with the table when it starts again).  The state that carries
        from line to line (the previous line's rank, torch's ``Last error:``, a ``Using`` line whose interface list
        may wrap) is the same whether the plan came from the table or was just made; the test
        ``test_a_line_read_again_counts_as_if_read_fresh`` compares the log with the one read without plans.

        Why a table of our own rather than :func:`functools.lru_cache` on :meth:`_plan`: a plan carries mutable
        per-parser state (``done``), must be dropped with the rank tables, and a dict lookup inlined in the loop costs
        less than a cached call per line.
        """
        self.log.sources.append(source)
        base = self.log.lines_seen      # line numbers count over all inputs (CatalogHit.first)
        previous: str | None = None
        count = nccl = seen = unparsed = reconstructed = 0
        last_error = False
        using: tuple[RankInfo] | None = None
        stop = False
        self.nul_line = 0
        log = self.log
        plans, make_plan = self._plans, self._plan
        apply, attribute, add_hit = self._apply, self._attribute, self._hit
        catalog, sites = log.catalog, log.sites
        try:
            # a file's lines come a chunk at a time (Lines.batches: no per-line generator, no UCS-4 round trip)
            if isinstance(lines, inputs.Lines):
                batches = lines.batches()
                # NCCL lines pasted without their newlines are a hand-made excerpt: looked for in the first
                # _UNJOIN_BATCHES blocks only (a machine-written log keeps its newlines; a count per line of the
                # whole 200 MB log was ~0.6 s of its read)
                head = map(_unjoin, itertools.islice(batches, _UNJOIN_BATCHES))
                stream = itertools.chain.from_iterable(itertools.chain(head, batches))
            else:
                stream = itertools.chain.from_iterable(map(_unjoin, ([line] for line in lines)))
            for seen, raw in enumerate(stream, 1):
                if stop:
                    seen -= 1
                    break
                plan = plans.get(raw)
                if plan is None:
                    if "\x00" in raw:          # NUL bytes: a preallocated or crash-truncated file; the text ends here
                        self.nul_line = seen
                        raw = raw.split("\x00", 1)[0]
                        stop = True            # read what precedes the NULs on this line, then stop
                        if not raw.strip():
                            break
                        plan = make_plan(raw)
                    else:
                        plan = make_plan(raw)
                        if len(raw) <= _PLAN_LINE_MAX:
                            if len(plans) >= _PLAN_MAX:
                                plans.clear()
                            plans[raw] = plan
                if plan[0] is _NCCL:
                    _, cache, hkey, cut, events, extra, parsed, bare, replay, done = plan
                    nccl += 1
                    info = done[0]
                    if info is not None:
                        # read before, for the rank its head always names (_rank_of): what the line adds to bounded
                        # lists and sets, the stage, the ranks and hosts of its hits are there already; only counters
                        # and assignments are replayed
                        previous = info.key
                        info.lines += 1
                        info.last_line = cut
                        if events:
                            for event in replay:
                                apply(info, event, cut)
                        else:
                            unparsed += 1
                        if extra is None:       # the common line: no WARN, no hit, no "Using", no "Last error:"
                            last_error = False
                            using = None
                        else:
                            again, last_error, warn, says_using, hit, site, line = extra
                            reconstructed += again
                            if warn:
                                info.warn_count += 1
                                if len(info.warns) < _KEEP_MAX:
                                    info.warns.append(cut)
                            using = (info,) if says_using else None
                            if hit is not None:
                                info.catalog[hit] += 1
                                done[2].count += 1
                            if site is not None:
                                done[3].count += 1
                        continue
                    info = cache.get(hkey)
                    fixed = info is not None
                    if fixed:
                        previous = info.key
                    else:
                        previous, info, fixed = attribute(parsed, bare, previous)
                        if fixed:
                            if len(cache) >= _MEMO_MAX:
                                cache.clear()
                                plans.clear()       # the ranks their plans keep were found through that table
                            cache[hkey] = info
                    info.lines += 1
                    info.last_line = cut
                    again_for = done[1] is info     # read before for this rank (a head that names no rank)
                    if events:
                        if again_for:
                            for event in replay:
                                apply(info, event, cut)
                        else:
                            for event in events:
                                kind = event[0]
                                if kind == "chain":
                                    chain = info.error_chain
                                    if len(chain) < _KEEP_MAX and event[1] not in chain:
                                        chain.append(event[1])
                                elif kind == "channel":
                                    channel_keys = info._channel_keys
                                    if event[2] not in channel_keys and len(channel_keys) < _CHANNELS_MAX:
                                        channel_keys.add(event[2])
                                        ch: Channel = event[1]
                                        info.channels.append(Channel(ch.channel, ch.conn, ch.src, ch.dst,
                                                                     ch.direction, ch.via, cut, ch.src_dev, ch.dst_dev))
                                    if info.stage < _S_CHANNELS:
                                        info.stage = _S_CHANNELS
                                else:
                                    apply(info, event, cut)
                    else:
                        unparsed += 1
                    if extra is None:
                        last_error = False
                        using = None
                    else:
                        again, last_error, warn, says_using, hit, site, line = extra
                        reconstructed += again
                        if warn:
                            info.warn_count += 1
                            if len(info.warns) < _KEEP_MAX:
                                info.warns.append(cut)
                        using = (info,) if says_using else None
                        if hit is not None:
                            counts = info.catalog
                            counts[hit] = counts.get(hit, 0) + 1
                            if again_for:
                                done[2].count += 1
                            else:
                                done[2] = add_hit(catalog, hit, line, info, base + seen)
                        if site is not None:
                            if again_for:
                                done[3].count += 1
                            else:
                                done[3] = add_hit(sites, site, line, info, base + seen)
                    done[0 if fixed else 1] = info
                elif plan[0] is _OTHER:
                    _, again, ckey, site_none, ends_last_error, wrapped, hit, where, line, cut = plan
                    reconstructed += again
                    if last_error and site_none:
                        # the line after torch's "Last error:" is an NCCL message quoted without prefix or marker
                        entry = match_site(_QUOTE_LABEL.sub("", ckey, count=1))  # "[rank0]: Failed to CUDA calloc ..."
                        if entry is not None:
                            add_hit(sites, entry["index"], line, log.unattributed, base + seen)
                            count += 1
                    last_error = ends_last_error
                    if using is not None and wrapped:
                        using[0].socket_ifaces += _ifaces(line)     # an interface list wrapped onto its own lines
                        _keep(using[0].evidence_lines, cut)
                    elif hit is not None:
                        count += 1
                        info = self._info(*where) if where is not None else log.unattributed
                        info.lines += 1
                        info.last_line = cut
                        counts = info.catalog
                        counts[hit] = counts.get(hit, 0) + 1
                        add_hit(catalog, hit, line, info, base + seen)
                elif plan[0] is _SUMMARY:
                    log.nccl_tests_summaries += 1
                    count += 1
                elif plan[0] is _TESTS_RANK:
                    log.nccl_tests_ranks[plan[1]] = plan[2]
        finally:
            log.lines_seen += seen
            log.nccl_lines += nccl
            log.unparsed_count += unparsed
            log.reconstructed += reconstructed
        return count + nccl

    def _plan(self, raw: str) -> tuple:
        """What one input line (``raw``, NUL bytes already cut off) means on its own, for :meth:`feed` to apply.

        A pure function of the text (it fills only the memo tables), so :meth:`feed` keeps it per distinct line.

        Returns one of ``(_SKIP,)`` (blank or a ``#`` comment), ``(_SUMMARY,)`` (nccl-tests' ``# Avg bus
        bandwidth``), ``(_TESTS_RANK, rank, host)`` (a line of nccl-tests' device table), ``(_OTHER, reconstructed, ckey, no site matched, ends in "Last error:", a wrapped interface
        list, catalog id or None, _info arguments of its prefix or None, line, line cut to _LINE_MAX)`` (not NCCL
        output) or ``(_NCCL, memo table of its head's rank, key in that table, line cut to _LINE_MAX, events, extra,
        the head parsed (:func:`_parse_head`), what the message says when the head names no rank, the events a second
        reading for the same rank replays, done)``, ``extra`` being None or ``(reconstructed, ends in "Last error:",
        is a WARN, ends in "Using", catalog id or None, site index or None, line)`` and ``done`` the mutable ``[the rank
        every reading of the line belongs to (its head is in the memo table) once the line was read for it, the rank
        it was last read for otherwise, its catalog CatalogHit, its site CatalogHit]`` that :meth:`feed` keeps.  ``ckey`` is the text after the ``host:pid:tid [dev] `` prefix (the whole line when there is
        none), cut to ``_SCAN_MAX``; the head is the text before NCCL's marker (with the prefix); ``reconstructed``
        (0 or 1): the line carried the corpus' ``# reconstructed`` note, cut off here.
        """
        line = raw.rstrip()
        if len(line) > _READ_MAX:       # the same as cutting raw first: what the cut leaves out is not blank
            line = raw[:_READ_MAX].rstrip()
        if "\x1b" in line:
            line = _ANSI.sub("", line).rstrip()
        if not line:
            return _PLAN_SKIP
        first = line[0]
        if first in "# \t" and (first == "#" or line.lstrip().startswith("#")) and \
                not line.startswith("# NCCL Tests compiled with NCCL"):  # the header's version line is read
            # nccl-tests' summary is not a comment
            if line.startswith("# Avg bus bandwidth"):
                return _PLAN_SUMMARY
            table = _TESTS_RANK_LINE.match(line)
            return (_TESTS_RANK, int(table.group(1)), table.group(2)) if table else _PLAN_SKIP
        reconstructed = 0
        if _RECONSTRUCTED in line:
            line = line.split(_RECONSTRUCTED, 1)[0].rstrip()
            reconstructed = 1
        # a "host:pid:tid [dev] " prefix ends at the first "] " within 200 characters; not one: a bare
        # "Channel 00 : 0[0] -> ..." line, a label "[rank0]:" alone, or NCCL's marker before it
        pre: str | None
        pre, sep, tail = line.partition("] ")
        if sep and len(pre) <= 198 and "NCCL" not in pre and " : " not in pre and " [" in pre:
            ckey = tail if len(tail) <= _SCAN_MAX else tail[:_SCAN_MAX]
        else:
            pre, tail = None, line
            ckey = line if len(line) <= _SCAN_MAX else line[:_SCAN_MAX]
        memo = self._hits.get(ckey)
        if memo is None:
            memo = self._memo(ckey, _catalog_regex())
        hit, rel, events, site, says_using, bare, ends_last_error, replay = memo
        ends_last_error = ends_last_error if ckey is tail else line.endswith("Last error:")
        cut = line if len(line) <= _LINE_MAX else _cut(line)
        if rel is None:
            wrapped = first == "[" and _WRAPPED.match(line) is not None
            where = None
            if hit is not None:
                pm = _PREFIX_ANY.search(line[:300]) if line.find("] ", 0, 300) >= 0 else None
                if pm:
                    where = (f"{pm['host']}:{pm['pid']}[{pm['dev']}]", pm["host"], int(pm["pid"]), int(pm["dev"]))
            return _OTHER, reconstructed, ckey, site is None, ends_last_error, wrapped, hit, where, line, cut
        before = rel[0]
        if pre is not None and not before:
            cache, hkey, head = self._rank_of_pre, pre, pre + "] "
        else:
            head = (pre + "] " + before) if pre is not None else before
            cache, hkey = self._rank_of, head
        tail = head[-300:]
        parsed = self._heads.get(tail)
        if parsed is None:
            parsed = _parse_head(tail)
            if len(self._heads) >= _MEMO_MAX:
                self._heads.clear()
            self._heads[tail] = parsed
        extra = None
        if reconstructed or ends_last_error or rel[2] or says_using or hit is not None or site is not None:
            extra = (reconstructed, ends_last_error, rel[2], says_using, hit, site, line)
        return _NCCL, cache, hkey, cut, events, extra, parsed, bare, replay, [None, None, None, None]

    def _memo(self, ckey: str, catalog: re.Pattern[str]) -> tuple:
        """What a line's text after its prefix (``ckey``) means, worked out once per distinct text (bounded).

        Returns ``(catalog entry id or None, NCCL split of ckey or None, events of its message, generated-site index or
        None, the message ends in "Using" (a wrapped interface list may follow), (rank key the message names or None,
        it carries a version), ckey ends in "Last error:", the events a second reading of the line for the same rank
        replays)``; the pair is how :meth:`_attribute` places a line whose head names no rank.
        """
        hit = None
        if any(word in ckey for word in _CATALOG_KEYS):
            m = catalog.search(ckey)
            entry = load_catalog()[int(m.lastgroup[1:])] if m and m.lastgroup else None
            if entry is not None and entry["last_resort"]:
                m = _catalog_regex(last_resort=False).search(ckey)
                entry = load_catalog()[int(m.lastgroup[1:])] if m and m.lastgroup else entry
            hit = entry["id"] if entry is not None else None
        rel = None
        if "NCCL" in ckey or "WARN " in ckey or _BARE_HEAD.search(ckey[:600]):
            rel = self._split(ckey)
        events = _classify(rel[1][:_SCAN_MAX]) if rel is not None else []
        if len(self._hits) >= _MEMO_MAX:
            self._hits.clear()
        site = None
        if rel is not None and (rel[2] or any(w in rel[1] for w in _SITE_INFO_WORDS)):
            # a bare message (torch's "Last error:" quotes a WARN without its marker) may come from any level; a WARN
            # line reads a WARN site first (one format can be printed at both levels: mlx5dvsymbols.cc's "dlvsym
            # failed on %s" is a WARN for a required symbol, an INFO for an optional one)
            message = rel[1][:_SCAN_MAX]
            if "NCCL INFO" in ckey:
                entry = match_site(message, "INFO")
            elif "NCCL WARN" in ckey:
                entry = match_site(message, "WARN") or match_site(message)
            else:
                entry = match_site(message)
            site = entry["index"] if entry is not None else (-1 if rel[2] else None)
        bare = (_content_key(events), any(e[0] == "version" for e in events))
        memo = self._hits[ckey] = (hit, rel, events, site, rel is not None and rel[1][-5:] == "Using", bare,
                                   ckey.endswith("Last error:"),
                                   tuple(event for event in events if event[0] not in _ONCE_PER_RANK))
        return memo

    def _hit(self, table: dict, key: str | int, line: str, info: RankInfo, seq: int) -> CatalogHit:
        """Count one line (input line ``seq``, printed by ``info``'s rank) under ``key`` of ``table``.

        ``table`` is :attr:`NcclLog.catalog` (``key``: the id of the hand-written entry that matched) or
        :attr:`NcclLog.sites` (``key``: the index of the generated site that printed it, -1 for a WARN line no site
        matches).  The :class:`CatalogHit` keeps the count, a few evidence lines, and the ranks and hosts that printed
        it (bounded); the catalog's per-rank count (``info.catalog``) is the caller's.  Returns the hit.

        Once a line was counted for a rank, the same line from the same rank adds only to ``count``: its evidence line,
        rank and host are in the bounded lists already, or those lists are full (:meth:`feed` counts it so).
        """
        hit = table.get(key)
        if hit is None:
            if table is self.log.catalog:
                entry = next(e for e in load_catalog() if e["id"] == key)
            else:
                entry = load_sites()["entries"][key] if key >= 0 else {"index": -1}
            hit = table[key] = CatalogHit(entry)
        count = hit.count
        if not count:
            hit.first = seq
        hit.count = count + 1
        evidence = hit.evidence
        if len(evidence) < _EVIDENCE_MAX:
            cut = line if len(line) <= _LINE_MAX else _cut(line)
            if cut not in evidence:
                evidence.append(cut)
        keys = hit.keys
        if len(keys) < _KEEP_MAX:
            rank_key = info.key
            if rank_key not in keys:
                keys.append(rank_key)
                hit.firsts[rank_key] = seq
        host = info.host
        if host and len(hit.hosts) < _KEEP_MAX and host not in hit.hosts:
            hit.hosts.append(host)
        return hit

    @staticmethod
    def _split(line: str) -> tuple[str, str, bool] | None:
        """(text before the message, the message, is-a-WARN) or None when the line is not NCCL output."""
        m = _MARK.search(line)
        if m:
            return line[:m.start()], line[m.end():].strip(), m.group(1) == "WARN"
        o = _OLD_WARN.search(line[:300])
        if o:
            cut = o.end() - len("WARN ")
            return line[:cut], line[o.end():].strip(), True
        b = _BARE_HEAD.search(line[:600])
        if b:
            return line[:b.start()], line[b.start():].strip(), False
        if "NCCL_" in line and _CMD_ENV.match(line):
            return "", line.strip(), False
        return None

    def _attribute(self, parsed: tuple, bare: tuple[str | None, bool],
                   previous: str | None) -> tuple[str | None, RankInfo, bool]:
        """The key and record of the rank a line belongs to (labels, prefix, content, the previous line), and whether
        every line with this head belongs there (NCCL's prefix, no torchrun local label: the caller remembers it).

        ``parsed`` is the line's head (the text before NCCL's marker, its last 300 characters) as :func:`_parse_head`
        reads it; ``bare`` is what the message says when the head names no rank: ``(rankN key its content names, it
        carries the NCCL version)`` (:meth:`_memo`).
        """
        pm, label_rank, ll, lh, pkey = parsed
        host = pid = dev = None
        content_rank: int | None = None
        if pm:
            host, pid, dev = pm
            key: str | None = pkey
            if label_rank is not None:
                self._label_to_key.setdefault(label_rank, key)
            if ll:
                self._local_label_last[ll] = key
        elif label_rank is not None:
            key = self._label_to_key.get(label_rank, f"rank{label_rank}")
        elif ll:
            # torchrun's [defaultN] is a local rank, repeated on every node: a line without
            # NCCL's prefix goes to the process that last printed under the same label.
            key = self._local_label_last.get(ll, ll)
        elif lh:
            host = key = lh
        else:
            key = bare[0]
            if key is not None:
                content_rank = int(key[4:])
            elif bare[1]:
                key = previous
        info = self.log.ranks.get(key) if key is not None else None
        if info is None:
            info = self._info(key, host, pid, dev)
        if content_rank is not None and info.rank is None:
            info.rank = content_rank
        if label_rank is not None:
            info.rank = label_rank
            info.label = info.label or f"rank{label_rank}"
            self._rank_from_label[info.key] = label_rank
        elif ll and info.label is None:
            info.label = ll
        return key, info, bool(pm and not ll)

    def _set_rank(self, info: RankInfo, rank: int, nranks: int) -> None:
        if info.key in self._rank_from_label:
            return
        if nranks > self._best_nranks.get(info.key, 0):
            self._best_nranks[info.key] = nranks
            info.rank = rank

    def _apply(self, info: RankInfo, event: tuple, cut: str) -> None:
        """Record one event of a line (``cut``: the line, already cut to ``_LINE_MAX``); kinds by frequency in big logs.

        Channel and error-chain events, the most frequent, are recorded by :meth:`feed` itself.  A rank's stage only
        moves forward (:data:`STAGES`).
        """
        kind = event[0]
        if kind == "net":
            _, net, devs, oob, socket_ifaces = event
            info.net = net
            info.net_devices = devs
            info.oob = oob
            info.socket_ifaces = list(socket_ifaces)
            _keep(info.evidence_lines, cut)
            if info.stage < _S_NETWORK:
                info.stage = _S_NETWORK
        elif kind == "bootstrap":
            info.bootstrap = event[1]
            _keep(info.evidence_lines, cut)
            if info.stage < _S_BOOTSTRAP:
                info.stage = _S_BOOTSTRAP
        elif kind == "network":
            info.network = event[1]
            _keep(info.evidence_lines, cut)
            if info.stage < _S_NETWORK:
                info.stage = _S_NETWORK
        elif kind == "env":
            info.env[event[1]] = event[2]
            if event[1] == "NCCL_SOCKET_IFNAME":
                info.socket_ifname_env = event[2]
            _keep(info.evidence_lines, cut)
        elif kind == "version":
            info.nccl_version = event[1]
            if info.stage < _S_BOOTSTRAP:
                info.stage = _S_BOOTSTRAP
        elif kind == "plugin":
            info.net_plugin = bool(info.net_plugin) or event[1]
        elif kind == "plugin_none_line":
            _keep(info.evidence_lines, cut)
        elif kind == "driver":
            info.cuda_driver = event[1]
        elif kind == "connect":
            _keep(info.connect_errors, cut)
        elif kind == "complete":
            done: InitComplete = event[1]
            done = InitComplete(done.comm, done.rank, done.nranks, done.cuda_dev, done.local_ranks, done.n_nodes, cut)
            info.init_complete_count += 1
            if len(info.init_complete) < _KEEP_MAX:
                info.init_complete.append(done)
            self._set_rank(info, done.rank, done.nranks)
            info.nranks = max(info.nranks or 0, done.nranks)
            if done.local_ranks:
                info.local_ranks = max(info.local_ranks or 0, done.local_ranks)
            if done.n_nodes:
                info.n_nodes = max(info.n_nodes or 0, done.n_nodes)
            info.stage = _S_COMPLETE
        elif kind == "init_start":
            info.init_starts += 1
            self._set_rank(info, event[1], event[2])
            info.nranks = max(info.nranks or 0, event[2])
            if info.stage < _S_INIT:
                info.stage = _S_INIT
        elif kind == "topo":
            _, rank, nranks, nnodes, local = event
            self._set_rank(info, rank, nranks)
            info.nranks = max(info.nranks or 0, nranks)
            info.n_nodes = max(info.n_nodes or 0, nnodes)
            info.local_ranks = max(info.local_ranks or 0, local)
            if info.stage < _S_INIT:
                info.stage = _S_INIT
        elif kind == "ib_nodev":
            info.ib_no_device = True
            _keep(info.evidence_lines, cut)
        elif kind == "ibverbs":
            _keep(info.ibverbs_lines, cut)
        elif kind == "no_iface":
            _keep(info.iface_errors, cut)
        elif kind == "mismatch":
            _keep(info.mismatch_lines, cut)
        elif kind == "abort":
            info.aborts += 1
        elif kind == "oob":
            info.oob = event[1]
            _keep(info.evidence_lines, cut)
        elif kind == "gid":
            gid = event[1:]
            if gid not in info.gids and len(info.gids) < _KEEP_MAX:
                info.gids.append(gid)
                _keep(info.gid_lines, cut)
        elif kind == "old_iface":
            if not info.bootstrap:
                info.bootstrap = event[1]
            _keep(info.evidence_lines, cut)

    def finish(self) -> NcclLog:
        """Merge duplicate keys of one rank, then return the log.

        Lines of one rank that lack NCCL's prefix (``[rank1]:NCCL version ...``) fold into the
        prefixed key with the same label; a process's keys for another cudaDev that carry only
        pre-init lines (printed before ``torch.cuda.set_device``) fold into its main key.
        """
        self._rank_of.clear()
        self._rank_of_pre.clear()
        self._plans.clear()
        for label_rank, full_key in self._label_to_key.items():
            bare = self.log.ranks.get(f"rank{label_rank}")
            if bare is not None and bare.host is None and full_key in self.log.ranks:
                _merge(self.log.ranks[full_key], bare)
                del self.log.ranks[bare.key]
        groups: dict[tuple[str, int], list[RankInfo]] = {}
        for info in self.log.ranks.values():
            if info.host is not None and info.pid is not None:
                groups.setdefault((info.host, info.pid), []).append(info)
        for members in groups.values():
            if len(members) < 2:
                continue
            main = max(members, key=lambda r: (r.stage, len(r.channels), r.lines))
            for other in members:
                if other is main or other.init_starts or other.init_complete or other.channels:
                    continue
                _merge(main, other)
                del self.log.ranks[other.key]
        return self.log


def _parse_head(tail: str) -> tuple:
    """(``(host, pid, dev)`` or None, label rank or None, torchrun local label or None, host label or None, rank key
    ``host:pid[dev]`` or None) of a line's head (the text before NCCL's marker, its last 300 characters)."""
    pm = _PREFIX.search(tail)
    if pm is not None and not pm.start():      # NCCL's prefix alone: no label before it (most heads)
        host, pid, dev = pm["host"], int(pm["pid"]), int(pm["dev"])
        return (host, pid, dev), None, None, None, f"{host}:{pid}[{dev}]"
    label_part = tail[:pm.start()] if pm else tail
    lr = _LABEL_RANK.search(label_part)
    label_rank = int(lr.group(1) or lr.group(2)) if lr else None
    ll = _LABEL_LOCAL.search(label_part)
    lh = None if (pm or lr or ll) else _LABEL_HOST.search(label_part)
    prefix = (pm["host"], int(pm["pid"]), int(pm["dev"])) if pm else None
    key = f"{pm['host']}:{int(pm['pid'])}[{int(pm['dev'])}]" if pm else None
    return prefix, label_rank, ll.group(1) if ll else None, lh.group(1) if lh else None, key


def _merge(into: RankInfo, other: RankInfo) -> None:
    """Fold everything ``other`` recorded into ``into`` (both describe the same rank)."""
    into.env = {**other.env, **into.env}
    for name in ("rank", "label", "nccl_version", "cuda_driver", "socket_ifname_env", "net", "oob", "network",
                 "nranks", "n_nodes", "local_ranks"):
        if getattr(into, name) is None and getattr(other, name) is not None:
            setattr(into, name, getattr(other, name))
    for name in ("bootstrap", "net_devices", "socket_ifaces"):
        if not getattr(into, name):
            setattr(into, name, getattr(other, name))
    into.ib_no_device = into.ib_no_device or other.ib_no_device
    for name in ("channels", "init_complete", "warns", "connect_errors", "iface_errors", "mismatch_lines",
                 "ibverbs_lines", "evidence_lines", "gid_lines"):
        getattr(into, name).extend(getattr(other, name))
    into.init_starts += other.init_starts
    into.warn_count += other.warn_count
    into.init_complete_count += other.init_complete_count
    if other.net_plugin is not None:
        into.net_plugin = bool(into.net_plugin) or other.net_plugin
    for cid, n in other.catalog.items():
        into.catalog[cid] = into.catalog.get(cid, 0) + n
    into.aborts += other.aborts
    into.error_chain += [c for c in other.error_chain if c not in into.error_chain]
    into.gids += [g for g in other.gids if g not in into.gids]
    into.lines += other.lines
    into.stage = max(into.stage, other.stage)


def _classify(msg: str) -> list[tuple]:
    """The facts one NCCL message carries, as ``(kind, ...)`` tuples (empty: not understood)."""
    events: list[tuple] = []
    m = _VERSION.search(msg)
    if m:
        events.append(("version", m.group(1)))
    if m := _DRIVER.match(msg):
        events.append(("driver", m.group(1)))
    if m := _ENV.match(msg):
        events.append(("env", m.group(1), m.group(2) if m.group(2) is not None else m.group(3)))
    elif "=" in msg and _CMD_ENV.match(msg):
        for m in _ENV_ASSIGN.finditer(msg):
            value = m.group(2)
            if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1:
                value = value[1:-1]
            events.append(("env", m.group(1), value))
    if "GID " in msg and (m := _GID.search(msg)):
        events.append(("gid", int(m.group(1)), m.group(2).upper(), m.group(3).upper()))
    if m := _BOOTSTRAP.match(msg):
        events.append(("bootstrap", _ifaces(m.group(1))))
    if (m := _NET_USING.match(msg)) and m["net"] != "Plugin":
        devs_text, _, oob_text = (m["devs"] or "").partition("; OOB ")
        devs = [d for d in re.findall(r"\[\d+\]\S+", devs_text)] or devs_text.split()
        oob = _ifaces(oob_text)
        devs = [d for d in devs if d != "[RO]"]
        events.append(("net", m["net"], devs, oob[0] if oob else None,
                       tuple(_ifaces(" ".join(devs))) if m["net"] == "Socket" else ()))
    if m := _OLD_SIDEBAND.match(msg):
        oob = _ifaces(m.group(1)) or [Iface(m.group(1).split(":", 1)[0], "")]
        events.append(("oob", oob[0]))
    if m := _OLD_NET_IFACE.match(msg):
        events.append(("old_iface", _ifaces(m.group(1))))
    if m := _OLD_INTERNAL.match(msg):
        events.append(("network", m.group(1)))
    if _PLUGIN_OK.search(msg):
        events.append(("plugin", True))
    elif _PLUGIN_NONE.search(msg):
        events.append(("plugin", False))
        events.append(("plugin_none_line",))
    if _IB_NODEV.match(msg):
        events.append(("ib_nodev",))
    if m := _NETWORK.match(msg):
        events.append(("network", m.group(1)))
    if m := _TOPO.search(msg):
        events.append(("topo", int(m["rank"]), int(m["nranks"]), int(m["nnodes"]), int(m["local"])))
    elif m := _INIT.search(msg):
        if m["what"].upper() == "COMPLETE":
            rest = m["rest"]
            dev, local, nodes = _CUDADEV.search(rest), _LOCALRANKS.search(rest), _NNODES.search(rest)
            events.append(("complete", InitComplete(
                m["comm"], int(m["rank"]), int(m["nranks"]), int(dev.group(1)) if dev else None,
                int(local.group(1)) if local else None, int(nodes.group(1)) if nodes else None)))
        else:
            events.append(("init_start", int(m["rank"]), int(m["nranks"])))
    if m := _CHANNEL.match(msg):
        ch = Channel(int(m["ch"]), int(m["conn"]) if m["conn"] is not None else None, int(m["src"]), int(m["dst"]),
                     m["dir"], m["via"].strip(), src_dev=m["sdev"], dst_dev=m["ddev"])
        events.append(("channel", ch, (ch.channel, ch.conn, ch.src, ch.dst, ch.direction, ch.via)))
    if _CONNECT_ANY.search(msg) and "ibv_" not in msg:   # an IB verbs call that timed out is not a socket connect
        events.append(("connect",))
    if _NO_IFACE.search(msg):
        events.append(("no_iface",))
    if _MISMATCH.search(msg):
        events.append(("mismatch",))
    if _IBVERBS.search(msg):
        events.append(("ibverbs",))
    if _ABORT.search(msg):
        events.append(("abort",))
    if m := _ERROR_CHAIN.match(msg):
        events.append(("chain", m.group(1)))
    return events


def _content_key(events: list[tuple]) -> str | None:
    """``rankN`` for a bare line that names its own rank (init, topology or channel line)."""
    for event in events:
        if event[0] in ("init_start", "topo"):
            return f"rank{event[1]}"
        if event[0] == "complete":
            return f"rank{event[1].rank}"
        if event[0] == "channel":
            return f"rank{event[1].own_rank}"
    return None


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a log is read and its ranks merged, back as it was afterwards.

    Reading makes no reference cycles (the records it fills are reached from the log), so a collection would only
    walk the growing records again and again: on a 200 MB log that was about 1 s of collections (four full walks of
    the records and the parser's memo tables).  ``runbook nccl-log`` keeps it off for the whole command (the verdicts
    and reports walk the same records); nested uses leave it as the outer one set it.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def parse(text: str, source: str = "<text>") -> NcclLog:
    """Parse ``NCCL_DEBUG=INFO`` output of any number of ranks and hosts.

    Args:
        text: the log (ranks interleaved; torchrun/project/host labels and timestamps allowed).
        source: name used in error messages (a file path).

    Returns:
        An :class:`NcclLog`.

    Raises:
        ValueError: ``text`` is not a str, or holds no NCCL line and no catalog line (names ``source``).
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected the log as str, got {type(text).__name__}")
    with collector_paused():
        parser = _Parser()
        if parser.feed(io.StringIO(text), source) == 0:
            raise ValueError(f"{source}: no NCCL lines found (was the job run with NCCL_DEBUG=INFO? "
                             f"NCCL lines look like 'host:pid:tid [dev] NCCL INFO ...')")
        return parser.finish()


_SITE_INFO_WORDS = ("fail", "rror", "HINT", "imeout", "annot", "nable to", "not found", "isabl", "exceed")
"""An INFO message is matched against the generated sites only when it holds one of these (WARN lines always are)."""


_WRAPPED = re.compile(r"^\s*\[\d+\][^\s:\[\]]+:\S+<\d+>\s*$")


def _feed_one(parser: _Parser, path: str | Path, stdin: IO[str] | None) -> tuple[str | None, bool]:
    """Feed one input to ``parser`` through :func:`helpers.inputs.open_lines`: ``(problem line or None, read)``.

    ``read`` is True when NCCL lines of this input went into the log (a problem may still be reported: a NUL tail).

    ``-``, ``/dev/stdin`` and ``/dev/fd/N`` (a shell's ``<(cmd)``) are read once, front to back; a directory, a
    FIFO or a device is refused without blocking; a BOM is dropped; lines are cut at ``_READ_MAX`` characters.
    A gzip file, a file that starts with NUL bytes and an empty one are refused; NUL bytes after the text (a
    pre-allocated or crash-truncated log) end the read there, and the problem line says from which line on.
    """
    name = str(path)
    shown = "<stdin>" if name == "-" else name
    try:
        with inputs.open_lines(name, stdin=stdin, max_line_chars=_READ_MAX, long_lines="cut") as lines:
            head = lines.head
            if head[:2] == b"\x1f\x8b":
                return f"{shown}: gzip-compressed; decompress it first (zcat {name} | runbook nccl-log -)", False
            if head[:1] == b"\x00" or head[:512].count(b"\x00") > 64:
                return f"{shown}: binary file, not a text log", False
            if parser.feed(lines, shown) == 0:
                if not head:
                    return f"{shown}: empty file (no NCCL lines)", False
                return f"{shown}: no NCCL lines found (was the job run with NCCL_DEBUG=INFO?)", False
            if parser.nul_line:
                return f"{shown}: NUL bytes from line {parser.nul_line} on: read up to there, the rest is not text", True
    except inputs.InputError as exc:
        return f"{shown}: cannot read the log ({exc.reason})", False
    return None, True


def parse_files(paths: Sequence[str | Path], problems: list[str] | None = None,
                stdin: IO[str] | None = None) -> NcclLog:
    """Parse several log files (one per node, say) into one :class:`NcclLog`, streaming each file.

    Args:
        paths: log files; ``-`` reads ``stdin`` (default ``sys.stdin``).
        problems: when a list is given, an unreadable input (missing, directory, empty, gzip, binary,
            no NCCL line) appends one line naming it and the other inputs are still read; when None
            the first such input raises.
        stdin: the stream ``-`` reads (tests pass a StringIO).

    Returns:
        The parsed log; its :attr:`NcclLog.problems` holds the problem lines too.

    Raises:
        ValueError: no path given; with ``problems=None``, an input that cannot be read; with a
            list, every input could not be read (names them).
    """
    if not paths:
        raise ValueError("paths: give at least one log file (or - for stdin)")
    with collector_paused():
        parser = _Parser()
        found: list[str] = []
        read = 0
        for path in paths:
            problem, fed = _feed_one(parser, path, stdin)
            read += fed
            if problem:
                if problems is None and not fed:
                    raise ValueError(problem)
                found.append(problem)
                if problems is not None:
                    problems.append(problem)
        if not read:
            raise ValueError("; ".join(found))
        log = parser.finish()
        log.problems = found
        return log

