"""One ICMP echo with a raw socket: the network pre-flight's ping on a node without iputils-ping.

``python3 icmp_probe.py DST SIZE DF SRC`` sends one echo request of SIZE payload bytes to DST (``DF`` = 1: the
"don't fragment" bit, ``IP_PMTUDISC_DO``, so a frame larger than the path MTU is dropped as ``ping -M do``
would have it), from the address SRC (``-``: the kernel's choice), and waits 1 s for the reply.  Output and exit
status follow ``ping -c 1``: ``1 packets transmitted, 1 received`` and 0; ``..., 0 received`` and 1; a local
error (``Message too long``: larger than the local MTU) and 2.  Needs root or CAP_NET_RAW.  Standard library only,
for any ``python3`` on the node (:func:`helpers.preflight.df_ping` runs it).

Example:
    python3 helpers/scenarios/icmp_probe.py 10.77.0.11 8972 1 -
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import sys
import time


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    data += b"\0" * (len(data) % 2)
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def main(argv: list[str] | None = None) -> int:
    """Send the echo and wait for it: 0 answered, 1 no answer within 1 s, 2 a local error or bad arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Example: python3 helpers/scenarios/icmp_probe.py 10.77.0.11 8972 1 -")
    parser.add_argument("dst", help="IPv4 address to ping")
    parser.add_argument("size", type=int, help="payload bytes (56 as ping's default; 8972 fills a 9000-byte MTU)")
    parser.add_argument("df", choices=("0", "1"), help="1: set don't-fragment (path-MTU probe)")
    parser.add_argument("src", help="source address to bind, or - for the kernel's choice")
    args = parser.parse_args(argv)
    if not 0 <= args.size <= 65507:
        parser.error(f"size={args.size}: 0..65507 payload bytes")
    ident, payload = os.getpid() & 0xFFFF, bytes(args.size)
    pkt = struct.pack("!BBHHH", 8, 0, checksum(struct.pack("!BBHHH", 8, 0, 0, ident, 1) + payload), ident, 1) + payload
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        if args.df == "1":
            s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: never fragment
        if args.src != "-":
            s.bind((args.src, 0))
        s.sendto(pkt, (args.dst, 0))
    except OSError as e:
        print("local error: %s" % e.strerror)
        return 2
    end = time.monotonic() + 1.0
    while True:
        left = end - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            print("1 packets transmitted, 0 received (python icmp probe)")
            return 1
        data, addr = s.recvfrom(65535)
        ihl = (data[0] & 15) * 4
        kind, _, _, rid, _ = struct.unpack("!BBHHH", data[ihl:ihl + 8])
        if kind == 0 and rid == ident and addr[0] == args.dst:
            print("1 packets transmitted, 1 received (python icmp probe)")
            return 0


if __name__ == "__main__":
    sys.exit(main())
