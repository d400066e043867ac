"""The bounds every image or audio item is held to (built from the server settings by
``ember.config``: settings flow into this module, never back)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaLimits:
    """What one fetch or decode may cost; frozen so worker threads can share one.

    Per item: ``max_bytes``, ``max_image_pixels``, ``max_image_side``, ``max_image_aspect``
    (an image processor's shortest-edge resize keeps the aspect ratio, so a 4,000,000 x 10
    image would become gigabytes of pixels), ``max_audio_seconds``. Per request:
    ``max_request_fetches`` downloads at once and ``max_request_bytes`` in all. Server-wide
    (``ember.media.budget``): ``max_fetches`` downloads at once, ``max_fetched_bytes`` held
    between download and decode, ``max_decoding_pixels`` being decoded at once.
    """

    allow_private_urls: bool = False
    fetch_timeout: float = 10.0  # seconds for one whole download, redirects included
    max_bytes: int = 10 * 1024 * 1024  # per item, data: URIs included
    max_image_pixels: int = 40_000_000
    max_audio_seconds: float = 60.0
    max_image_side: int = 16_384
    max_image_aspect: float = 50.0
    max_request_fetches: int = 8
    max_request_bytes: int = 64 * 1024 * 1024
    max_fetches: int = 64
    max_fetched_bytes: int = 256 * 1024 * 1024
    max_decoding_pixels: int = 40_000_000

    def __post_init__(self) -> None:
        # A zero or negative bound would refuse every item with a misleading message.
        for name in POSITIVE:
            if not getattr(self, name) > 0:
                raise ValueError(f"MediaLimits.{name} must be positive, got {getattr(self, name)}")
        if self.max_image_aspect < 1:
            raise ValueError(f"MediaLimits.max_image_aspect must be >= 1: {self.max_image_aspect}")


POSITIVE = (
    "fetch_timeout",
    "max_bytes",
    "max_image_pixels",
    "max_image_side",
    "max_audio_seconds",
    "max_request_fetches",
    "max_request_bytes",
    "max_fetches",
    "max_fetched_bytes",
    "max_decoding_pixels",
)
