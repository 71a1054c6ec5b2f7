"""helpers.nccl_log readings tuned on the second blind set (issue 24), each on a few inline lines.

The lines follow the format strings of NCCL's sources at the releases named next to each test (the messages,
prefixes and numbers as NCCL prints them); the rules and their sources are in helpers/nccl_log/rules.py.  Pure
parsing: no subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import nccl_log as nl
from helpers.checks import Check
from helpers.nccl_log.rules import gid_text, nccl_list


def read(text: str) -> dict[str, Check]:
    """The verdicts of ``text`` by id."""
    return {v.id: v for v in nl.interpret(nl.parse(text))}


def acting(found: dict[str, Check]) -> dict[str, Check]:
    return {k: v for k, v in found.items() if v.status in ("FAIL", "WARN")}


# ------------------------------------------------------------------ the first failure of a rank, CUDA driver errors

DRIVER_36 = ("h:174:239 [0] enqueue.cc:802 NCCL WARN Cuda failure 'API call is not supported in the installed CUDA driver'\n"
             "h:174:239 [0] misc/argcheck.cc:39 NCCL WARN Broadcast : invalid root 0 (root should be in the 0..-1 range)\n"
             "h:174:239 [0] init.cc:895 NCCL WARN Cuda failure 'invalid device ordinal'\n")


def test_driver_too_old_is_the_cause_and_what_follows_is_context() -> None:
    # NCCL 2.9.8 enqueue.cc:802 (cudaStreamGetCaptureInfo_v2 on an older driver), then the torn-down communicator
    found = read(DRIVER_36)
    driver = found["nccl.cuda-api-call-is-not-supported-in-the-installed-cuda-driver"]
    assert driver.status == "FAIL" and driver.values["kind"] == "cause" and "driver is older" in driver.title
    assert "nvidia-smi" in driver.remediation
    for later in ("nccl.usage-error", "nccl.cuda-invalid-device-ordinal"):
        assert found[later].status == "INFO" and found[later].values["kind"] == "context", later
        assert found[later].values["after_first_failure"] == driver.id
    assert list(acting(found)) == [driver.id]


def test_a_failure_printed_first_keeps_its_status() -> None:
    found = read("h:1:2 [0] init.cc:895 NCCL WARN Cuda failure 'invalid device ordinal'\n")
    assert found["nccl.cuda-invalid-device-ordinal"].status == "FAIL"
    # another rank's later failure is not explained by this rank's first one
    two = read("a:1:2 [0] init.cc:895 NCCL WARN Cuda failure 'invalid device ordinal'\n"
               "b:3:4 [0] misc/argcheck.cc:39 NCCL WARN Broadcast : invalid root 0 (root should be in the 0..1 range)\n")
    assert two["nccl.usage-error"].status == "FAIL"


@pytest.mark.parametrize("error", ["system has unsupported display driver / cuda driver combination",
                                   "forward compatibility was attempted on non supported HW",
                                   "CUDA driver version is insufficient for CUDA runtime version"])
def test_driver_mismatch_errors_are_driver_readings(error: str) -> None:
    found = read(f"h:1:2 [0] init.cc:1582 NCCL WARN Cuda failure '{error}'\n")
    (v,) = acting(found).values()
    assert "driver" in v.title and "usage" not in v.id and v.values["kind"] == "cause"


# ------------------------------------------------------------------------------------------------ /dev/shm

def test_shm_permission_denied_is_not_shm_full() -> None:
    # NCCL 2.4 include/shm.h:27 (SYSCHECKVAL shm_open) then shm.h:48
    found = read("n:1:2 [0] include/shm.h:27 NCCL WARN Call to shm_open failed : Permission denied\n"
                 "n:1:2 [0] NCCL INFO include/shm.h:41 -> 2\n"
                 "n:1:2 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment nccl-shm-recv-b7-0-3-0 "
                 "(size 4460544)\n")
    assert "shm-full" not in found and "shm-create-failed" not in found
    v = found["shm-permission"]
    assert v.status == "FAIL" and "ls -ld /dev/shm" in v.remediation and len(v.evidence) == 2


def test_shm_no_space_is_shm_full_and_the_follow_up_line_folds_into_it() -> None:
    found = read("n:1:2 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device\n"
                 "n:1:2 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment nccl-shm-recv-6c-0-1-0 "
                 "(size 9637888)\n")
    assert found["shm-full"].values["lines"] == 2 and "shm-create-failed" not in found


def test_shm_create_alone_is_a_suspect_and_a_bad_fd_is_not_full() -> None:
    # torch quotes NCCL 2.21's last error without the failing call
    found = read("Last error:\nError while creating shared memory segment /dev/shm/nccl-1YsMbG (size 7340384)\n")
    v = found["shm-create-failed"]
    assert v.values["kind"] == "suspect" and v.title.startswith("suspect:") and "df -h /dev/shm" in v.remediation
    # NCCL 2.2x prints errno after "failed to extend": only ENOSPC means full (mkstemp failing leaves fd -1: EBADF)
    bad_fd = read("n:1:2 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9637892 bytes, "
                  "error: Bad file descriptor (9)\n")
    assert "shm-full" not in bad_fd


# ---------------------------------------------------------------------------------------------- socket connect

def test_no_route_to_host_names_the_interface_as_a_suspect() -> None:
    found = read("Last error:\nsocketStartConnect: Connect to 192.168.19.14<52822> failed : No route to host\n")
    v = found["connect-failed"]
    assert v.values["kind"] == "suspect" and v.title.startswith("suspect:")
    assert "NCCL_SOCKET_IFNAME" in v.title and "firewall" in v.title and "ip route get" in v.remediation


def test_connection_refused_says_nothing_listens() -> None:
    found = read("h:1:2 [0] NCCL INFO socketPollConnect: connect to 10.0.0.9<4000> returned Connection refused, retrying\n")
    v = found["connect-failed"]
    assert "nothing listens" in v.title and "firewall" not in v.title


# ------------------------------------------------------------------------------- [Rem Allocator] of NCCL 2.8-2.11

REM = ("a:39:298 [0] include/socket.h:423 NCCL WARN Net : Connection closed by remote peer 10.0.0.4<52638>\n"
       "a:39:298 [0] NCCL INFO bootstrap.cc:229 -> 2\n"
       "a:39:298 [0] bootstrap.cc:279 NCCL WARN [Rem Allocator] Allocation failed (segment 0, fd 130)\n"
       "a:39:298 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'\n"
       "a:39:298 [0] NCCL INFO bootstrap.cc:231 -> 1\n")


def test_rem_allocator_out_of_memory_is_the_known_bug_not_a_real_oom() -> None:
    found = read(REM)
    bug = found["known-bug.rem-allocator-stray-message"]
    assert bug.status == "WARN" and bug.values["kind"] == "suspect" and "2.12.7" in bug.title
    assert "not a real GPU out-of-memory" in bug.title
    assert found["nccl.cuda-out-of-memory"].status == "INFO"
    assert found["nccl.cuda-out-of-memory"].values["explained_by"] == bug.id


def test_an_out_of_memory_without_the_allocator_pattern_stays_a_cause() -> None:
    found = read("a:1:2 [0] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n")
    assert found["nccl.cuda-out-of-memory"].status == "FAIL" and not any(k.startswith("known-bug") for k in found)


# ----------------------------------------------------------------------------------------------- RoCE GID

def test_gid_text_reads_nccls_printed_halves() -> None:
    assert gid_text("80FE", "1A8A41FEFF21A75E") == "fe80::5ea7:21ff:fe41:8a1a"
    assert gid_text("0", "A0A0A0AFFFF0000") == "::ffff:10.10.10.10"


QP = ("h:88:159 [0] NCCL INFO NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 1047 mtu 5 query_ece={{supported=1, vendor_id=0x15b3, "
      "options=0x0, comp_mask=0x0}} GID {gid} fifoRkey=0x15e6c5 fifoLkey=0x15e6c5\n")


def test_link_local_roce_gid_is_named_with_the_variable() -> None:
    # NCCL 2.21 net_ib.cc:1065 (RoCE queue pair line)
    found = read("h:88:159 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 0.\n" +
                 QP.format(gid="0 (80FE/1A8A41FEFF21A75E)"))
    v = found["roce-gid-link-local"]
    assert v.values["kind"] == "suspect" and "NCCL_IB_GID_INDEX=0" in v.title and "fe80::" in v.title
    assert "show_gids" in v.remediation
    assert "roce-gid-link-local" not in read(QP.format(gid="3 (0/A0A0A0AFFFF0000)"))


# ------------------------------------------------------------------------------------------- GPU Direct RDMA

NET = ("s:1:2 [{d}] NCCL INFO Channel 03/0 : 5[5] -> 12[4] [send] via NET/IB/3{g}\n"
       "s:1:3 [{d}] NCCL INFO Channel 03/0 : 13[5] -> 4[4] [receive] via NET/IB/3{g}\n")


def test_ib_without_gdrdma_on_the_receive_side_is_a_suspect() -> None:
    v = read(NET.format(d=4, g=""))["gdr-not-used"]
    assert v.status == "WARN" and v.values["kind"] == "suspect" and "nvidia_peermem" in v.remediation
    assert "gdr-not-used" not in read(NET.format(d=4, g="/GDRDMA"))
    # sends alone may skip GDR on purpose (NCCL_NET_GDR_READ on pre-Ampere GPUs): no verdict
    assert "gdr-not-used" not in read(NET.format(d=4, g="").splitlines()[0] + "\n")


# ------------------------------------------------------------------------------------ NCCL_IB_HCA / SOCKET_IFNAME

def test_nccl_list_reads_prefixes_once() -> None:
    assert nccl_list("^=mlx5_8,^=mlx5_14") == (True, True, ["mlx5_8", "^=mlx5_14"])
    assert nccl_list("=mlx5_0:1,mlx5_1:1") == (False, True, ["mlx5_0", "mlx5_1"])
    assert nccl_list("eth") == (False, False, ["eth"])


def test_malformed_ib_hca_from_a_command_line_or_nccls_own_line() -> None:
    cmd = read("NCCL_DEBUG=INFO UCX_TLS=ud NCCL_IB_HCA='^=mlx5_8,^=mlx5_14' srun all_reduce_perf -b 8\n")
    v = cmd["nccl-ib-hca-syntax"]
    assert "mlx5_14 stays in use" in v.title and "NCCL_IB_HCA=^=mlx5_8,mlx5_14" in v.remediation
    own = read("h:1:2 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0, mlx5_1\n")       # net_ib.cc: "NCCL_IB_HCA set to %s"
    assert "' mlx5_1'" in own["nccl-ib-hca-syntax"].title
    assert "nccl-ib-hca-syntax" not in read("h:1:2 [0] NCCL INFO NCCL_IB_HCA set to ^=mlx5_8,mlx5_14\n")


def test_a_mention_of_a_variable_is_not_a_setting() -> None:
    with pytest.raises(ValueError):     # a hint that names NCCL_DEBUG=INFO is not a command line, nor an NCCL line
        nl.parse("python train.py  # rerun with NCCL_DEBUG=INFO for details\nexport PATH=/usr/bin\n")
    log = nl.parse("export NCCL_SOCKET_IFNAME=eth0\n")
    assert log.unattributed.env == {"NCCL_SOCKET_IFNAME": "eth0"}


# ----------------------------------------------------------------------------------------- host-hash collision

RING = ("learn:10:20 [{a}] INFO Ring 00 : {a}[{a}] -> {b}[{bd}] via P2P/IPC\n"
        "learn:11:21 [{b0}] INFO Ring 00 : {b0}[{b0}] -> {c}[{c}] via P2P/IPC\n")


def test_two_ranks_on_one_gpu_joined_by_p2p_is_a_host_hash_suspect() -> None:
    # NCCL 2.4 p2p.cc: "Ring %02d : %d[%d] -> %d[%d] via P2P/IPC" (NVML indexes); the bare INFO marker of nccl#187
    log = nl.parse(RING.format(a=6, b=10, bd=2, b0=2, c=3))
    assert log.ranks["learn:10[6]"].host == "learn"
    v = {v.id: v for v in nl.interpret(log)}["host-hash-collision"]
    assert v.values["kind"] == "suspect" and v.values["ranks"] == [2, 10] and "host hash" in v.title
    assert "boot_id" in v.remediation
    # per-rank CUDA_VISIBLE_DEVICES: every rank prints device 0, nothing to compare
    assert "host-hash-collision" not in read(RING.format(a=0, b=1, bd=0, b0=0, c=2).replace("[2]", "[0]"))


def test_first_failure_is_per_rank() -> None:
    # rank b printed the device error first, rank a the usage error first: neither explains the other
    found = read("a:1:2 [0] misc/argcheck.cc:39 NCCL WARN Broadcast : invalid root 0 (root should be in the 0..1 range)\n"
                 "b:3:4 [0] init.cc:895 NCCL WARN Cuda failure 'invalid device ordinal'\n"
                 "a:1:2 [0] init.cc:895 NCCL WARN Cuda failure 'invalid device ordinal'\n")
    assert found["nccl.usage-error"].status == "FAIL" and found["nccl.cuda-invalid-device-ordinal"].status == "FAIL"


# ------------------------------------------------------------------- blind set 4's lessons (tests/data/nccl/blind4)
def test_short_collective_timeout_is_the_cause() -> None:
    """A watchdog line whose Timeout(ms) is below a minute names the timeout itself (ProcessGroupNCCL's checkTimeout)."""
    line = ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)={t}) ran for {r} milliseconds before timing out.\n")
    short = acting(read(line.format(t=1, r=90)))
    assert list(short) == ["short-collective-timeout"]
    assert short["short-collective-timeout"].values["timeout_ms"] == 1
    assert short["short-collective-timeout"].values["ran_ms"] == 90
    default = acting(read(line.format(t=600000, r=600123)))
    assert list(default) == ["torch-watchdog-timeout"]
    # seconds (blind6 pytorch#97191: 10 s around a mismatched all_reduce): a real hang ends the same way, a suspect
    seconds = read(line.format(t=10000, r=10917))["short-collective-timeout"]
    assert seconds.status == "WARN" and seconds.values["kind"] == "suspect" and "tell them apart" in seconds.title


def test_invalid_usage_and_port_in_use_are_suspects_naming_their_alternatives() -> None:
    """ncclInvalidUsage without its WARN line, and a store port already bound, have several causes: suspects."""
    usage = read("RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\n")[
        "torch-nccl-invalid-usage"]
    assert usage.values["kind"] == "suspect" and "version mismatch" in usage.title
    port = read("RuntimeError: Address already in use\n")["tcpstore-port-in-use"]
    assert port.values["kind"] == "suspect" and "RANK is 0" in port.title and "ss -ltnp" in port.remediation


# ------------------------------------------------------------------- blind set 6's lessons (tests/data/nccl/blind6)
def test_nccls_own_unix_socket_in_use_is_not_the_rendezvous_port() -> None:
    """misc/ipcsocket.cc: the cuMem proxy's abstract Unix socket, not the TCPStore's port (nccl#1185)."""
    found = read("h:33:10589 [2] misc/ipcsocket.cc:57 NCCL WARN UDS: Binding to socket /tmp/nccl-socket-2-e647f8d8e15809a1 "
                 "failed : Address already in use (98)\n")
    assert "tcpstore-port-in-use" not in found
    uds = found["nccl-uds-bind"]
    assert uds.values["kind"] == "suspect" and "2.20.5" in uds.title and "ss -xlp" in uds.remediation


def test_a_foreign_client_on_nccls_port_names_the_accept_hang() -> None:
    """socket.cc socketFinalizeAccept (<= 2.26): the 8 bytes 'GET /met' are an HTTP client; nccl#1808 fixed in 2.30.7."""
    found = read("worker-9 >> [2025-08-12 01:37:03] :166:1226 [0] misc/socket.cc:484 NCCL WARN socketFinalizeAccept: "
                 "wrong magic 74656d2f20544547 != 7970663b906d70b9\n")
    assert found["nccl-foreign-connection"].values["kind"] == "suspect"
    assert "the client sent 'GET /met'" in found["nccl-foreign-connection"].title  # decoded from this line's bytes
    assert nl.rules.foreign_bytes("wrong magic 1234abcd5a5a5a5a != 7970663b906d70b9") == ""  # not text: nothing said
    assert any("2.30.7" in v.title for k, v in found.items() if "magic" in k or "bug" in k), sorted(found)


def test_nccl_tests_built_against_nccl_1_and_a_gpu_pair_without_p2p() -> None:
    old = read("# NCCL Tests compiled with NCCL 1.0\nNCCL failure all_reduce.cu:95 'unhandled cuda error'\n")
    assert old["nccl1-library"].status == "FAIL" and "NCCL 2" in old["nccl1-library"].remediation
    assert "nccl1-library" not in read("# NCCL Tests compiled with NCCL 2.4\nNCCL failure all_reduce.cu:95 'unhandled "
                                       "cuda error'\n")
    p2p = read("Failed: Cuda error /home/runner/work/vllm/vllm/csrc/custom_all_reduce.cuh:307 'peer access is not "
               "supported between these two devices'\n")
    assert p2p["peer-access-unsupported"].values["kind"] == "cause" and "topo -p2p" in p2p[
        "peer-access-unsupported"].remediation


def test_a_missing_init_complete_in_an_excerpt_is_only_a_suspect() -> None:
    ranks = ("h:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init START\n"
             "h:2:2 [1] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 1 busId 2000 - Init START\n"
             "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 commId 0x5 - Init COMPLETE\n")
    whole = read(ranks)["init-incomplete"]
    assert whole.status == "FAIL" and whole.values["kind"] == "cause"
    cut = read(ranks + "[...]\n")
    assert cut["init-incomplete"].values["kind"] == "suspect" and cut["excerpt-elided"].status == "INFO"


# ------------------------------------------------------------------ what a one-GPU H200 machine printed (make gpu-check)

H200_LINES = (Path(__file__).resolve().parents[1] / "data" / "nccl" / "device" / "h200_one_gpu_env_job.log").read_text()


def test_socket_transport_never_has_gdr_and_an_optional_symbol_is_no_finding() -> None:
    # src/transport/net_socket.cc: ptrSupport = NCCL_PTR_HOST, so topo.cc always prints Disabled for NET/Socket;
    # src/misc/mlx5dvsymbols.cc LOAD_SYM_VERSION: an optional symbol, INFO, NCCL carries on
    found = read(H200_LINES)
    assert acting(found) == {}, {k: v.title for k, v in acting(found).items()}
    assert not any(k.endswith(("sysfs-path", "gdr-disabled", "verbs-symbol")) for k in found), sorted(found)


def test_gdr_disabled_on_an_ib_hca_stays_a_suspect() -> None:
    found = acting(read(H200_LINES.replace("NET/Socket : GPU Direct RDMA Disabled for HCA 0 'eth0'",
                                           "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'")))
    assert list(found) == ["nccl.gdr-disabled"] and found["nccl.gdr-disabled"].values["kind"] == "suspect"


def test_a_required_verbs_symbol_missing_is_a_suspect_naming_rdma_core() -> None:
    # LOAD_SYM (WARN): the verbs library is older than NCCL's IB path needs
    found = acting(read("h:9:9 [0] NCCL WARN dlvsym failed on mlx5dv_is_supported - /usr/lib/libmlx5.so: undefined "
                        "symbol: mlx5dv_is_supported, version MLX5_1.8\n"))
    assert list(found) == ["nccl.verbs-symbol"] and "rdma-core" in found["nccl.verbs-symbol"].remediation


# ------------------------------------------------------------------- blind set 5's lessons (tests/data/nccl/blind5)

@pytest.mark.parametrize("log, expect", [
    ("02_elastic31_tcpstore_host_not_found_hostname.log", "rendezvous-host-unresolvable"),  # getaddrinfo EAI_NONAME
    ("09_awsdoeks51_gloo_ifname_nccl_exclusion_syntax.log", "gloo-ifname-not-found"),        # gloo device.cc
    ("10_te1170_ub_ifname_prefix_not_interface.log", "te-ub-ifname"),                       # TE initialize_ub
])
def test_names_and_interfaces_that_do_not_exist_here(log: str, expect: str) -> None:
    found = acting({v.id: v for v in nl.interpret(nl.parse_files([Path(__file__).resolve().parents[1] / "data" / "nccl"
                                                                  / "blind5" / log]))})
    assert list(found) == [expect] and found[expect].values["kind"] == "cause"


# ------------------------------------------------------------------- blind set 7's lessons (tests/data/nccl/blind7)
GLOO_REFUSED = ("terminate called after throwing an instance of 'gloo::IoException'\n"
                "  what():  [/opt/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:724] connect [127.0.1.1]:3210: "
                "Connection refused\n")


def test_a_gloo_peer_at_a_loopback_address_is_the_cause() -> None:
    """GlooDeviceFactory.cpp: a hostname that resolves to no usable address makes gloo bind loopback; a rank on another
    host then dials 127.x (pytorch#15592, Debian's 127.0.1.1)."""
    found = read(GLOO_REFUSED)
    assert found["gloo-loopback-address"].status == "FAIL" and "GLOO_SOCKET_IFNAME" in found["gloo-loopback-address"].remediation
    elsewhere = read(GLOO_REFUSED.replace("127.0.1.1", "10.0.0.2"))  # a real address refused: not this cause
    assert "gloo-loopback-address" not in elsewhere and elsewhere["gloo-connect-failed"].status == "INFO"
    warned = read("[rank0]:[W ProcessGroupGloo.cpp:721] Warning: Unable to resolve hostname to a (local) address. Using "
                  "the loopback address as fallback. Manually set the network interface to bind to with "
                  "GLOO_SOCKET_IFNAME. (function operator())\n")
    assert not acting(warned) and warned["gloo-loopback-fallback"].status == "INFO"  # one host: only worth knowing


def test_a_link_local_socket_interface_and_its_refused_connection() -> None:
    """169.254/16 (RFC 3927) is not routed: EKS Pod Identity's pod-id-link0 has the same address on every node."""
    text = ("h:1:1 [0] NCCL INFO NET/Socket : Using [0]enp73s0:10.1.216.156<0> [1]pod-id-link0:169.254.170.23<0>\n"
            "h:1:1 [0] NCCL INFO socketPollConnect: connect to 169.254.170.23<41234> returned Connection refused, "
            "retrying (13/34)\n")
    found = read(text)
    assert found["bad-interface"].status == "FAIL" and "169.254/16" in found["bad-interface"].title
    assert found["connect-failed"].status == "INFO"  # the consequence, not a second cause
    routable = read(text.replace("169.254.170.23", "10.1.216.157"))
    assert "bad-interface" not in routable and routable["connect-failed"].status == "FAIL"


def test_nccl_lines_pasted_without_their_newlines_are_read_one_by_one() -> None:
    joined = ("[0] NCCL INFO NCCL_IB_HCA set to mlx5_0:1 [0] NCCL INFO NET/IB : No device found. [0] NCCL INFO "
              "NET/Socket : Using [0]eth0:10.47.14.218<0> [0] NCCL INFO Using network Socket\n")
    log = nl.parse(joined)
    assert log.nccl_lines == 4 and "ib-fallback-socket" in read(joined)
    one = nl.parse("a:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)\n")
    assert one.nccl_lines == 1  # a second "NCCL" in the message is not a second line


def test_torchs_quoted_last_error_and_the_cuda_errors_it_names() -> None:
    """alloc.h WARN 'Failed to CUDA calloc async' behind torch's '[rank0]: Last error:' (ms-swift#6387); CUDA 803's
    class is named after its enum, not CUDA's 'display driver' words; torch's own 'CUDA error: ...' is read too."""
    calloc = read("[rank0]: torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, unhandled cuda error "
                  "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n[rank0]: ncclUnhandledCudaError: Call to "
                  "CUDA function failed.\n[rank0]: Last error:\n[rank0]: Failed to CUDA calloc async 136 bytes\n")
    assert calloc["nccl.cuda-alloc-failed"].status == "FAIL" and "warm-up collective" in calloc[
        "nccl.cuda-alloc-failed"].remediation
    assert calloc["torch-nccl-cuda-error"].status == "INFO"  # explained by the specific reading
    compat = read(" 7: ip-10-1-113-84: Test CUDA failure common.cu:894 'system has unsupported display driver / cuda "
                  "driver combination'\n")
    assert "nccl.cuda-system-driver-mismatch" in compat and "cuda-compat" in compat["nccl.cuda-system-driver-mismatch"].title
    ima = read("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert "CUDA_LAUNCH_BLOCKING=1" in ima["nccl.cuda-illegal-memory-access"].remediation


@pytest.mark.parametrize("line, entry", [
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     "dataloader-shm-bus-error"),
    ("2023-11-18 03:39:16,283 WARNING services.py:1996 -- WARNING: The object store is using /tmp instead of /dev/shm "
     "because /dev/shm has only 67108864 bytes available.", "dev-shm-small"),
    ("rogpt1: TypeError: DSElasticAgent._set_master_addr_port() takes 3 positional arguments but 4 were given",
     "elastic-agent-signature"),
    ("RuntimeError: Invalid function argument. Expected parameter `tensor` of type torch.Tensor", "collective-not-a-tensor"),
    ("RuntimeError: Split sizes doesn't match total dim 0 size", "split-sizes-mismatch"),
    ("AssertionError: Expects tensor to be on the compute device cuda:0, was on cpu", "fsdp-param-not-on-device"),
])
def test_torch_and_launcher_messages_read_from_their_sources(line: str, entry: str) -> None:
    """Each message as the source that prints it words it (torch v2.13.0, DeepSpeed#4985, Ray's services.py)."""
    found = read(line + "\n")
    assert found[entry].status in ("FAIL", "WARN") and found[entry].source.startswith("https://"), sorted(found)


def test_a_refused_dial_of_an_address_two_hosts_announce_stays_a_failure() -> None:
    """Only a node-local address (what bad-interface names) folds connect-failed into context; an address several
    hosts announce is context itself (containers-share-host), so the refused connection keeps its own verdict."""
    text = ("a:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>\n"
            "b:2:2 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>\n"
            "b:2:2 [0] NCCL INFO socketPollConnect: connect to 10.0.0.5<41234> returned Connection refused, retrying\n")
    found = read(text)
    assert "bad-interface" not in found and found["connect-failed"].status == "FAIL", sorted(found)


# ------------------------------------------------------------------- blind set 8's lessons (tests/data/nccl/blind8)

def read_any(text: str) -> dict[str, Check]:
    """:func:`read`, or no verdict for a text the reader finds nothing in (it raises ValueError then)."""
    try:
        return read(text)
    except ValueError:
        return {}


def test_a_ranks_own_python_exception_is_the_cause_unless_a_specific_failure_is_named() -> None:
    """The last line of a rank's traceback names why it stopped; the others' watchdog errors follow from it.  It is
    read only where no other catalog entry reads the line (last_resort), and becomes context beside a named failure."""
    watchdog = ("[rank0]:[E1031 11:33:14.593046631 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 0] Exception (either "
                "an error or timeout) detected by watchdog at work: 438, last enqueued NCCL work: 451, last completed "
                "NCCL work: 437.\n")
    found = acting(read("[rank3]: KeyError: 'labels'\n" + watchdog))
    assert list(found) == ["rank-python-exception"] and found["rank-python-exception"].title.startswith(
        "rank 3 raised KeyError: 'labels'"), sorted(found)
    beside = read("[rank3]: KeyError: 'labels'\nh:1:1 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-x to "
                  "9637892 bytes, error: No space left on device\n")
    assert beside["rank-python-exception"].status == "INFO" and acting(beside).keys() == {"shm-full"}
    for consequence in ("[rank0]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited",
                        "RuntimeError: Engine core initialization failed. See root cause above.",
                        "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 1."):
        assert "rank-python-exception" not in read_any(consequence + "\n"), consequence


@pytest.mark.parametrize("line, entry", [
    # misc/strongstream.cc (2.19.3): CUDART_VERSION < 11030 or driver < 11030 while the stream is being captured
    ("NCCL WARN NCCL cannot be captured in a graph if either it wasn't built with CUDA runtime >= 11.3 or if the "
     "installed CUDA driver < R465.", "nccl-graph-capture-old-build"),
    # TE userbuffers-host.cpp: cuMulticastGetGranularity / cuMulticastCreate through NVTE_CALL_CHECK_CUDA_DRIVER
    ("RuntimeError: /te/transformer_engine/pytorch/csrc/userbuffers/userbuffers-host.cpp:208 in function "
     "create_communicator_grouped2: CUDA Error: operation not supported", "te-ub-multicast-unsupported"),
    ("2022-07-19T18:01:59.173796Z\tdebug\tenvoy connection\t[C72] remote early close", "service-mesh-sidecar"),
])
def test_messages_of_graph_capture_multicast_and_a_mesh_sidecar(line: str, entry: str) -> None:
    found = acting(read(line + "\n"))
    assert list(found) == [entry], sorted(found)


def test_other_userbuffers_errors_and_envoy_words_in_prose_are_not_those_readings() -> None:
    other = read_any("RuntimeError: userbuffers-host.cpp:208 in function create_communicator_grouped2: CUDA Error: out of memory\n")
    assert "te-ub-multicast-unsupported" not in other
    assert "service-mesh-sidecar" not in read_any("INFO: we deploy envoy-free pods; envoyconnection pooling off\n")


# ------------------------------------------------------------------- blind set 9's lessons (tests/data/nccl/blind9)

_MEMBERS = "".join(f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8\n" for r in (1, 2, 0, 3))


def test_fewer_lightning_members_than_the_world_size_names_the_ranks_that_never_started() -> None:
    """Lightning logs MEMBER k/N in each process before init_process_group; 4 of 8 and nothing later: a suspect."""
    found = acting(read("GPU available: True, used: True\n" + _MEMBERS))
    v = found["lightning-ranks-missing"]
    assert v.status == "WARN" and v.values["kind"] == "suspect" and not v.values.get("faulty"), v.line()
    assert v.values["announced"] == 4 and v.values["world_size"] == 8 and "srun" in v.remediation


@pytest.mark.parametrize("after", [
    "All distributed processes registered. Starting with 8 processes\n",          # rank 0: every rank joined
    "".join(f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8\n" for r in range(4, 8)),   # the other node's lines
])
def test_lightning_members_that_all_joined_say_nothing(after: str) -> None:
    assert "lightning-ranks-missing" not in read(_MEMBERS + after)


def test_a_rank_that_failed_inside_main_process_first_waited_for_the_main_process() -> None:
    """transformers' main_process_first: the replicas wait in a barrier while the main process preprocesses."""
    text = ('  File "run_clm.py", line 414, in main\n'
            '    with training_args.main_process_first(desc="dataset map tokenization"):\n'
            '  File "/usr/lib/python3.8/contextlib.py", line 113, in __enter__\n')
    v = read(text)["main-process-first-wait"]
    assert v.status == "WARN" and "ddp_timeout" in v.remediation and "barrier" in v.title


# ------------------------------------------------------------------- blind set 10's lessons (tests/data/nccl/blind10)

@pytest.mark.parametrize("line", [
    "RuntimeError: cuda runtime error (10) : invalid device ordinal at /pytorch/torch/csrc/cuda/Module.cpp:33",
    "[rank3]: torch.AcceleratorError: CUDA error: invalid device ordinal",
])
def test_an_invalid_device_ordinal_from_torch_names_too_many_processes_per_node(line: str) -> None:
    """HRNet-Semantic-Segmentation#171: --nproc_per_node above the node's GPUs; set_device(local_rank) fails."""
    v = read(line + "\n")["torch-invalid-device-ordinal"]
    assert v.status == "FAIL" and "LOCAL_RANK" in v.remediation and "nvidia-smi -L" in v.remediation


def test_nccls_own_cuda_failure_line_is_not_read_as_torchs() -> None:
    found = read_any("h:1:1 [0] NCCL WARN Cuda failure 'invalid device ordinal'\n")
    assert "torch-invalid-device-ordinal" not in found


# ------------------------------------------------------------------- blind set 11's lessons (tests/data/nccl/blind11)

NEVER_INIT = ("[1,1]<stdout>:n1:126624:126758 [1] misc/argcheck.cc:39 NCCL WARN Broadcast : invalid root 0 (root should "
              "be in the 0..-1 range)\n"
              "[1,1]<stdout>:n1:126624:126758 [1] NCCL INFO comm 0x7f72 rank -1 nranks -1 cudaDev -1 busId ffffffffffffffff "
              "- Abort COMPLETE\n")


def test_a_collective_on_a_communicator_with_no_ranks_points_at_the_failed_init() -> None:
    """horovod#3752: argcheck.cc prints comm->nRanks; -1 is a communicator whose init never completed."""
    found = read(NEVER_INIT)
    v = found["comm-never-initialized"]
    assert v.status == "FAIL" and v.values["kind"] == "suspect" and "init" in v.title
    assert list(acting(found)) == ["comm-never-initialized"]  # the invalid-root reading is its consequence
    # a real root out of range on a working communicator stays the call's fault
    ok = read("h:1:2 [0] misc/argcheck.cc:39 NCCL WARN Broadcast : invalid root 9 (root should be in the 0..8 range)\n")
    assert "comm-never-initialized" not in ok and ok["nccl.usage-error"].status == "FAIL"


def test_the_failed_init_is_context_when_another_verdict_states_the_cause() -> None:
    found = read(DRIVER_36)
    assert found["comm-never-initialized"].status == "INFO"


def test_a_stream_capture_error_from_the_watchdog_is_the_capture_timing() -> None:
    """physicsnemo#107: CUDA graph capture began while the watchdog still queried the warm-up collectives' events."""
    v = read("[E ProcessGroupNCCL.cpp:830] [Rank 10] NCCL watchdog thread terminated with exception: CUDA error: "
             "operation not permitted when stream is capturing\n")
    hit = v["nccl.cuda-operation-not-permitted-when-stream-is-capturing"]
    assert hit.status == "FAIL" and "watchdog" in hit.title and "synchronize" in hit.remediation


def test_a_crash_in_ncclS_ras_thread() -> None:
    """nccl#1996: the frames of the crash are RAS functions (src/ras/*.cc); UCX's handler above them only reports it."""
    text = ("[n1:288505:0:296459] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x48)\n"
            " 0  /usr/lib/libucs.so.0(ucs_handle_error+0x2d4) [0x7fedc925c274]\n"
            "1 0x0000000000122927rasMsgHandlePeersUpdate() /opt/nccl/lib/libnccl.so\n")
    v = read(text)["nccl-ras-crash"]
    assert v.status == "FAIL" and "NCCL_RAS_ENABLE=0" in v.remediation
    # a word that merely contains "ras" is no RAS frame
    assert "nccl-ras-crash" not in read_any("h:1:2 [0] NCCL WARN Cuda failure 'out of memory' while erasing buffers\n")


def test_a_single_process_nccl_tests_run_is_one_node() -> None:
    """nccl-tests' device table lists every rank of the job (gathered to rank 0): one rank on one host is a one-node
    job, so a Docker bridge in NET/Socket's list is INFO, not a fix to apply."""
    text = ("#  Rank  0 Group  0 Pid  69438 on box device  0 [0x01] NVIDIA RTX A6000\n"
            "box:69438:69444 [0] NCCL INFO NET/Socket : Using [0]enp3s0f0:10.50.56.33<0> [1]br-50a6a39f12ff:172.18.0.1<0>\n")
    assert read(text)["bad-interface"].status == "INFO"
    two = text.replace("#  Rank  0", "#  Rank  1 Group  0 Pid  1 on other device  0 [0x01] A\n#  Rank  0")
    assert read(two)["bad-interface"].status == "FAIL"
