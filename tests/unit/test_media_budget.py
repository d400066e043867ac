"""What media may cost, decided before the cost: an image's sides, aspect ratio and JPEG
scans read from its header; the guard that stops a decode when the request's deadline
passes or its client leaves; the server's pixel budget; a connection that fails for want
of file descriptors is the server's 503, not the remote's 400."""

from __future__ import annotations

import errno
import io
import threading
import time

import httpx
import pytest
from PIL import Image

from ember.errors import BadRequest, PayloadTooLarge, RequestTimeout, Unavailable
from ember.media.budget import ClientGone, DecodeGuard, MediaBudget
from ember.media.fetch import _check_local
from ember.media.image import MAX_JPEG_SCANS, decode_image, size_refusal
from ember.media.limits import MediaLimits

LIMITS = MediaLimits()


def _png(mode: str, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, format="PNG")
    return out.getvalue()


def _progressive_jpeg(extra_scans: int) -> bytes:
    """A valid progressive JPEG with its first scan repeated ``extra_scans`` times."""
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(out, format="JPEG", progressive=True)
    data = out.getvalue()
    first = data.index(b"\xff\xda")
    second = data.index(b"\xff\xda", first + 2)
    return data[:second] + data[first:second] * extra_scans + data[second:]


def test_a_4000000_by_10_png_is_refused_from_its_header() -> None:
    data = _png("1", (4_000_000, 10))  # 40 M pixels, within the pixel cap
    assert len(data) < 10_000
    with pytest.raises(BadRequest) as err:
        decode_image(data, 3, LIMITS)
    assert err.value.message.startswith("input 3: image is 4,000,000 x 10 pixels")
    assert "side longer than the 16,384" in err.value.message


def test_sides_and_aspect_ratio() -> None:
    assert size_refusal(16_384, 1000, LIMITS) == ""
    assert "side longer" in size_refusal(16_385, 1000, LIMITS)
    assert size_refusal(5000, 100, LIMITS) == ""  # 50:1
    assert "aspect ratio over the 50:1" in size_refusal(5001, 100, LIMITS)
    assert "aspect ratio" in size_refusal(1, 60, LIMITS)


def test_a_jpeg_of_too_many_scans_is_refused_before_decoding() -> None:
    fine = _progressive_jpeg(3)
    assert decode_image(fine, 0, LIMITS).size == (32, 32)
    with pytest.raises(BadRequest) as err:
        decode_image(_progressive_jpeg(3000), 0, LIMITS)
    assert "scans, more than the" in err.value.message and str(MAX_JPEG_SCANS) in err.value.message


def test_the_guard_stops_a_decode_at_its_deadline_or_when_the_client_leaves() -> None:
    data = _png("RGB", (64, 64))
    past = DecodeGuard(time.perf_counter() - 1, 5.0)
    with pytest.raises(RequestTimeout):
        decode_image(data, 0, LIMITS, past)
    gone = DecodeGuard(time.perf_counter() + 60, 60.0)
    gone.stop()
    with pytest.raises(ClientGone):
        decode_image(data, 0, LIMITS, gone)
    assert decode_image(data, 0, LIMITS, DecodeGuard(time.perf_counter() + 60, 60.0))


def test_the_pixel_budget_holds_a_decode_until_there_is_room() -> None:
    budget = MediaBudget(MediaLimits(max_image_pixels=100, max_decoding_pixels=100))
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with budget.decoding(80, None):
            order.append("first in")
            entered.set()
            release.wait(10)
            order.append("first out")

    def second() -> None:
        with budget.decoding(80, None):
            order.append("second in")

    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(10)
    b = threading.Thread(target=second)
    b.start()
    b.join(0.2)
    assert b.is_alive() and budget.decoding_pixels == 80  # waiting, not decoding
    release.set()
    a.join(10)
    b.join(10)
    assert order == ["first in", "first out", "second in"] and budget.decoding_pixels == 0


def test_a_waiting_decode_gives_up_at_the_deadline() -> None:
    budget = MediaBudget(MediaLimits(max_image_pixels=100, max_decoding_pixels=100))
    with budget.decoding(100, None), pytest.raises(RequestTimeout):
        with budget.decoding(1, DecodeGuard(time.perf_counter() + 0.1, 0.1)):
            pass
    assert budget.decoding_pixels == 0


async def test_request_and_server_byte_budgets() -> None:
    limits = MediaLimits(max_request_bytes=1000, max_fetched_bytes=1500)
    server = MediaBudget(limits)
    one, two = server.request(), server.request()
    one.charge(0, 900, downloaded=True)
    with pytest.raises(PayloadTooLarge, match="1,000 bytes accepted in all"):
        one.charge(1, 200, downloaded=False)
    two.charge(0, 500, downloaded=True)
    with pytest.raises(Unavailable, match="retry later"):
        two.charge(1, 200, downloaded=True)  # 900 + 500 + 200 > 1500 held server-wide
    one.release()
    two.charge(2, 200, downloaded=True)
    assert server.fetched_bytes == 700


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE])
def test_out_of_descriptors_is_the_servers_503(code: int) -> None:
    try:
        raise httpx.ConnectError("All connection attempts failed") from OSError(code, "x")
    except httpx.ConnectError as exc:
        with pytest.raises(Unavailable, match="file descriptors"):
            _check_local(exc)
    _check_local(httpx.ConnectError("refused"))  # the remote's: left to the caller
