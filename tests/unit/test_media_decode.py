"""Media decoding: image formats, EXIF, the pixel-count guard, audio formats, mixing and
resampling; every refusal a 400 naming the input."""

from __future__ import annotations

import io
import struct
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile
from PIL import Image, PngImagePlugin

from ember.errors import BadRequest, EmberError, MissingDependency
from ember.media import MediaLimits, decode_audio, decode_image
from ember.media.audio import _read_mono

LIMITS = MediaLimits()
RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def _refused(exc: pytest.ExceptionInfo[EmberError], index: int) -> str:
    assert isinstance(exc.value, BadRequest)
    assert exc.value.status_code == 400
    assert exc.value.param == "input"
    assert exc.value.message.startswith(f"input {index}: "), exc.value.message
    return exc.value.message


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _halves(size: tuple[int, int] = (16, 8)) -> Image.Image:
    """Red on the left, blue on the right."""
    image = Image.new("RGB", size, RED)
    image.paste(BLUE, (size[0] // 2, 0, size[0], size[1]))
    return image


def _close(pixel: tuple[int, ...], expected: tuple[int, int, int], tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, expected, strict=True))


def _png_header(width: int, height: int) -> bytes:
    """A PNG that is only a header: IHDR (8-bit RGB) and IEND, each with its CRC."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


# -- images ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF"])
def test_formats_decode_to_rgb(fmt: str) -> None:
    image = decode_image(_encode(_halves(), fmt), 0, LIMITS)
    assert image.mode == "RGB"
    assert image.size == (16, 8)
    assert _close(image.getpixel((2, 4)), RED)
    assert _close(image.getpixel((13, 4)), BLUE)


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), RED), Image.new("RGB", (8, 8), BLUE)]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    assert decode_image(data, 0, LIMITS).getpixel((4, 4)) == RED


def test_exif_orientation_is_applied() -> None:
    """Orientation 6 means "turn 90 degrees clockwise to view": a 40 x 20 image comes back
    20 x 40 with its top-left marker at the top right."""
    image = Image.new("RGB", (40, 20), WHITE)
    image.paste(RED, (0, 0, 6, 6))
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _encode(image, "JPEG", exif=exif.tobytes(), quality=95)
    upright = decode_image(data, 0, LIMITS)
    assert upright.size == (20, 40)
    assert _close(upright.getpixel((17, 2)), RED)
    assert _close(upright.getpixel((2, 2)), WHITE)


def test_transparency_is_composited_onto_white() -> None:
    """As transformers' ``convert_to_rgb`` does, so the processor sees the same pixels."""
    image = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    image.putpixel((1, 1), (255, 0, 0, 255))
    decoded = decode_image(_encode(image, "PNG"), 0, LIMITS)
    assert decoded.getpixel((0, 0)) == WHITE
    assert decoded.getpixel((1, 1)) == RED


def test_a_png_claiming_50000_squared_pixels_is_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused from the header alone: decoding (``load``) must never start."""
    loads: list[object] = []
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", lambda self: loads.append(self))
    data = _png_header(50_000, 50_000)
    assert len(data) < 100
    with pytest.raises(EmberError) as exc:
        decode_image(data, 3, LIMITS)
    assert "pixels" in _refused(exc, 3)
    assert loads == []


def test_the_pixel_cap_is_checked_from_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    """7,000 x 7,000 is under Pillow's own guard (89 M pixels) but over ours (40 M)."""
    loads: list[object] = []
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", lambda self: loads.append(self))
    with pytest.raises(EmberError) as exc:
        decode_image(_png_header(7_000, 7_000), 1, LIMITS)
    assert "7,000 x 7,000 pixels, more than the 40,000,000 accepted" in _refused(exc, 1)
    assert loads == []


def test_the_pixel_cap_follows_the_limits() -> None:
    data = _encode(_halves((20, 20)), "PNG")
    assert decode_image(data, 0, MediaLimits(max_image_pixels=400)).size == (20, 20)
    with pytest.raises(EmberError) as exc:
        decode_image(data, 0, MediaLimits(max_image_pixels=399))
    assert "20 x 20 pixels" in _refused(exc, 0)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_encode(_halves((64, 64)), "JPEG")[:300], "cannot decode the image"),  # truncated
        (_encode(_halves((64, 64)), "PNG")[:-40], "cannot decode the image"),  # truncated
        (b"this is not an image", "not an image in a supported format"),
        (_encode(_halves(), "BMP"), "not an image in a supported format"),
        (_encode(_halves(), "TIFF"), "not an image in a supported format"),
        (b"", "not an image in a supported format"),
    ],
    ids=["truncated-jpeg", "truncated-png", "text", "bmp", "tiff", "empty"],
)
def test_undecodable_images_are_400(data: bytes, expected: str) -> None:
    with pytest.raises(EmberError) as exc:
        decode_image(data, 2, LIMITS)
    assert expected in _refused(exc, 2)


def test_images_decode_alike_on_parallel_threads() -> None:
    colours = [(i * 30, 255 - i * 30, i * 10) for i in range(8)]
    blobs = [_encode(Image.new("RGB", (32, 32), c), "PNG") for c in colours] * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        decoded = list(pool.map(lambda ib: decode_image(ib[1], ib[0], LIMITS), enumerate(blobs)))
    assert [image.getpixel((5, 5)) for image in decoded] == colours * 4


def test_missing_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(MissingDependency, match=r"ember\[media\]"):
        decode_image(b"", 0, LIMITS)


# -- audio -----------------------------------------------------------------------------------


def _sine(hz: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _audio(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def _peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


def test_wav_at_44k1_is_resampled_to_48k() -> None:
    data = _audio(_sine(1000, 44_100, 1.0), 44_100, "WAV", "PCM_16")
    samples = decode_audio(data, 0, 48_000, LIMITS)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - 48_000) <= 1
    assert abs(_peak_hz(samples, 48_000) - 1000) <= 1
    assert 0.45 < float(np.max(np.abs(samples[1000:-1000]))) < 0.55


def test_stereo_is_mixed_to_mono() -> None:
    left, right = _sine(440, 16_000, 0.5), np.full(8000, 0.25, dtype=np.float32)
    data = _audio(np.stack([left, right], axis=1), 16_000, "WAV", "FLOAT")
    samples = decode_audio(data, 0, 16_000, LIMITS)
    np.testing.assert_allclose(samples, (left + right) / 2, atol=1e-6)


@pytest.mark.parametrize(("fmt", "subtype"), [("FLAC", "PCM_16"), ("OGG", "VORBIS")])
def test_flac_and_ogg_decode(fmt: str, subtype: str) -> None:
    data = _audio(_sine(660, 22_050, 1.0), 22_050, fmt, subtype)
    samples = decode_audio(data, 0, 16_000, LIMITS)
    assert abs(len(samples) - 16_000) <= 160  # Vorbis may trim or pad a few frames
    assert abs(_peak_hz(samples, 16_000) - 660) <= 2


def test_too_long_audio_is_refused_from_its_header() -> None:
    data = _audio(_sine(440, 8_000, 3.0), 8_000, "WAV", "PCM_16")
    assert len(decode_audio(data, 0, 8_000, MediaLimits(max_audio_seconds=3.0))) == 24_000
    with pytest.raises(EmberError) as exc:
        decode_audio(data, 4, 8_000, MediaLimits(max_audio_seconds=2.0))
    assert "3.0 s long, more than the 2 s accepted" in _refused(exc, 4)


def _unknown_length(flac: bytes) -> bytes:
    """``flac`` with STREAMINFO's 36-bit total_samples set to 0, "unknown" (after "fLaC"
    and the 4-byte block header: 4 bits of byte 13 of the block and bytes 14-17)."""
    data = bytearray(flac)
    assert data[:4] == b"fLaC"
    data[8 + 13] &= 0xF0
    data[8 + 14 : 8 + 18] = bytes(4)
    return bytes(data)


def test_a_flac_of_unknown_length_is_read_to_the_cap_not_sized_by_its_header() -> None:
    short = _unknown_length(_audio(_sine(440, 8_000, 1.0), 8_000, "FLAC", "PCM_16"))
    assert soundfile.info(io.BytesIO(short)).frames == 2**63 - 1  # what libsndfile reports
    assert len(decode_audio(short, 0, 8_000, MediaLimits(max_audio_seconds=2.0))) == 8_000
    long = _unknown_length(_audio(_sine(440, 8_000, 3.0), 8_000, "FLAC", "PCM_16"))
    with pytest.raises(EmberError) as exc:
        decode_audio(long, 2, 8_000, MediaLimits(max_audio_seconds=2.0))
    assert _refused(exc, 2) == "input 2: the audio is longer than the 2 s accepted"


class _EndlessAudio:
    """A file whose reads never end, as one whose header understates its length would."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, frames: int, dtype: str, always_2d: bool) -> np.ndarray:
        self.reads += 1
        assert self.reads < 100, "the read did not stop at the cap"
        return np.zeros((frames, 2), dtype=dtype)


def test_the_read_stops_one_frame_past_the_cap() -> None:
    audio = _EndlessAudio()
    with pytest.raises(EmberError) as exc:
        _read_mono(audio, 200_000, 5, MediaLimits(max_audio_seconds=1.0))
    assert "longer than the 1 s accepted" in _refused(exc, 5)
    assert audio.reads == 4  # 3 blocks of 65,536 frames, then the 3,393 that pass the cap


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"RIFF\x00\x00\x00\x00WAVEfmt garbage", "cannot decode the audio"),
        (b"not audio at all", "cannot decode the audio"),
        (_audio(_sine(440, 8_000, 0.1), 8_000, "AIFF"), "format AIFF is not accepted"),
        (_audio(np.zeros(0, dtype=np.float32), 8_000, "WAV"), "holds no samples"),
    ],
    ids=["broken-wav", "text", "aiff", "empty"],
)
def test_undecodable_audio_is_400(data: bytes, expected: str) -> None:
    with pytest.raises(EmberError) as exc:
        decode_audio(data, 1, 16_000, LIMITS)
    assert expected in _refused(exc, 1)


def test_missing_soundfile_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(MissingDependency, match=r"ember\[media\]"):
        decode_audio(b"", 0, 16_000, LIMITS)
