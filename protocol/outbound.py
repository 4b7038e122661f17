"""The one policy for outbound HTTP to addresses a run's config names (webhooks now; any later
call the server or the learner makes for a run goes through `client`).

A run's creator chooses the URL, so the control plane must not become a way into its own
network: loopback, link-local, private (RFC 1918, fc00::/7), CGNAT, "this network" and other
non-global addresses are refused unless the operator allows them (all private ones, or some
CIDRs). The check runs on the resolved addresses at connect time, inside the HTTP client's
network backend: the name is resolved once, every address it resolves to is checked, and the
connection goes to a checked address, so a name that resolves to a public address at
registration and to 127.0.0.1 later is still refused. TLS keeps the URL's host name for SNI
and certificate checks (httpcore starts TLS with the request's host, not the connected one).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

# Refused even where Python calls them global; the rest is `not is_global` or multicast.
_ALWAYS_CHECKED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network": 0.0.0.0 reaches the local host on Linux
        "100.64.0.0/10",  # CGNAT shared space
        "::/96",  # deprecated IPv4-compatible IPv6 (::127.0.0.1)
    )
)


REDACTED = "[redacted]"
# In a URL the mark stays parsable (urlsplit refuses brackets around a non-IP host).
_REDACTED_PART = "redacted"
# A host whose last label is a number is an IPv4 address to resolvers (inet_aton, browsers'
# URL parsers): 0177.0.0.1 (octal), 0x7f.1, 127.1 and 2130706433 all reach 127.0.0.1.
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0[xX][0-9a-fA-F]*)")
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")


def normalised_url(url: str) -> str:
    """`url` as the delivery client (httpx) parses and sends it (lower-case scheme and host,
    IDNA host, percent-encoded path, default port dropped), or ValueError with the reason it
    cannot be used. An IP literal must be canonical: four decimal numbers 0-255 without leading
    zeros (or a bracketed IPv6 address); octal, hexadecimal, zero-padded, out-of-range, short
    (127.1) and integer (2130706433) forms are refused, since parsers and resolvers read them
    differently and the outbound policy must check the address that is reached."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError as exc:
        raise ValueError(f"cannot be parsed as a URL: {exc}") from None
    _check_ipv4(host)  # before httpx, whose reason for 0177.0.0.1 is less clear
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"cannot be parsed as a URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    host = parsed.raw_host.decode("ascii")
    if not host:
        raise ValueError("has no host")
    if not _check_ipv4(host) and ":" not in host and not _NAME.fullmatch(host):
        raise ValueError(
            f"host {host!r} is not a host name (letters, digits, '-' and '_' in "
            "dot-separated labels) or an IP address"
        )
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ValueError(f"port {parsed.port} is not in 1-65535")
    return str(parsed.copy_with(fragment=None))


def _check_ipv4(host: str) -> bool:
    """Whether `host` is meant as an IPv4 address (its last label is a number); ValueError
    unless it is the canonical form."""
    if ":" in host or not _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
        return False  # IPv6 (httpx checks it), or a name
    try:
        canonical = str(ipaddress.IPv4Address(host)) == host
    except ValueError:
        canonical = False
    if not canonical:
        raise ValueError(
            f"host {host!r} is not a canonical IPv4 address: write four decimal numbers 0-255 "
            "without leading zeros, e.g. 192.0.2.10 (octal, hexadecimal, zero-padded, "
            "out-of-range, short and integer forms are refused)"
        )
    return True


def redacted_url(url: str) -> str:
    """A URL as it may be shown (API answers, pages, logs, trackers): scheme, host, port and
    path kept; its user:password and its query (where keyed or presigned URLs carry their
    secret) each replaced by `redacted`, so that it is still a URL; the fragment dropped.
    Unparsable: [redacted] whole."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    if parts.username is not None or parts.password is not None:
        host = f"{_REDACTED_PART}@{host}"
    query = _REDACTED_PART if parts.query else ""
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


class OutboundRefused(Exception):
    """A destination the outbound policy does not allow (nothing was sent)."""


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo, TCP)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# NAT64's well-known prefix (RFC 6052): a NAT64 gateway sends 64:ff9b::a9fe:a9fe to
# 169.254.169.254 on its own network.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _unwrapped(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form embeds and reaches, else `address`."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if address.sixtofour is not None:
        return address.sixtofour  # 6to4: 2002:7f00:1:: is relayed to 127.0.0.1
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def check_networks(cidrs: list[str]) -> list[str]:
    """The settings' `outbound_allow_cidrs` (server and learner), or ValueError naming the
    first entry that is not a network."""
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise ValueError(f"{cidr!r} is not a network (CIDR), e.g. 10.20.0.0/16") from exc
    return cidrs


@dataclass(frozen=True)
class OutboundPolicy:
    """Which destination addresses outbound calls may reach: global ones always; private,
    loopback and link-local ones only with `allow_private` or inside `allow_cidrs`."""

    allow_private: bool = False
    allow_cidrs: tuple[IPNetwork, ...] = ()
    resolver: Resolver = system_resolver

    @classmethod
    def from_settings(cls, allow_private: bool, allow_cidrs: Iterable[str]) -> OutboundPolicy:
        return cls(allow_private, tuple(ipaddress.ip_network(c, strict=False) for c in allow_cidrs))

    def refusal(self, address: str) -> str | None:
        """Why `address` (an IP literal) may not be reached, or None when it may."""
        ip = _unwrapped(ipaddress.ip_address(address.split("%")[0]))
        if self.allow_private or any(ip in net for net in self.allow_cidrs):
            return None
        if ip.is_global and not ip.is_multicast and not any(ip in n for n in _ALWAYS_CHECKED):
            return None
        return (
            f"{ip} is a loopback, link-local, private, multicast or otherwise non-public address "
            "(allowed only with ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE or ASYNCGRPO_OUTBOUND_ALLOW_CIDRS)"
        )

    def checked_address(self, host: str, port: int) -> str:
        """Resolve `host`, refuse it unless every address is allowed, return one to connect."""
        try:
            addresses = self.resolver(host, port)
        except OSError as exc:
            raise OutboundRefused(f"cannot resolve {host!r}: {exc}") from exc
        if not addresses:
            raise OutboundRefused(f"{host!r} resolves to no address")
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise OutboundRefused(f"refused {host!r}: {reason}")
        return addresses[0]

    def literal_refusal(self, url: str) -> str | None:
        """At registration: why a URL whose host is an IP literal is refused (None for host
        names: those are checked when a call resolves them)."""
        host = urlparse(url).hostname
        if host is None:
            return None
        try:
            ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            return None
        return self.refusal(host)


PUBLIC_ONLY = OutboundPolicy()


class _CheckingBackend(httpcore.SyncBackend):
    """httpcore's socket backend, connecting only to addresses the policy allows."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self.policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        address = self.policy.checked_address(host, port)
        return super().connect_tcp(address, port, timeout, local_address, socket_options)

    def connect_unix_socket(self, *_: Any, **__: Any) -> httpcore.NetworkStream:
        raise OutboundRefused("unix sockets are not an outbound destination")


class _PolicyTransport(httpx.HTTPTransport):
    def __init__(self, policy: OutboundPolicy, max_connections: int) -> None:
        super().__init__(trust_env=False)
        # httpx builds its pool without a way to pass a network backend: rebuild it with one
        # (same TLS context as httpx's default, verified).
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=_CheckingBackend(policy),
            max_connections=max_connections,
        )


def client(policy: OutboundPolicy, *, timeout_s: float, max_connections: int = 10) -> httpx.Client:
    """An httpx client whose every connection goes through `policy` (no environment
    proxies: a proxy would connect on the caller's behalf, unchecked). Refused destinations
    raise OutboundRefused; redirects are not followed. At most `max_connections` requests
    are in flight at once (more wait for a connection)."""
    return httpx.Client(
        transport=_PolicyTransport(policy, max_connections),
        timeout=timeout_s,
        trust_env=False,
        follow_redirects=False,
    )
