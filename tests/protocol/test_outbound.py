"""The outbound policy (protocol/outbound.py): non-public destinations are refused on the
resolved addresses at connect time, unless the operator allows them; allowed calls connect to
the checked address with the URL's host kept."""

from __future__ import annotations

import ipaddress

import pytest

from protocol.outbound import OutboundPolicy, OutboundRefused, client
from tests.server.jobs.receiver import webhook_receiver

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "0.0.0.0",
    "0.1.2.3",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # CGNAT
    "255.255.255.255",
    "224.0.0.1",
    "ff02::1",
    "::1",
    "::",
    "fe80::1",
    "fe80::1%eth0",
    "fc00::1",
    "fd12:3456::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a00:1::",  # 6to4 of 10.0.0.1
]
PUBLIC = [
    "93.184.216.34",
    "8.8.8.8",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused_by_default(address: str) -> None:
    reason = OutboundPolicy().refusal(address)
    assert reason is not None and "ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE" in reason
    assert OutboundPolicy(allow_private=True).refusal(address) is None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert OutboundPolicy().refusal(address) is None


def test_allowed_networks_open_only_themselves() -> None:
    policy = OutboundPolicy.from_settings(False, ["10.20.0.0/16", "fd00::/8"])
    assert policy.refusal("10.20.3.4") is None and policy.refusal("fd00::5") is None
    assert policy.refusal("::ffff:10.20.3.4") is None
    assert policy.refusal("10.21.0.1") is not None and policy.refusal("127.0.0.1") is not None


def test_every_resolved_address_must_be_allowed() -> None:
    def resolver(host: str, port: int) -> list[str]:
        return {"mixed.test": ["93.184.216.34", "10.0.0.7"], "none.test": []}[host]

    policy = OutboundPolicy(resolver=resolver)
    with pytest.raises(OutboundRefused, match=r"refused 'mixed.test': 10\.0\.0\.7"):
        policy.checked_address("mixed.test", 80)
    with pytest.raises(OutboundRefused, match="resolves to no address"):
        policy.checked_address("none.test", 80)


def test_literal_check_at_registration() -> None:
    policy = OutboundPolicy()
    assert policy.literal_refusal("http://127.0.0.1:9/hook") is not None
    assert policy.literal_refusal("http://[::1]/hook") is not None
    assert policy.literal_refusal("http://[::ffff:7f00:1]/hook") is not None
    assert policy.literal_refusal("https://hooks.example.com/x") is None  # checked at send
    assert policy.literal_refusal("https://8.8.8.8/x") is None
    assert OutboundPolicy(allow_private=True).literal_refusal("http://127.0.0.1/") is None


@pytest.mark.integration  # a webhook receiver on 127.0.0.1
def test_the_client_refuses_loopback_unless_allowed() -> None:
    with webhook_receiver([]) as receiver:
        with client(OutboundPolicy(), timeout_s=5) as http:
            with pytest.raises(OutboundRefused, match="127.0.0.1"):
                http.post(receiver.url, content=b"{}")
        with client(OutboundPolicy(allow_private=True), timeout_s=5) as http:
            assert http.post(receiver.url, content=b"{}").status_code == 200
    assert len(receiver.requests) == 1  # the refused call sent nothing


@pytest.mark.integration  # a webhook receiver on 127.0.0.1
def test_a_name_is_checked_on_what_it_resolves_to_at_send_time() -> None:
    """A stand-in DNS: the name first resolves to an allowed address, then to a private one
    (rebinding). The second call is refused although the name is the same; the first
    connected to the checked address with the URL's host in the Host header."""
    answers = {"hooks.test": ["127.0.0.1"]}

    def resolver(host: str, port: int) -> list[str]:
        return answers[host]

    loopback = [ipaddress.ip_network("127.0.0.0/8")]
    policy = OutboundPolicy(allow_cidrs=tuple(loopback), resolver=resolver)
    with webhook_receiver([]) as receiver:
        url = receiver.url.replace("127.0.0.1", "hooks.test")
        with client(policy, timeout_s=5) as http:
            assert http.post(url, content=b"{}").status_code == 200
            answers["hooks.test"] = ["192.168.7.7"]
            with pytest.raises(OutboundRefused, match=r"'hooks.test': 192\.168\.7\.7"):
                http.post(url, content=b"{}", headers={"Connection": "close"})
    ((headers, _),) = receiver.requests
    assert headers["host"].startswith("hooks.test:")


@pytest.mark.integration  # a webhook receiver on 127.0.0.1
def test_environment_proxies_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy would connect on the caller's behalf, past the check."""
    monkeypatch.setenv("HTTP_PROXY", "http://93.184.216.34:3128")
    monkeypatch.setenv("ALL_PROXY", "http://93.184.216.34:3128")
    with webhook_receiver([]) as receiver:
        with client(OutboundPolicy(), timeout_s=5) as http:
            with pytest.raises(OutboundRefused):
                http.post(receiver.url, content=b"{}")
