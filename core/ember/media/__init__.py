"""Images and audio from clients: bounded, SSRF-safe fetching, then decoding on worker threads.

``fetch_all`` turns each input (http(s) URL, base64 ``data:`` URI or raw bytes) into bytes;
``decode_image`` and ``decode_audio`` turn bytes into what a model's processor takes. All
are held to one ``MediaLimits``, and every error names the input's 0-based position.
Pillow, soundfile and soxr are imported on first use (``pip install 'ember[media]'``).
"""

from ember.media.addresses import is_public_address
from ember.media.audio import decode_audio
from ember.media.fetch import fetch_all
from ember.media.image import decode_image
from ember.media.limits import MediaLimits

__all__ = ["MediaLimits", "decode_audio", "decode_image", "fetch_all", "is_public_address"]
