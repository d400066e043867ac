"""Media fetching: the SSRF catalog, redirects, size and time bounds, data: URIs.

Every download goes to a test server on 127.0.0.1, which the default policy refuses; the
tests that need it reach it with ``allow_private_urls=True``.
"""

from __future__ import annotations

import base64
import datetime
import io
import ipaddress
import json
import socket
import ssl
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from PIL import Image

from ember import __version__
from ember.config import ServerSettings
from ember.errors import BadRequest, EmberError, MissingDependency, PayloadTooLarge
from ember.media import MediaLimits, decode_image, fetch_all, is_public_address
from ember.media.fetch import Address
from ember.media.special_addresses import IPV4_SPECIAL_PURPOSE, IPV6_SPECIAL_PURPOSE

OPEN = MediaLimits(allow_private_urls=True)
STREAM_CHUNK = 16 * 1024
STREAM_CHUNKS = 64  # the endless body stops after 1 MiB, well past every cap used here
HANG_SECONDS = 5.0  # the longest a never-answering handler holds its thread


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()


@dataclass
class _State:
    stop: threading.Event = field(default_factory=threading.Event)
    barrier: threading.Barrier | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # a body without Content-Length ends when the socket closes
    state: _State

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if url.path == "/image.png":
            self._send(200, PNG, "image/png")
        elif parts[0] == "redirect":  # /redirect/N: N redirects, then the image
            left = int(parts[1])
            if left:
                self._redirect(f"/redirect/{left - 1}")
            else:
                self._send(200, PNG, "image/png")
        elif url.path == "/to":  # a redirect to anywhere: /to?location=...
            self._redirect(parse_qs(url.query)["location"][0])
        elif parts[0] == "status":
            self._send(int(parts[1]), b"no", "text/plain")
        elif url.path == "/endless":  # no Content-Length, streams until the client stops
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for _ in range(STREAM_CHUNKS):
                    self.wfile.write(b"\0" * STREAM_CHUNK)
            except OSError:
                pass  # the client cut it off, as it should
        elif url.path == "/huge-length":
            self.send_response(200)
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
        elif url.path == "/hang":
            self.state.stop.wait(HANG_SECONDS)
        elif url.path == "/text":
            self._send(200, b"this is not an image", "image/png")
        elif url.path == "/headers":
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            self._send(200, body, "application/json")
        elif url.path == "/set-cookie":
            self.send_response(302)
            self.send_header("Set-Cookie", "session=secret; Path=/")
            self.send_header("Location", "/headers")
            self.end_headers()
        elif url.path == "/barrier":  # answers only once all expected requests are in
            assert self.state.barrier is not None
            try:
                self.state.barrier.wait()
            except threading.BrokenBarrierError:
                self._send(503, b"requests came one by one", "text/plain")
                return
            self._send(200, PNG, "image/png")
        else:
            self._send(404, b"no such path", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()


@dataclass
class _Server:
    base: str
    port: int
    state: _State


def _serve(tls: ssl.SSLContext | None = None) -> Iterator[_Server]:
    state = _State()
    handler = type("Handler", (_Handler,), {"state": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    port = httpd.server_address[1]
    scheme = "https" if tls else "http"
    try:
        yield _Server(f"{scheme}://127.0.0.1:{port}", port, state)
    finally:
        state.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=HANG_SECONDS)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    yield from _serve()


def _refused(exc: pytest.ExceptionInfo[EmberError], status: int, index: int) -> str:
    """The checks every refusal gets: its class, status, parameter and ``input N:``."""
    assert exc.value.status_code == status
    assert isinstance(exc.value, BadRequest if status == 400 else PayloadTooLarge)
    assert exc.value.param == "input"
    assert exc.value.message.startswith(f"input {index}: "), exc.value.message
    return exc.value.message


def _data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


async def test_the_local_server_is_refused_by_default(server: _Server) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"{server.base}/image.png"], MediaLimits())
    assert "resolves to 127.0.0.1, which is not a public address" in _refused(exc, 400, 0)


async def test_items_come_back_in_order_when_allowed(server: _Server) -> None:
    items: list[str | bytes] = [
        f"{server.base}/redirect/0",
        _data_uri(b"abc"),
        b"raw bytes",
        f"{server.base}/image.png",
    ]
    assert await fetch_all(items, OPEN) == [PNG, b"abc", b"raw bytes", PNG]


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost/",
        "http://[::1]/",
        "http://0.0.0.0/",
        "http://2130706433/",  # 127.0.0.1 written as an integer
        "http://0x7f000001/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
        "http://10.1.2.3/",
        "http://100.64.0.1/",
        "https://192.168.1.1/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://224.0.0.1/",
        "http://[::127.0.0.1]/",  # the forms Python 3.11's is_global calls global
        "http://[::ffff:0:7f00:1]/",
        "http://[fec0::1]/",
        "http://[5f00::1]/",
        "http://[3fff::1]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[2002:7f00:1::1]/",
    ],
)
async def test_ssrf_catalog_refuses_non_public_addresses(url: str) -> None:
    """Refused after resolution, before any connection: no server is needed."""
    with pytest.raises(EmberError) as exc:
        await fetch_all([_data_uri(b"ok"), url], MediaLimits())
    assert "which is not a public address" in _refused(exc, 400, 1)


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "gopher://127.0.0.1:70/_", "ftp://example.com/a.png", "/a.png"]
)
async def test_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([url], OPEN)  # refused even where private addresses are allowed
    assert "not fetched" in _refused(exc, 400, 0)


@pytest.mark.parametrize("hops", [1, 2, 3])
async def test_up_to_three_redirects_are_followed(server: _Server, hops: int) -> None:
    assert await fetch_all([f"{server.base}/redirect/{hops}"], OPEN) == [PNG]


async def test_a_fourth_redirect_is_refused(server: _Server) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"{server.base}/redirect/4"], OPEN)
    assert "redirects more than 3 times" in _refused(exc, 400, 0)


def _only_the_test_server(address: Address) -> bool:
    return address == ipaddress.ip_address("127.0.0.1") or is_public_address(address)


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("http://[::1]:{port}/image.png", "resolves to ::1, which is not a public address"),
        ("http://127.0.0.2:{port}/image.png", "resolves to 127.0.0.2, which is not a public"),
        ("file:///etc/passwd", "file: URLs are not fetched (after 1 redirect)"),
        ("data:;base64,aGk=", "data: URLs are not fetched (after 1 redirect)"),
        ("http://[::1", "redirects to an invalid URL"),
    ],
)
async def test_a_redirect_target_is_checked_again(
    server: _Server, location: str, expected: str
) -> None:
    """The first hop must be allowed and the second refused, yet both are local: the
    policy is injected to let exactly the test server's 127.0.0.1 through and apply the
    default public-address rule to everything else."""
    assert await fetch_all(
        [f"{server.base}/image.png"], MediaLimits(), address_allowed=_only_the_test_server
    ) == [PNG]
    target = location.format(port=server.port)
    with pytest.raises(EmberError) as exc:
        await fetch_all(
            [f"{server.base}/to?location={target}"],
            MediaLimits(),
            address_allowed=_only_the_test_server,
        )
    assert expected in _refused(exc, 400, 0)


async def test_a_non_2xx_answer_is_400_naming_the_status(server: _Server) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([b"x", f"{server.base}/status/404"], OPEN)
    assert "answered HTTP 404" in _refused(exc, 400, 1)


async def test_a_body_past_the_cap_is_cut_off_while_streaming(server: _Server) -> None:
    limits = MediaLimits(allow_private_urls=True, max_bytes=100_000)
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"{server.base}/endless"], limits)
    assert "is more than the 100,000 bytes accepted" in _refused(exc, 413, 0)


async def test_a_declared_length_past_the_cap_is_refused_at_once(server: _Server) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"{server.base}/huge-length"], OPEN)
    assert "is 1,000,000,000,000 bytes" in _refused(exc, 413, 0)


async def test_a_server_that_never_answers_times_out(server: _Server) -> None:
    limits = MediaLimits(allow_private_urls=True, fetch_timeout=0.5)
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"{server.base}/hang"], limits)
    assert "did not download within 0.5 s" in _refused(exc, 400, 0)


async def test_nothing_listening_is_400() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"http://127.0.0.1:{port}/image.png"], OPEN)
    assert "cannot connect to" in _refused(exc, 400, 0)


async def test_the_first_failure_wins_and_cancels_the_rest(server: _Server) -> None:
    """Had the call waited for the hanging download, input 0's timeout would be raised."""
    limits = MediaLimits(allow_private_urls=True, fetch_timeout=HANG_SECONDS - 1)
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"{server.base}/hang", f"{server.base}/status/500"], limits)
    assert "answered HTTP 500" in _refused(exc, 400, 1)


async def test_urls_are_fetched_concurrently(server: _Server) -> None:
    """The server answers only once three requests wait together; one by one gets 503."""
    server.state.barrier = threading.Barrier(3, timeout=HANG_SECONDS / 2)
    assert await fetch_all([f"{server.base}/barrier"] * 3, OPEN) == [PNG] * 3


async def test_no_cookies_or_credentials_and_our_user_agent(server: _Server) -> None:
    """The first hop sets a cookie; the second must not carry it back."""
    (body,) = await fetch_all([f"{server.base}/set-cookie"], OPEN)
    headers = json.loads(body)
    assert "cookie" not in headers
    assert "authorization" not in headers
    assert headers["user-agent"] == f"ember/{__version__}"
    assert headers["host"] == f"127.0.0.1:{server.port}"
    with pytest.raises(EmberError) as exc:
        await fetch_all([f"http://user:secret@127.0.0.1:{server.port}/headers"], OPEN)
    assert "carries credentials" in _refused(exc, 400, 0)


async def test_the_checked_address_is_the_one_connected_to(server: _Server) -> None:
    """``media.test`` exists only in the injected resolver: had the client looked the name
    up again (DNS rebinding), the download would fail. The Host header keeps the name."""
    lookups: list[tuple[str, int]] = []

    async def resolver(host: str, port: int) -> list[Address]:
        lookups.append((host, port))
        return [ipaddress.ip_address("127.0.0.1")]

    url = f"http://media.test:{server.port}/headers"
    (body,) = await fetch_all([url], OPEN, resolver=resolver)
    assert json.loads(body)["host"] == f"media.test:{server.port}"
    assert lookups == [("media.test", server.port)]


async def test_every_resolved_address_is_checked() -> None:
    async def resolver(host: str, port: int) -> list[Address]:
        return [ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("10.0.0.7")]

    with pytest.raises(EmberError) as exc:
        await fetch_all(["http://mixed.test/a.png"], MediaLimits(), resolver=resolver)
    assert "resolves to 10.0.0.7" in _refused(exc, 400, 0)


async def test_an_unknown_host_is_400() -> None:
    async def resolver(host: str, port: int) -> list[Address]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(EmberError) as exc:
        await fetch_all(["https://nowhere.test/a.png"], MediaLimits(), resolver=resolver)
    assert "cannot resolve nowhere.test" in _refused(exc, 400, 0)


async def test_text_served_as_an_image_fetches_but_does_not_decode(server: _Server) -> None:
    (body,) = await fetch_all([f"{server.base}/text"], OPEN)
    with pytest.raises(EmberError) as exc:
        decode_image(body, 0, OPEN)
    assert "not an image in a supported format" in _refused(exc, 400, 0)


# -- https: SNI and the certificate are checked against the name, not the pinned IP ----------


def _tls_pair(tmp: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for ``name`` and a client context trusting its CA."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate("ember test CA", ca_key, "ember test CA", ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = certificate(name, key, "ember test CA", ca_key, ca=False)
    pem = serialization.Encoding.PEM
    cert_file, key_file = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(pem))
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert_file, key_file)
    client_side = ssl.create_default_context(cadata=ca_cert.public_bytes(pem).decode())
    return server_side, client_side


@pytest.mark.parametrize(("cert_name", "ok"), [("media.test", True), ("other.test", False)])
async def test_https_verifies_the_hostname_while_connecting_to_the_checked_ip(
    tmp_path: Path, cert_name: str, ok: bool
) -> None:
    server_side, client_side = _tls_pair(tmp_path, cert_name)

    async def resolver(host: str, port: int) -> list[Address]:
        return [ipaddress.ip_address("127.0.0.1")]

    tls_server = _serve(server_side)
    served = next(tls_server)
    try:
        url = f"https://media.test:{served.port}/image.png"
        if ok:
            assert await fetch_all([url], OPEN, resolver=resolver, verify=client_side) == [PNG]
        else:
            with pytest.raises(EmberError) as exc:
                await fetch_all([url], OPEN, resolver=resolver, verify=client_side)
            assert "cannot connect to" in _refused(exc, 400, 0)
    finally:
        tls_server.close()


# -- data: URIs and raw bytes ----------------------------------------------------------------


async def test_data_uris_decode() -> None:
    assert await fetch_all([_data_uri(PNG), "DATA:;base64,aGk="], MediaLimits()) == [PNG, b"hi"]


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("data:image/png;base64,not*base64", "is not valid base64"),
        ("data:image/png;base64,aGk", "is not valid base64"),  # padding missing
        ("data:text/plain,hello", "only base64 data: URIs"),
        ("data:image/png;base64", "needs a ','"),
    ],
)
async def test_malformed_data_uris_are_400(item: str, expected: str) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([b"x", b"y", item], MediaLimits())
    assert expected in _refused(exc, 400, 2)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("data:;base64," + "A" * 200, "data: URI is more than"),  # refused before decoding
        (_data_uri(b"x" * 101), "data: URI is 101 bytes"),  # 136 characters pass, 101 bytes not
        (b"x" * 101, "item is 101 bytes"),
    ],
)
async def test_items_past_the_cap_are_413(item: str | bytes, expected: str) -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([item], MediaLimits(max_bytes=100))
    assert expected in _refused(exc, 413, 0)


async def test_other_item_types_are_400() -> None:
    with pytest.raises(EmberError) as exc:
        await fetch_all([b"x", 42], MediaLimits())  # type: ignore[list-item]
    assert "got int" in _refused(exc, 400, 1)


# -- the address policy and the limits -------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700::1111", True),
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::808:808", True),
        ("127.0.0.1", False),
        ("0.0.0.0", False),
        ("255.255.255.255", False),
        ("240.0.0.1", False),
        ("100.64.1.1", False),
        ("192.0.0.8", False),
        ("224.0.1.1", False),  # multicast that ipaddress calls global
        ("::", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("2002:7f00:1::", False),  # 6to4 around 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("64:ff9b::a00:1", False),  # NAT64 around 10.0.0.1
        ("ff0e::1", False),
        ("fe80::1", False),
        ("fd12:3456::1", False),
    ],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


# Forms Python 3.11's ``is_global`` calls global: reserved, deprecated or newer registry
# rows, and IPv6 forms that carry a private IPv4 address.
NOT_PUBLIC_ON_OLD_PYTHONS = [
    "::127.0.0.1",  # IPv4-compatible (deprecated, RFC 4291 §2.5.5.1)
    "::ffff:0:7f00:1",  # IPv4-translated (RFC 6145) around 127.0.0.1
    "fec0::1",  # site-local (deprecated, RFC 3879)
    "5f00::1",  # SRv6 SIDs (RFC 9602)
    "3fff::1",  # documentation (RFC 9637)
    "64:ff9b::c0a8:101",  # NAT64 around 192.168.1.1
    "64:ff9b::a9fe:a9fe",  # NAT64 around the metadata service 169.254.169.254
    "2002:a9fe:a9fe::1",  # 6to4 around 169.254.169.254
    "2002:c0a8:101::1",  # 6to4 around 192.168.1.1
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo (N/A in the registry)
    "2001:0:c0a8:101::1",  # Teredo whose server is 192.168.1.1
    "192.0.0.8",  # IPv4 dummy address (RFC 7600)
    "192.88.99.1",  # deprecated 6to4 relay anycast (RFC 7526)
    "4000::1",  # reserved by the IETF: not 2000::/3
]


@pytest.mark.parametrize("address", NOT_PUBLIC_ON_OLD_PYTHONS)
async def test_registry_rows_python_lags_are_refused(address: str) -> None:
    """Through the injected resolver, as a name resolving there would be refused."""

    async def resolver(host: str, port: int) -> list[Address]:
        return [ipaddress.ip_address(address)]

    with pytest.raises(EmberError) as exc:
        await fetch_all(["http://lagging.test/a.png"], MediaLimits(), resolver=resolver)
    shown = str(ipaddress.ip_address(address))
    assert f"resolves to {shown}, which is not a public address" in _refused(exc, 400, 0)


CARRIERS = {"::ffff:0:0/96", "64:ff9b::/96", "2002::/16"}  # mapped, NAT64, 6to4


def test_every_registry_row_is_applied() -> None:
    """A block the registry calls not globally reachable (or N/A) is refused; one it calls
    reachable is refused only where Python's own table says so too."""
    for block in (*IPV4_SPECIAL_PURPOSE, *IPV6_SPECIAL_PURPOSE):
        if str(block.network) in CARRIERS:
            continue  # judged by the IPv4 address inside (test_is_public_address)
        first = block.network[1] if block.network.num_addresses > 1 else block.network[0]
        want = block.globally_reachable is True and first.is_global
        assert is_public_address(first) is want, (block, first)


def test_limits_from_settings() -> None:
    settings = ServerSettings(
        allow_private_urls=True,
        media_fetch_timeout=2.5,
        max_media_bytes=123,
        max_image_pixels=456,
        max_audio_seconds=7.5,
    )
    assert settings.media_limits() == MediaLimits(True, 2.5, 123, 456, 7.5)
    assert ServerSettings().media_limits() == MediaLimits()


@pytest.mark.parametrize("field_name", ["fetch_timeout", "max_bytes", "max_image_pixels"])
def test_limits_must_be_positive(field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name):
        MediaLimits(**{field_name: 0})


async def test_missing_httpx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingDependency, match=r"ember\[media\]"):
        await fetch_all(["https://example.com/a.png"], MediaLimits())
