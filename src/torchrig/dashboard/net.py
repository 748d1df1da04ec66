"""This host's address on the network, for the URLs that ``--public`` servers print."""

from __future__ import annotations

import socket


def lan_address() -> str | None:
    """The address this host's default route leaves from (what others on the LAN reach it at); None when
    it has no route but loopback. A UDP ``connect`` sends no packet: it only asks the kernel for a route
    (``ip route get 192.0.2.1`` is the shell equivalent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): never a real host
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip
