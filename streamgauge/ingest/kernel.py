"""Datagrams the kernel dropped before the receiver could read them.

Two sources (Linux):

- ``/proc/net/udp`` and ``/proc/net/udp6``: one row per socket, matched by inode; the last
  column, ``drops``, counts datagrams refused because *that* socket's receive buffer was full.
- ``/proc/net/snmp`` ``Udp: RcvbufErrors`` (and ``/proc/net/snmp6`` ``Udp6RcvbufErrors``):
  the same event summed over every UDP socket of the network namespace — other programs'
  drops included, so it is reported as context, not as our loss.

Both are cumulative; the receiver reports differences since it started. Where ``/proc`` is
missing (not Linux) every reading is 0.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

PROC_NET = Path("/proc/net")


def socket_inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def udp_socket_drops(inodes: set[int], proc_net: Path = PROC_NET) -> dict[int, int]:
    """Cumulative ``drops`` per socket inode, for the inodes found in ``udp``/``udp6``."""
    found: dict[int, int] = {}
    for table in ("udp", "udp6"):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            columns = line.split()
            # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            if len(columns) < 13:
                continue
            try:
                inode = int(columns[9])
                if inode in inodes:
                    found[inode] = int(columns[12])
            except ValueError:
                continue
    return found


def udp_rcvbuf_errors(proc_net: Path = PROC_NET) -> int:
    """Namespace-wide ``RcvbufErrors`` for UDP over IPv4 and IPv6."""
    total = 0
    try:
        lines = (proc_net / "snmp").read_text().splitlines()
    except OSError:
        lines = []
    # "Udp: InDatagrams ... RcvbufErrors ..." then "Udp: 34569 ... 0 ...": a header row and
    # a value row with the same prefix.
    for header, values in zip(lines, lines[1:], strict=False):
        if header.startswith("Udp: ") and values.startswith("Udp: "):
            names, numbers = header.split()[1:], values.split()[1:]
            if "RcvbufErrors" in names and len(numbers) == len(names):
                total += int(numbers[names.index("RcvbufErrors")])
            break
    try:
        for line in (proc_net / "snmp6").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "Udp6RcvbufErrors":
                total += int(value.strip() or 0)
    except (OSError, ValueError):
        pass
    return total
