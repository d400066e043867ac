"""Image bytes -> an RGB ``PIL.Image``, refusing what would cost more than it should.

``Image.open`` reads only the header, so the pixel count is checked against
``max_image_pixels`` before a single pixel is decoded: a 100-byte PNG that claims
50,000 x 50,000 pixels would otherwise ask for 7.5 GB. Pillow's own guard
(``MAX_IMAGE_PIXELS``, a process-wide setting left as it is) is a 400 too. Only JPEG,
PNG, WebP and GIF are opened; other decoders stay out of reach of clients.

Runs on worker threads: every call works on its own image objects and changes no Pillow
setting, so calls may overlap.
"""

from __future__ import annotations

import io
from types import ModuleType
from typing import TYPE_CHECKING

from ember.errors import BadRequest, EmberError, MissingDependency
from ember.media.limits import MediaLimits

if TYPE_CHECKING:
    from PIL import Image as PILImage

FORMATS = ("JPEG", "PNG", "WEBP", "GIF")
WHITE = (255, 255, 255, 255)


def decode_image(data: bytes, index: int, limits: MediaLimits) -> PILImage.Image:
    """The first frame of ``data``, EXIF orientation applied, in RGB.

    Transparency is composited onto white, as transformers' image processors do with
    ``do_convert_rgb``: the model sees what it would see given the original file.
    """
    image_module, image_ops = _pillow()
    try:
        with image_module.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size
            if width * height > limits.max_image_pixels:
                raise BadRequest(
                    f"input {index}: image is {width:,} x {height:,} pixels, more than the "
                    f"{limits.max_image_pixels:,} accepted",
                    param="input",
                )
            # A loaded copy, turned upright; the file closes with the ``with``.
            upright = image_ops.exif_transpose(image)
            return _to_rgb(image_module, upright)
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


def _to_rgb(image_module: ModuleType, image: PILImage.Image) -> PILImage.Image:
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if image.mode == "RGB" and not has_alpha:
        return image
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = image_module.new("RGBA", rgba.size, WHITE)
    return image_module.alpha_composite(background, rgba).convert("RGB")


def _pillow() -> tuple[ModuleType, ModuleType]:
    try:
        from PIL import Image, ImageOps
    except ImportError as exc:
        raise MissingDependency("decoding images needs Pillow: pip install 'ember[media]'") from exc
    return Image, ImageOps
