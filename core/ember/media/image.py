"""Image bytes -> an RGB ``PIL.Image``, refusing what would cost more than it should.

``Image.open`` reads only the header, so what decoding and the image processor will cost
is checked before a single pixel is decoded (each a 400):

- pixels against ``max_image_pixels``: a 100-byte PNG that claims 50,000 x 50,000 pixels
  would otherwise ask for 7.5 GB. Pillow's own guard (``MAX_IMAGE_PIXELS``, a process-wide
  setting left as it is) is a 400 too;
- each side against ``max_image_side`` and the aspect ratio against ``max_image_aspect``:
  the processors' shortest-edge resize keeps the ratio, so a 5 KB PNG of 4,000,000 x 10
  (under the pixel cap) became a 89,600,000 x 224 array and the server was OOM-killed;
- a JPEG's scans against ``MAX_JPEG_SCANS``: each progressive scan is another pass over
  the whole image (3,000 repeated scans in 387 KB took 52 s of CPU).

Only the first frame of an animated GIF or WebP is decoded. While decoding, the file is read
in ``GUARDED_BLOCK`` pieces and the request's ``DecodeGuard`` is checked at every read, so a
passed deadline or a client that left stops the decoder within a block; and the image's
pixels are held in the server's decode budget (``MediaBudget.decoding``) until the caller
is done with them. Only JPEG, PNG, WebP and GIF are opened; other decoders stay out of
reach of clients.

Runs on worker threads: every call works on its own image objects and changes no Pillow
setting (``decodermaxblock`` is set on the image object, not the class), so calls may overlap.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import TYPE_CHECKING

from ember.errors import BadRequest, EmberError, MissingDependency
from ember.media.budget import DecodeGuard, MediaBudget
from ember.media.limits import MediaLimits

if TYPE_CHECKING:
    from PIL import Image as PILImage

FORMATS = ("JPEG", "PNG", "WEBP", "GIF")
WHITE = (255, 255, 255, 255)
# libjpeg writes 10 scans for a progressive colour image and mozjpeg's optimised scripts
# under 70; more is a file made to cost decode time.
MAX_JPEG_SCANS = 100
JPEG_START_OF_SCAN = b"\xff\xda"  # entropy-coded data stuffs 0xFF as FF 00: never a false hit
# Bytes fed to the decoder between two guard checks (Pillow's default is 64 KiB).
GUARDED_BLOCK = 16 * 1024


def decode_image(
    data: bytes, index: int, limits: MediaLimits, guard: DecodeGuard | None = None
) -> PILImage.Image:
    """The first frame of ``data``, EXIF orientation applied, in RGB."""
    with decoding_image(data, index, limits, guard) as image:
        return image


@contextmanager
def decoding_image(
    data: bytes,
    index: int,
    limits: MediaLimits,
    guard: DecodeGuard | None = None,
    budget: MediaBudget | None = None,
) -> Iterator[PILImage.Image]:
    """``decode_image``'s image, its pixels held in ``budget`` while the ``with`` runs (the
    image processor's arrays are as large as the image until it resizes)."""
    with ExitStack() as held:
        yield _decode(data, index, limits, guard, budget, held)


def _decode(
    data: bytes,
    index: int,
    limits: MediaLimits,
    guard: DecodeGuard | None,
    budget: MediaBudget | None,
    held: ExitStack,
) -> PILImage.Image:
    """Transparency is composited onto white, as transformers' image processors do with
    ``do_convert_rgb``: the model sees what it would see given the original file."""
    image_module, image_ops = _pillow()
    try:
        with image_module.open(_Guarded(data, guard), formats=FORMATS) as image:
            width, height = image.size
            refusal = size_refusal(width, height, limits)
            if not refusal and image.format == "JPEG":
                scans = data.count(JPEG_START_OF_SCAN)
                if scans > MAX_JPEG_SCANS:
                    refusal = f"is a JPEG of {scans:,} scans, more than the {MAX_JPEG_SCANS} read"
            if refusal:
                raise BadRequest(f"input {index}: image {refusal}", param="input")
            if guard is not None:
                image.decodermaxblock = GUARDED_BLOCK
            if budget is not None:
                held.enter_context(budget.decoding(width * height, guard))
            # Loaded and turned upright in place: a copy would be another full-size image.
            image_ops.exif_transpose(image, in_place=True)
            return _to_rgb(image_module, image)
    except EmberError:
        raise
    except image_module.DecompressionBombError as exc:
        raise BadRequest(
            f"input {index}: image has too many pixels: {exc}", param="input"
        ) from None
    except image_module.UnidentifiedImageError:
        raise BadRequest(
            f"input {index}: not an image in a supported format ({', '.join(FORMATS)})",
            param="input",
        ) from None
    except Exception as exc:
        # A decoder fed a client's bytes can fail in many ways (OSError for a truncated
        # file, SyntaxError, ValueError, struct.error, ...): each means the input is unusable.
        raise BadRequest(
            f"input {index}: cannot decode the image: {type(exc).__name__}: {exc}",
            param="input",
        ) from None


def size_refusal(width: int, height: int, limits: MediaLimits) -> str:
    """Why an image of ``width`` x ``height`` is refused before decoding ('' if it is not)."""
    size = f"is {width:,} x {height:,} pixels"
    if width * height > limits.max_image_pixels:
        return f"{size}, more than the {limits.max_image_pixels:,} accepted"
    if max(width, height) > limits.max_image_side:
        return f"{size}, a side longer than the {limits.max_image_side:,} accepted"
    if max(width, height) > limits.max_image_aspect * max(1, min(width, height)):
        return (
            f"{size}, an aspect ratio over the {limits.max_image_aspect:g}:1 accepted "
            "(resizing its short side would make it huge)"
        )
    return ""


class _Guarded(io.BytesIO):
    """The image file, checking the request's guard at each read the decoder makes."""

    def __init__(self, data: bytes, guard: DecodeGuard | None) -> None:
        super().__init__(data)
        self.guard = guard

    def read(self, size: int | None = -1) -> bytes:
        if self.guard is not None:
            self.guard.check()
        return super().read(size)


def _to_rgb(image_module: ModuleType, image: PILImage.Image) -> PILImage.Image:
    """RGB, holding as few full-size copies at once as it can (an RGBA image is composited
    without a converted copy, and its white background is dropped before the last step)."""
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if image.mode == "RGB" and not has_alpha:
        return image
    if not has_alpha:
        return image.convert("RGB")
    rgba = image if image.mode == "RGBA" else image.convert("RGBA")
    background = image_module.new("RGBA", rgba.size, WHITE)
    composite = image_module.alpha_composite(background, rgba)
    del background, rgba
    return composite.convert("RGB")


def _pillow() -> tuple[ModuleType, ModuleType]:
    try:
        from PIL import Image, ImageOps
    except ImportError as exc:
        raise MissingDependency("decoding images needs Pillow: pip install 'ember[media]'") from exc
    return Image, ImageOps
