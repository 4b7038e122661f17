"""The URL rules of protocol/outbound.py: `normalised_url` accepts only what the delivery
client (httpx) sends as it was checked, and no IPv4 spelling a resolver reads differently;
`redacted_url` shows a URL without its user:password and query, still as a URL."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from protocol.outbound import REDACTED, normalised_url, redacted_url

# Hosts that inet_aton (what getaddrinfo falls back to for numbers) reads as an IPv4 address.
NUMERIC_HOSTS = [
    "127.0.0.1",
    "10.0.0.1",
    "0177.0.0.1",
    "0x7f.0.0.1",
    "0x7f.1",
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f000001",
    "017700000001",
    "0",
    "1.2.3.04",
]


@pytest.mark.parametrize("host", NUMERIC_HOSTS)
def test_an_ipv4_host_is_accepted_only_in_the_form_resolvers_read_as_written(host: str) -> None:
    reached = str(ipaddress.IPv4Address(socket.inet_aton(host)))
    url = f"http://{host}:8080/hook"
    if reached == host:
        assert httpx.URL(normalised_url(url)).host == reached
    else:
        with pytest.raises(ValueError, match="is not a canonical IPv4 address"):
            normalised_url(url)


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("HTTPS://Hooks.Example.COM:443/a b#frag", "https://hooks.example.com/a%20b"),
        ("http://u:p@h.example.com:8080/x?q=1", "http://u:p@h.example.com:8080/x?q=1"),
        ("http://münchen.example/", "http://xn--mnchen-3ya.example/"),
        ("http://[::FFFF:127.0.0.1]/x#f", "http://[::FFFF:127.0.0.1]/x"),  # as httpx writes it
    ],
)
def test_an_accepted_url_is_what_httpx_sends(url: str, normal: str) -> None:
    assert normalised_url(url) == normal
    assert str(httpx.URL(normal)) == normal  # stable: the stored form parses to itself


@pytest.mark.parametrize(
    "url",
    ["ftp://h.example.com/", "http:///x", "http://h.example.com:0/", "http://a..b/", "http://[::1"],
)
def test_a_url_the_client_cannot_use_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        normalised_url(url)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:pw@h.example.com/p?token=t#f", "https://redacted@h.example.com/p?redacted"),
        ("http://u@[::1]:8/x", "http://redacted@[::1]:8/x"),
        ("https://h.example.com/p", "https://h.example.com/p"),
        ("http://h.example.com:99999/", REDACTED),
    ],
)
def test_a_shown_url_has_no_credentials_or_query_and_is_still_a_url(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
    if shown != REDACTED:
        assert urlsplit(shown).hostname and httpx.URL(shown).host
