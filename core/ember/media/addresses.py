"""Which addresses a media download may reach, and how a host becomes addresses: the
SSRF policy ``ember.media.fetch`` applies at every hop."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from ember.media.special_addresses import IPV6_GLOBAL_UNICAST, special_block

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 forms a connection leaves through to the IPv4 address inside: a dual-stack socket
# (IPv4-mapped, RFC 4291 §2.5.5.2), a NAT64 gateway (RFC 6052's well-known prefix), a 6to4
# relay (RFC 3056). Each is judged as that IPv4 address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public_address(address: Address) -> bool:
    """True for a globally reachable unicast address; the default policy for every hop.

    By the IANA special-purpose registries (``special_addresses``: loopback, private,
    link-local, shared, documentation, benchmarking, SRv6, ... refused) and the IPv6
    address space registry (only 2000::/3 is global unicast: the deprecated IPv4-compatible
    ``::127.0.0.1``, IPv4-translated ``::ffff:0:7f00:1`` and site-local ``fec0::`` are not),
    and by Python's own copy of them (``is_global``): either calling an address not
    global refuses it. Multicast is refused. IPv4-mapped, NAT64 and 6to4 addresses are
    judged by the IPv4 address they carry; Teredo (N/A in the registry) is refused.
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public_address(embedded)
    if address.is_multicast or not address.is_global:
        return False
    block = special_block(address)
    if block is not None:
        return block.globally_reachable is True
    return address.version == 4 or address in IPV6_GLOBAL_UNICAST


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a connection to ``address`` would reach, for the forms that have one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


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
