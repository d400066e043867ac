"""The bounds every image or audio item is held to, read once from the server settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ember.config import ServerSettings


@dataclass(frozen=True)
class MediaLimits:
    """What one fetch or decode may cost; frozen so worker threads can share one."""

    allow_private_urls: bool = False
    fetch_timeout: float = 10.0  # seconds for one whole download, redirects included
    max_bytes: int = 10 * 1024 * 1024  # per item, data: URIs included
    max_image_pixels: int = 40_000_000
    max_audio_seconds: float = 60.0

    def __post_init__(self) -> None:
        # A zero or negative bound would refuse every item with a misleading message.
        for name in ("fetch_timeout", "max_bytes", "max_image_pixels", "max_audio_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MediaLimits.{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> MediaLimits:
        """The limits a server was started with (``--allow-private-urls`` and friends)."""
        return cls(
            allow_private_urls=settings.allow_private_urls,
            fetch_timeout=settings.media_fetch_timeout,
            max_bytes=settings.max_media_bytes,
            max_image_pixels=settings.max_image_pixels,
            max_audio_seconds=settings.max_audio_seconds,
        )
