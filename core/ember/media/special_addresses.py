"""The IANA special-purpose address registries, as data: which blocks are globally reachable.

Rows of https://www.iana.org/assignments/iana-ipv4-special-registry and
https://www.iana.org/assignments/iana-ipv6-special-registry (as updated to RFC 9602 and
RFC 9637, 2024), each with its "Globally Reachable" column: True, False, or None where the
registry says N/A (a block whose reachability is that of what it wraps or was retired).

Python's ``ipaddress`` copies these tables into ``is_global``/``is_private``, but each
Python version holds the copy of its release: 3.11.7 calls ``5f00::1`` (SRv6, 2024),
``3fff::1`` (documentation, 2024), ``fec0::1`` (site-local, deprecated in 2004) and
``::127.0.0.1`` (IPv4-compatible, deprecated in 2006) global. ``ember.media.addresses``
reads these rows (most specific first) as well as ``is_global``, and refuses an address
either calls not global. The IPv6 rows are completed by the IPv6 address space registry
(https://www.iana.org/assignments/ipv6-address-space): only 2000::/3 is global unicast,
so everything else not listed here (``::/8`` but its listed rows, ``4000::/3``,
``fec0::/10``, ...) is reserved, not public.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Block:
    network: Network
    name: str
    reference: str
    globally_reachable: bool | None  # None: the registry's N/A


def _rows(*rows: tuple[str, str, str, bool | None]) -> tuple[Block, ...]:
    blocks = [Block(ipaddress.ip_network(p), n, r, g) for p, n, r, g in rows]
    return tuple(sorted(blocks, key=lambda b: -b.network.prefixlen))  # most specific first


IPV4_SPECIAL_PURPOSE = _rows(
    ("0.0.0.0/8", '"This network"', "RFC 791 §3.2", False),
    ("0.0.0.0/32", '"This host on this network"', "RFC 1122 §3.2.1.3", False),
    ("10.0.0.0/8", "Private-Use", "RFC 1918", False),
    ("100.64.0.0/10", "Shared Address Space", "RFC 6598", False),
    ("127.0.0.0/8", "Loopback", "RFC 1122 §3.2.1.3", False),
    ("169.254.0.0/16", "Link Local", "RFC 3927", False),
    ("172.16.0.0/12", "Private-Use", "RFC 1918", False),
    ("192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890 §2.1", False),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", False),
    ("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", False),
    ("192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", True),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", True),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 §2.2", False),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 §2.2", False),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", False),
    ("192.31.196.0/24", "AS112-v4", "RFC 7535", True),
    ("192.52.193.0/24", "AMT", "RFC 7450", True),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", None),
    ("192.168.0.0/16", "Private-Use", "RFC 1918", False),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", True),
    ("198.18.0.0/15", "Benchmarking", "RFC 2544", False),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", False),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", False),
    ("240.0.0.0/4", "Reserved", "RFC 1112 §4", False),
    ("255.255.255.255/32", "Limited Broadcast", "RFC 8190, RFC 919 §7", False),
)

IPV6_SPECIAL_PURPOSE = _rows(
    ("::1/128", "Loopback Address", "RFC 4291", False),
    ("::/128", "Unspecified Address", "RFC 4291", False),
    ("::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", False),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", True),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215", False),
    ("100::/64", "Discard-Only Address Block", "RFC 6666", False),
    ("2001::/23", "IETF Protocol Assignments", "RFC 2928", False),
    ("2001::/32", "TEREDO", "RFC 4380, RFC 8190", None),
    ("2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", True),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", True),
    ("2001:2::/48", "Benchmarking", "RFC 5180, RFC Errata 1752", False),
    ("2001:3::/32", "AMT", "RFC 7450", True),
    ("2001:4:112::/48", "AS112-v6", "RFC 7535", True),
    ("2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", None),
    ("2001:20::/28", "ORCHIDv2", "RFC 7343", True),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", True),
    ("2001:db8::/32", "Documentation", "RFC 3849", False),
    ("2002::/16", "6to4", "RFC 3056", None),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", True),
    ("3fff::/20", "Documentation", "RFC 9637", False),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", False),
    ("fc00::/7", "Unique-Local", "RFC 4193, RFC 8190", False),
    ("fe80::/10", "Link-Local Unicast", "RFC 4291", False),
)

# The IPv6 address space registry's "Global Unicast" allocation (RFC 4291 §2.4).
IPV6_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


_BY_VERSION = {4: IPV4_SPECIAL_PURPOSE, 6: IPV6_SPECIAL_PURPOSE}


def special_block(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Block | None:
    """The most specific registry row holding ``address`` (None: an ordinary address)."""
    return next((b for b in _BY_VERSION[address.version] if address in b.network), None)
