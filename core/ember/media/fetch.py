"""Image and audio inputs -> bytes: http(s) downloads that cannot reach inside the network,
base64 ``data:`` URIs and raw bytes, each bounded in size and time.

A URL is a request from a client to make this server connect somewhere (SSRF). So the host
is resolved here, every address it resolves to must be public (``is_public_address``)
unless ``--allow-private-urls``, and the connection goes to a checked address: the URL is
rewritten to that IP with the original ``Host`` header and, for https, the hostname as
SNI and for certificate checks, so no second DNS lookup can answer differently
(DNS rebinding). Redirects are followed by hand, each target checked again, at most
``MAX_REDIRECTS``. No cookies are kept, no proxy or ``.netrc`` credentials are read from
the environment, and URLs carrying credentials are refused.

What the downloads may cost is held to a ``RequestBudget`` (``ember.media.budget``): a
request runs at most ``max_request_fetches`` at once, each also holding one of the
server's ``max_fetches`` slots (waiting for a slot is bounded by the request's deadline,
not by ``fetch_timeout``), and its items' bytes count against the request's total and the
server's bytes held. A connection that fails because this process is out of file
descriptors is a 503, logged: the remote is not to blame.

Every error names the input's 0-based position (``input 2: ...``): a refused or failed
download, a non-2xx answer and a timeout are 400 (SPEC-NOTES: the input is unusable, not
the server slow); more than ``max_bytes`` is 413, at once from a declared
``Content-Length`` or while streaming a body that has none.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from ember import __version__
from ember.errors import BadRequest, EmberError, MissingDependency, PayloadTooLarge, Unavailable
from ember.logs import RateLimitedLog
from ember.media.addresses import Address, any_address, is_public_address, resolve_host
from ember.media.budget import MediaBudget, RequestBudget
from ember.media.limits import MediaLimits

if TYPE_CHECKING:
    import httpx

Resolver = Callable[[str, int], Awaitable[Sequence[Address]]]
AddressPolicy = Callable[[Address], bool]

MAX_REDIRECTS = 3  # SPEC-NOTES: a 4th redirect is a 400
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
USER_AGENT = f"ember/{__version__}"
SHOWN_URL_CHARS = 120  # an error message quotes at most this much of a URL
# Errors that mean this process, not the remote, ran out of something to connect with.
LOCAL_EXHAUSTION = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

log = logging.getLogger(__name__)
_exhaustion_log = RateLimitedLog(log, interval=5.0)


async def fetch_all(
    items: Sequence[str | bytes],
    limits: MediaLimits,
    *,
    budget: RequestBudget | None = None,
    resolver: Resolver = resolve_host,
    address_allowed: AddressPolicy | None = None,
    verify: ssl.SSLContext | None = None,
) -> list[bytes]:
    """The bytes of each item, in order: URLs downloaded concurrently, ``data:`` URIs decoded,
    raw bytes passed through; each at most ``limits.max_bytes``.

    The first item to fail fails the call and cancels the downloads still running.
    ``budget`` is the request's share of the server's (``MediaBudget``); the caller releases
    it once the bytes are decoded. Without one, a budget of ``limits`` alone. ``resolver``,
    ``address_allowed`` (default: ``is_public_address``, or every address under
    ``limits.allow_private_urls``) and ``verify`` (the TLS trust) are for tests.
    """
    if budget is None:
        budget = MediaBudget(limits).request()
    results: list[bytes | None] = [None] * len(items)
    urls: list[tuple[int, str]] = []
    for index, item in enumerate(items):
        if isinstance(item, (bytes, bytearray, memoryview)):
            results[index] = _within(bytes(item), index, limits.max_bytes, "item")
            budget.charge(index, len(item), downloaded=False)
        elif isinstance(item, str):
            scheme = item[: item.find(":", 0, 16)].lower() if ":" in item[:16] else ""
            if scheme == "data":
                results[index] = decode_data_uri(item, index, limits.max_bytes)
                budget.charge(index, len(results[index] or b""), downloaded=False)
            elif scheme in ("http", "https"):
                urls.append((index, item))
            else:
                raise _refuse_scheme(index, scheme)
        else:
            raise BadRequest(
                f"input {index}: expected a URL, a data: URI or bytes, got {type(item).__name__}",
                param="input",
            )
    if urls:
        default = any_address if limits.allow_private_urls else is_public_address
        policy = address_allowed or default
        httpx = _httpx()
        # The transport, not a Client: no redirect, cookie, auth or proxy machinery, and no
        # settings read from the environment; _Download does the one hop it is asked for.
        async with httpx.AsyncHTTPTransport(
            verify=verify if verify is not None else _default_tls(),
            # A connection verified for one hostname must never carry another's request
            # to the same IP, so none is kept for reuse.
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as transport:
            download = _Download(transport, limits, resolver, policy, budget)
            fetched = await _first_failure_cancels(
                [download.fetch(index, url) for index, url in urls]
            )
        for (index, _), body in zip(urls, fetched, strict=True):
            results[index] = body
    return [body for body in results if body is not None]


def decode_data_uri(uri: str, index: int, max_bytes: int) -> bytes:
    """The content of a base64 ``data:`` URI, size-checked before and after decoding."""
    header, comma, payload = uri.partition(",")
    if not comma:
        raise BadRequest(
            f"input {index}: a data: URI needs a ',' before its content", param="input"
        )
    if header.rsplit(";", 1)[-1].strip().lower() != "base64":
        raise BadRequest(
            f"input {index}: only base64 data: URIs are accepted (data:<type>;base64,<content>)",
            param="input",
        )
    # 4 characters per 3 bytes: anything longer cannot decode to max_bytes or fewer.
    if len(payload) > 4 * -(-max_bytes // 3):
        raise _too_large(index, "data: URI", max_bytes)
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError as exc:  # binascii.Error, or a non-ASCII character
        raise BadRequest(
            f"input {index}: data: URI is not valid base64: {exc}", param="input"
        ) from None
    return _within(data, index, max_bytes, "data: URI")


@dataclass(frozen=True)
class _Redirect:
    location: str


class _Download:
    """One ``fetch_all`` call's downloads: the shared transport, limits and address policy."""

    def __init__(
        self,
        transport: httpx.AsyncHTTPTransport,
        limits: MediaLimits,
        resolver: Resolver,
        policy: AddressPolicy,
        budget: RequestBudget,
    ) -> None:
        self.transport = transport
        self.limits = limits
        self.resolver = resolver
        self.policy = policy
        self.budget = budget

    async def fetch(self, index: int, url: str) -> bytes:
        """The body at ``url`` after at most ``MAX_REDIRECTS``, within ``fetch_timeout`` of
        getting a download slot."""
        httpx = _httpx()
        try:
            async with self.budget.slot():
                return await asyncio.wait_for(self._follow(index, url), self.limits.fetch_timeout)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            raise BadRequest(
                f"input {index}: {_shown(url)} did not download within "
                f"{self.limits.fetch_timeout:g} s",
                param="input",
            ) from None

    async def _follow(self, index: int, url: str) -> bytes:
        current = url
        for hop in range(MAX_REDIRECTS + 1):
            target = self._target(index, current, hop)
            answer = await self._get(index, target, hop)
            if isinstance(answer, bytes):
                return answer
            current = answer.location
        raise BadRequest(
            f"input {index}: {_shown(url)} redirects more than {MAX_REDIRECTS} times",
            param="input",
        )

    def _target(self, index: int, url: str, hop: int) -> httpx.URL:
        httpx = _httpx()
        try:
            target = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise BadRequest(
                f"input {index}: {_shown(url)} is not a valid URL: {exc}", param="input"
            ) from None
        if target.scheme not in ("http", "https"):
            raise _refuse_scheme(index, target.scheme, hop)
        if not target.raw_host:
            raise BadRequest(f"input {index}: {_shown(url)} has no host", param="input")
        if target.userinfo:
            raise BadRequest(
                f"input {index}: {_shown(url)} carries credentials; they are never forwarded",
                param="input",
            )
        return target.copy_with(fragment=None)

    async def _addresses(self, index: int, target: httpx.URL, hop: int) -> Sequence[Address]:
        host = target.raw_host.decode("ascii")  # IDNA-encoded; IPv6 without brackets
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            addresses = await self.resolver(host, port)
        except (OSError, UnicodeError) as exc:  # socket.gaierror: no such host; a bad label
            _check_local(exc)
            reason = getattr(exc, "strerror", None) or exc
            raise BadRequest(
                f"input {index}: cannot resolve {host}{_after(hop)}: {reason}", param="input"
            ) from None
        if not addresses:
            raise BadRequest(f"input {index}: {host}{_after(hop)} has no address", param="input")
        for address in addresses:
            if not self.policy(address):
                raise BadRequest(
                    f"input {index}: {_shown(str(target))}{_after(hop)} resolves to {address}, "
                    "which is not a public address",
                    param="input",
                )
        return addresses

    async def _get(self, index: int, target: httpx.URL, hop: int) -> bytes | _Redirect:
        """One hop: connect to each checked address in turn until one answers."""
        httpx = _httpx()
        addresses = await self._addresses(index, target, hop)
        hostname = target.raw_host.decode("ascii")
        headers = {
            "Host": target.netloc.decode("ascii"),
            "User-Agent": USER_AGENT,
            "Accept": "*/*",
            "Accept-Encoding": "identity",  # a body is counted as sent: no gzip to inflate
        }
        extensions: dict[str, object] = {
            "timeout": httpx.Timeout(self.limits.fetch_timeout).as_dict()
        }
        if target.scheme == "https":
            extensions["sni_hostname"] = hostname  # and the certificate is checked for it
        failure: Exception | None = None
        for address in addresses:
            try:
                pinned = target.copy_with(host=str(address))
            except httpx.InvalidURL as exc:  # an IPv6 scope id (fe80::1%eth0)
                failure = exc
                continue
            request = httpx.Request("GET", pinned, headers=headers, extensions=extensions)
            try:
                response = await self.transport.handle_async_request(request)
                try:
                    return await self._read(index, target, hop, response)
                finally:
                    await response.aclose()
            except httpx.ConnectError as exc:  # refused, unreachable, TLS check failed
                _check_local(exc)
                failure = exc
            except httpx.TimeoutException:
                raise  # fetch() words every timeout alike
            except httpx.HTTPError as exc:
                raise BadRequest(
                    f"input {index}: downloading {_shown(str(target))}{_after(hop)} failed: "
                    f"{type(exc).__name__}: {exc}",
                    param="input",
                ) from None
        raise BadRequest(
            f"input {index}: cannot connect to {_shown(str(target))}{_after(hop)}: {failure}",
            param="input",
        )

    async def _read(
        self, index: int, target: httpx.URL, hop: int, response: httpx.Response
    ) -> bytes | _Redirect:
        status = response.status_code
        shown = f"{_shown(str(target))}{_after(hop)}"
        if status in REDIRECT_STATUSES:
            location = response.headers.get("location")
            if not location:
                raise BadRequest(
                    f"input {index}: {shown} answered HTTP {status} without a Location",
                    param="input",
                )
            try:
                return _Redirect(str(target.join(location)))
            except _httpx().InvalidURL as exc:
                raise BadRequest(
                    f"input {index}: {shown} redirects to an invalid URL: {exc}", param="input"
                ) from None
        if not 200 <= status < 300:
            raise BadRequest(f"input {index}: {shown} answered HTTP {status}", param="input")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BadRequest(
                f"input {index}: {shown} was sent with Content-Encoding {encoding!r} "
                "although identity was asked for",
                param="input",
            )
        max_bytes = self.limits.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise _too_large(index, shown, max_bytes, int(declared))
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > max_bytes:
                raise _too_large(index, shown, max_bytes)
            self.budget.charge(index, len(chunk), downloaded=True)
        return bytes(body)


async def _first_failure_cancels(coroutines: list[Awaitable[bytes]]) -> list[bytes]:
    """Run concurrently; on the first error (or our own cancellation) cancel the rest."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    failed = [t for t in tasks if not t.cancelled() and t.exception() is not None]
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


def _check_local(exc: BaseException) -> None:
    """503, logged, when ``exc`` (or what it wraps) is this process out of descriptors or
    buffers: the remote is not to blame and the client may retry."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in LOCAL_EXHAUSTION:
            _exhaustion_log.warning(f"a media download could not connect: {current!r}")
            raise Unavailable(
                "the server cannot open a connection now (out of file descriptors or "
                "buffers); retry later"
            ) from None
        current = current.__cause__ or current.__context__


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """certifi's trust (or SSL_CERT_FILE's), built once: loading it costs milliseconds."""
    return _httpx().create_ssl_context()


def _httpx() -> ModuleType:
    try:
        import httpx
    except ImportError as exc:
        raise MissingDependency(
            "fetching image and audio URLs needs httpx: pip install 'ember[media]'"
        ) from exc
    return httpx


def _within(data: bytes, index: int, max_bytes: int, what: str) -> bytes:
    if len(data) > max_bytes:
        raise _too_large(index, what, max_bytes, len(data))
    return data


def _too_large(index: int, what: str, max_bytes: int, size: int | None = None) -> EmberError:
    size_text = f"is {size:,} bytes," if size is not None else "is"
    return PayloadTooLarge(
        f"input {index}: {what} {size_text} more than the {max_bytes:,} bytes accepted",
        param="input",
    )


def _refuse_scheme(index: int, scheme: str, hop: int = 0) -> BadRequest:
    what = f"{scheme}: URLs are" if scheme else "this is"
    hint = "use an http(s) URL or a data: URI" if not hop else "redirects must stay on http(s)"
    return BadRequest(f"input {index}: {what} not fetched{_after(hop)}; {hint}", param="input")


def _after(hop: int) -> str:
    return f" (after {hop} redirect{'s' if hop > 1 else ''})" if hop else ""


def _shown(url: str) -> str:
    return url if len(url) <= SHOWN_URL_CHARS else url[: SHOWN_URL_CHARS - 3] + "..."
