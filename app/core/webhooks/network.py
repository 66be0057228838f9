"""Where a webhook may be sent: an http(s) URL whose host resolves only to public
addresses, unless an admin allowed private ones for that endpoint. Checked when the endpoint
is made and again before every attempt (a name may resolve elsewhere later)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class Refused(ValueError):
    """The URL may not receive webhooks; the message says why."""


def check_url(url: str, allow_private: bool) -> None:
    """Refuse a URL that is not http(s), has no host, or resolves to a loopback, link-local,
    private, multicast, reserved or unspecified address (unless `allow_private`)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a bracketed host that is no address, a port out of range
        raise Refused(f"not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise Refused("a webhook URL is http:// or https:// with a host")
    if allow_private:
        return
    try:
        found = socket.getaddrinfo(
            host, port or (443 if parts.scheme == "https" else 80), proto=socket.IPPROTO_TCP
        )
    except (OSError, ValueError) as exc:
        raise Refused(f"{host} does not resolve: {exc}") from exc
    for *_, address in found:
        ip = ipaddress.ip_address(address[0])
        for reached in (ip, *_embedded(ip)):
            if not reached.is_global or reached.is_multicast:
                raise Refused(
                    f"{host} resolves to {ip}, which reaches {reached}: a loopback, link-local, "
                    "private or reserved address: an admin may allow it for this endpoint "
                    "(allow_private)"
                )


NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))


def _embedded(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to: mapped (::ffff:a.b.c.d), 6to4
    (2002:AABB:CCDD::), Teredo, and NAT64 (RFC 6052's well-known and local prefixes, whose
    last 32 bits are the IPv4 address a NAT64 gateway forwards to)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
    if any(ip in net for net in NAT64):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF))
    return [a for a in found if a is not None]
