"""The source address an audit entry records (docs/architecture/security.md, "Trusted
proxies"): the connection's own address, unless that address is in the `audit.trusted_proxies`
networks; then the nearest address in X-Forwarded-For that is not a trusted proxy. A header
from any other connection is ignored: a client cannot choose the address it is recorded under.
The servers run uvicorn without its proxy headers (asyncgrpo/cli.py, asyncgrpo/cluster.py), so
the connection's address is the peer's, not one uvicorn read from a header."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.requests import HTTPConnection

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
FORWARDED_FOR = "x-forwarded-for"
MAX_SOURCE = 64  # the column's length


def networks(cidrs: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _trusted(address: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def source_address(connection: HTTPConnection, trusted: tuple[Network, ...]) -> str | None:
    """The address to record for this request."""
    peer = connection.client.host if connection.client else None
    if peer is None or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for h in connection.headers.get(FORWARDED_FOR, "").split(",") if h.strip()]
    # The proxy appends the address it saw: read from the right, past our own proxies.
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop[:MAX_SOURCE]
    return (hops[0] if hops else peer)[:MAX_SOURCE]
