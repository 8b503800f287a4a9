"""Where an alert webhook may post (no network): the address classifier against Python's
ipaddress properties, the forms a host denotes an address in, the setting's check at
install(), and the send-time check on the address actually connected to (resolved once,
every address checked, the connection pinned to a checked one)."""

from __future__ import annotations

import logging
import socket
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery import ConfigurationError, JobbersConfig
from jobbers_celery.alerts import AlertEvent, AlertKind, Alerts, webhook
from jobbers_celery.alerts.webhook import RefusedDestination, WebhookError, post
from jobbers_celery.core.destinations import (
    embedded_ipv4,
    host_address,
    host_refusal,
    parse_networks,
    refusal,
)
from jobbers_celery.testing import InMemoryStore

ipv4 = st.integers(0, 2**32 - 1).map(IPv4Address)
ipv6 = st.integers(0, 2**128 - 1).map(IPv6Address)


def non_public(address: IPv4Address | IPv6Address) -> bool:
    """Python's own word on an address jobbers must not post to."""
    return (address.is_loopback or address.is_private or address.is_link_local
            or address.is_multicast or address.is_reserved or address.is_unspecified
            or not address.is_global)


# ---------------------------------------------------------------- the classifier
@pytest.mark.parametrize(("address", "says"), [
    ("169.254.169.254", "link-local"), ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
    ("100.100.100.200", "non-global"), ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"),
    ("240.0.0.1", "private"), ("::1", "loopback"), ("::", "unspecified"),
    ("fe80::1", "link-local"), ("fd00::1", "private"), ("ff02::1", "multicast"),
    ("fec0::1", "site-local"), ("::ffff:127.0.0.1", "loopback (as 127.0.0.1)"),
    ("::ffff:169.254.169.254", "link-local (as 169.254.169.254)"),
    ("2002:a00:1::1", "private (as 10.0.0.1)"),
    ("64:ff9b::a9fe:a9fe", "link-local (as 169.254.169.254)"),
])
def test_internal_addresses_are_refused_saying_what_they_are(address: str, says: str) -> None:
    assert refusal(ip_address(address)) == says


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111",
                                     "::ffff:8.8.8.8", "2002:808:808::1"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ip_address(address)) is None


@given(ipv4)
def test_an_ipv4_address_is_refused_exactly_when_python_calls_it_not_public(
        address: IPv4Address) -> None:
    assert (refusal(address) is not None) == non_public(address)


@given(ipv4)
def test_an_ipv4_mapped_address_is_judged_as_its_ipv4_address(address: IPv4Address) -> None:
    mapped = IPv6Address(f"::ffff:{address}")
    assert (refusal(mapped) is None) == (refusal(address) is None)
    allow = [ip_network(f"{address}/32")]
    assert refusal(mapped, allow) is None


@given(ipv6)
def test_an_ipv6_address_is_refused_when_it_or_what_it_carries_is_not_public(
        address: IPv6Address) -> None:
    inner = embedded_ipv4(address)
    if address.ipv4_mapped is not None:
        expected = non_public(address.ipv4_mapped)
    else:
        expected = non_public(address) or (inner is not None and non_public(inner))
    assert (refusal(address) is not None) == expected


@given(st.one_of(ipv4, ipv6), st.integers(0, 32))
def test_a_network_allowed_lets_its_addresses_in(address: Any, bits: int) -> None:
    prefix = bits if address.version == 4 else bits * 4
    network = ip_network(f"{address}/{prefix}", strict=False)
    assert refusal(address, [network]) is None
    other = ip_network("::/0") if address.version == 4 else ip_network("0.0.0.0/0")
    assert (refusal(address, [other]) is None) == (refusal(address) is None)


# ---------------------------------------------------------------- what a host says
@pytest.mark.parametrize(("host", "address"), [
    ("127.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
    ("2130706433", "127.0.0.1"), ("017700000001", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
    ("0", "0.0.0.0"), ("[::1]", "::1"), ("::ffff:7f00:1", "::ffff:7f00:1"),
    ("hooks.example.com", None), ("deadbeef", None), ("1.2.3.4.5", None), ("", None),
])
def test_every_form_the_resolver_reads_as_an_address(host: str, address: str | None) -> None:
    found = host_address(host)
    assert (str(found) if found is not None else None) == address


@given(ipv4)
def test_the_decimal_and_hex_forms_of_an_ipv4_address_are_read(address: IPv4Address) -> None:
    assert host_address(str(int(address))) == address
    assert host_address(hex(int(address))) == address


def test_localhost_names_are_refused_unless_loopback_is_allowed() -> None:
    for name in ("localhost", "LOCALHOST.", "admin.localhost"):
        assert host_refusal(name) == f"{name.lower().rstrip('.')}, a loopback name"
    assert host_refusal("localhost", parse_networks(["127.0.0.0/8", "::1/128"])) is None
    assert host_refusal("hooks.example.com") is None  # checked once resolved


@pytest.mark.parametrize("raw", ["10.0.0.0/8", ["10.0.0.1/8"], ["nope"], [3], ["x" * 100]])
def test_a_bad_allowance_is_refused(raw: Any) -> None:
    with pytest.raises(ConfigurationError, match="jobbers_alert_webhook_allow_networks"):
        parse_networks(raw)


# ---------------------------------------------------------------- the setting
def config(url: str, **more: Any) -> JobbersConfig:
    return JobbersConfig.from_mapping({"jobbers_redis_url": "redis://x", "jobbers_alerts": [
        {"name": "r", "kind": "stall", "webhooks": [url]}], **more})


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/SECRET", "http://127.0.0.1:8500/SECRET",
    "https://10.1.2.3/SECRET", "http://[::ffff:127.0.0.1]/SECRET", "http://2130706433/SECRET",
    "http://localhost:9200/SECRET", "http://[fe80::1]/SECRET"])
def test_a_setting_webhook_to_an_internal_address_is_refused_at_install(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        config(url)
    message = str(refused.value)
    assert message.startswith("jobbers_alerts[0] 'r'.webhooks: ")
    assert "jobbers_alert_webhook_allow_networks" in message
    assert "SECRET" not in message


def test_the_allowance_lets_an_internal_receiver_in() -> None:
    config("http://127.0.0.1:8500/x", jobbers_alert_webhook_allow_networks=["127.0.0.0/8"])
    config("http://10.1.2.3/x", jobbers_alert_webhook_allow_networks=["10.0.0.0/8"])
    with pytest.raises(ConfigurationError, match=r"10\.1\.2\.3, a private address"):
        config("http://10.1.2.3/x", jobbers_alert_webhook_allow_networks=["10.2.0.0/16"])
    config("https://hooks.example.com/x")  # a name: checked at each send


# ---------------------------------------------------------------- at send time
class Lookups:
    """``socket.getaddrinfo`` answering from a script: what each call returns."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, host: str, port: int, *_: Any, **__: Any) -> list[Any]:
        self.calls += 1
        addresses = self.answers[min(self.calls, len(self.answers)) - 1]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port) if ":" not in a else (a, port, 0, 0)) for a in addresses]


@pytest.fixture
def connected(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Where post connected (nothing really is: it fails right after)."""
    seen: list[Any] = []

    def connect(found: list[Any], deadline: float) -> socket.socket:
        seen.extend(sockaddr for _, sockaddr in found)
        raise ConnectionRefusedError("stand-in")

    monkeypatch.setattr(webhook, "_connect", connect)
    return seen


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["8.8.8.8", "10.0.0.5"],
                                    ["2606:4700::1111", "::ffff:169.254.169.254"]])
def test_a_name_resolving_to_any_internal_address_is_refused_before_connecting(
        monkeypatch: pytest.MonkeyPatch, connected: list[Any], answer: list[str]) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", Lookups(answer))
    with pytest.raises(RefusedDestination) as refused:
        post("https://hooks.example.com/services/SECRET", {"text": "x"}, 5)
    assert str(refused.value).startswith("https://hooks.example.com refused: it resolves to ")
    assert "SECRET" not in str(refused.value)
    assert connected == []


def test_the_connection_goes_to_the_address_checked_no_second_lookup(
        monkeypatch: pytest.MonkeyPatch, connected: list[Any]) -> None:
    lookups = Lookups(["8.8.8.8"], ["127.0.0.1"])  # a rebinding name: public, then local
    monkeypatch.setattr(socket, "getaddrinfo", lookups)
    with pytest.raises(WebhookError, match="unreachable: ConnectionRefusedError"):
        post("https://hooks.example.com/services/x", {"text": "x"}, 5)
    assert lookups.calls == 1
    assert connected == [("8.8.8.8", 443)]


def test_an_address_literal_is_refused_without_any_lookup(connected: list[Any]) -> None:
    for url in ("http://127.0.0.1:9/x", "http://0x7f000001/x", "http://[::1]:9/x",
                "http://169.254.169.254/latest"):
        with pytest.raises(RefusedDestination):
            post(url, {"text": "x"}, 5)
    assert connected == []


def test_the_admin_forms_check_says_why_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    alerts = Alerts(InMemoryStore(), JobbersConfig.from_mapping({"jobbers_redis_url":
                                                                  "redis://x"}))
    monkeypatch.setattr(socket, "getaddrinfo", Lookups(["10.9.8.7"]))
    assert "10.9.8.7, a private address" in (alerts.refusal("https://hooks.example.com/x")
                                            or "")

    def no_such_name(*_: Any, **__: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    assert alerts.refusal("https://hooks.example.com/x") is None  # each send checks again


def test_a_refusal_at_send_time_is_logged_escaped_and_blocks_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobbers.alerts")
    monkeypatch.setattr(socket, "getaddrinfo", Lookups(["127.0.0.1"]))
    url = "https://hooks\x1bX\x07.example.com/services/SECRET"
    alerts = Alerts(InMemoryStore(), config(url))
    alerts.emit(AlertEvent(AlertKind.STALL, "proj.add", "stalled", "x", task_name="proj.add"))
    assert alerts.flush(5)
    assert alerts.stats["failed"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "\x1b" not in line
    assert "\\x1b" in line
    assert "SECRET" not in line
    assert "127.0.0.1, a loopback address" in line


# ---------------------------------------------------------------- the request written
@given(st.text(st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cs"),
                             blacklist_characters="\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85#/"),
               max_size=60),
       st.text(max_size=30).filter(lambda q: not any(c.isspace() for c in q)
                                    and "#" not in q))
def test_whatever_the_path_the_request_head_is_one_line_each_of_ascii(
        path: str, query: str) -> None:
    url = f"https://hooks.example.com/services/{path}" + (f"?{query}" if query else "")
    host, port, request = webhook._request(url, b'{"text": "x"}')
    head, body = request.split(b"\r\n\r\n", 1)
    assert (host, port, body) == ("hooks.example.com", 443, b'{"text": "x"}')
    lines = head.decode("ascii").split("\r\n")
    assert all(line.isprintable() for line in lines)
    method, target, version = lines[0].split(" ")
    assert (method, version) == ("POST", "HTTP/1.1")
    assert target.startswith("/services/")
    assert lines[1:] == ["Host: hooks.example.com",
                         "Content-Type: application/json; charset=utf-8",
                         "User-Agent: jobbers-alerts", "Content-Length: 13",
                         "Connection: close"]


def test_the_host_header_port_and_credentials() -> None:
    _, port, request = webhook._request("http://user:p%40ss@bücher.example:8080/h", b"")
    assert port == 8080
    assert b"Host: xn--bcher-kva.example:8080\r\n" in request
    assert b"Authorization: Basic dXNlcjpwQHNz\r\n" in request  # user:p@ss
    assert b"Host: [2606:4700::1111]\r\n" in webhook._request("https://[2606:4700::1111]/h",
                                                             b"")[2]
    with pytest.raises(ValueError, match="not a name"):
        webhook._request("https://hooks\x1bx.example.com/h", b"")
    # an address is written in its own form, never the URL's text; a zone id is refused
    # (free text: it carried a raw space, VT, NUL or DEL to the Host line)
    assert b"Host: [2606:4700::1111]\r\n" in webhook._request(
        "https://[2606:4700:0:0:0:0:0:1111]/h", b"")[2]
    for zone in ("%25eth0", "%25\x0b\x00 x", "%25\x7f"):
        with pytest.raises(ValueError, match="zone id"):
            webhook._request(f"http://[2606:4700::1{zone}]/p", b"")
