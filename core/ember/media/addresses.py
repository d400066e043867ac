"""Which addresses a media download may reach, and how a host becomes addresses: the
SSRF policy ``ember.media.fetch`` applies at every hop."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Non-global ranges that older Pythons' ``is_global`` tables miss (3.11 calls 192.0.0.8
# global), and the IPv6 prefixes that carry an IPv4 address a gateway would connect to.
_NOT_GLOBAL = (
    ipaddress.ip_network("192.0.0.0/24"),
    ipaddress.ip_network("64:ff9b:1::/48"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public_address(address: Address) -> bool:
    """True for a globally routable unicast address; the default policy for every hop.

    Refuses loopback, private, link-local, multicast, unspecified, reserved and shared
    (100.64/10) ranges, and an IPv6 address that embeds a refused IPv4 one (IPv4-mapped
    ``::ffff:127.0.0.1``, 6to4, Teredo, NAT64): a gateway would connect to the embedded one.
    """
    if not address.is_global or address.is_multicast:
        return False
    if any(address in net for net in _NOT_GLOBAL if net.version == address.version):
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded: list[ipaddress.IPv4Address] = []
        if address.ipv4_mapped is not None:
            embedded.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            embedded.append(address.sixtofour)
        if address.teredo is not None:
            embedded.extend(address.teredo)
        if address in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(is_public_address(v4) for v4 in embedded)
    return True


def any_address(address: Address) -> bool:
    """The policy under ``--allow-private-urls``: every address may be fetched."""
    return True


async def resolve_host(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to, in the resolver's order, without duplicates.

    Goes through ``getaddrinfo`` like a connection would, so an IPv4 written as an integer
    (``2130706433``) or in hex resolves to the address it means and is checked as that.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found: list[Address] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ipaddress.ip_address(sockaddr[0])
            if address not in found:
                found.append(address)
    return found
