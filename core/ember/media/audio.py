"""Audio bytes -> float32 mono samples at the model's sampling rate.

soundfile (libsndfile) reads WAV, FLAC and OGG; other formats it knows (MP3, AIFF, ...)
are refused, to keep the decoders clients can reach few. The duration cap is checked from
the header (frames / rate) before a sample is read, and the read stops one frame past the
cap whatever the header said. Samples are read in blocks and averaged to mono as they
come, so a file declaring hundreds of channels never holds them all at once. soxr
resamples at its default HQ quality: SPEC-NOTES, lower qualities move CLAP's vectors past
the parity tolerance.

The request's ``DecodeGuard`` is checked before each block, so a passed deadline or a client
that left stops the read.

Runs on worker threads: each call opens its own file handle and resampler.
"""

from __future__ import annotations

import functools
import io
import math
from types import ModuleType
from typing import Any

import numpy as np

from ember.errors import BadRequest, EmberError, MissingDependency
from ember.media.budget import DecodeGuard
from ember.media.limits import MediaLimits

FORMATS = frozenset({"WAV", "WAVEX", "RF64", "FLAC", "OGG"})  # libsndfile's major formats
BLOCK_FRAMES = 65_536
RESAMPLE_QUALITY = "HQ"  # soxr's default; VHQ is the only better one
# libsndfile's SF_COUNT_MAX, its frame count for a header that does not say (a FLAC whose
# STREAMINFO total_samples is 0, "unknown"): the capped read then finds the length.
UNKNOWN_FRAMES = 2**63 - 1


def decode_audio(
    data: bytes,
    index: int,
    sampling_rate: int,
    limits: MediaLimits,
    guard: DecodeGuard | None = None,
) -> np.ndarray:
    """``data`` as a 1-d float32 array at ``sampling_rate``: channels averaged, resampled."""
    if sampling_rate <= 0:
        raise ValueError(f"sampling_rate must be positive, got {sampling_rate}")
    soundfile, soxr = _libraries()
    try:
        with _straight_reader(soundfile)(io.BytesIO(data)) as audio:
            if audio.format not in FORMATS:
                raise BadRequest(
                    f"input {index}: audio format {audio.format} is not accepted "
                    f"(WAV, FLAC or OGG)",
                    param="input",
                )
            rate = audio.samplerate
            if UNKNOWN_FRAMES > audio.frames > limits.max_audio_seconds * rate:
                raise _too_long(index, audio.frames / rate, limits)
            max_frames = math.floor(limits.max_audio_seconds * rate)
            samples = _read_mono(audio, max_frames, index, limits, guard)
    except EmberError:
        raise
    except Exception as exc:
        # libsndfile fed a client's bytes fails in several ways (LibsndfileError for an
        # unknown or broken file, RuntimeError, ValueError): each means the input is unusable.
        detail = getattr(exc, "error_string", None) or str(exc)
        raise BadRequest(
            f"input {index}: cannot decode the audio: {detail}", param="input"
        ) from None
    if not len(samples):
        raise BadRequest(f"input {index}: the audio holds no samples", param="input")
    if rate != sampling_rate:
        samples = soxr.resample(samples, rate, sampling_rate, quality=RESAMPLE_QUALITY)
    return np.ascontiguousarray(samples, dtype=np.float32)


def _read_mono(
    audio: Any,
    max_frames: int,
    index: int,
    limits: MediaLimits,
    guard: DecodeGuard | None = None,
) -> np.ndarray:
    """At most ``max_frames`` frames, each the mean of its channels."""
    parts: list[np.ndarray] = []
    total = 0
    while True:  # ends at end of file or one frame past the cap: max_frames / BLOCK_FRAMES + 1
        if guard is not None:
            guard.check()
        block = audio.read(
            frames=min(BLOCK_FRAMES, max_frames + 1 - total), dtype="float32", always_2d=True
        )
        if not len(block):
            break
        total += len(block)
        if total > max_frames:
            raise _too_long(index, None, limits)
        parts.append(block[:, 0].copy() if block.shape[1] == 1 else block.mean(axis=1))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)


def _too_long(index: int, seconds: float | None, limits: MediaLimits) -> BadRequest:
    length = f"{seconds:,.1f} s long, more than" if seconds is not None else "longer than"
    return BadRequest(
        f"input {index}: the audio is {length} the {limits.max_audio_seconds:g} s accepted",
        param="input",
    )


@functools.cache
def _straight_reader(soundfile: ModuleType) -> type:
    """soundfile's ``SoundFile``, read front to back without its seek after every read:
    the decode never seeks, and on a FLAC of unknown length that seek fails at the end
    ("Internal psf_fseek() failed") where the read itself succeeded."""

    class StraightReader(soundfile.SoundFile):  # type: ignore[misc,name-defined]
        def seekable(self) -> bool:
            return False

    return StraightReader


def _libraries() -> tuple[ModuleType, ModuleType]:
    try:
        import soundfile
        import soxr
    except ImportError as exc:
        raise MissingDependency(
            "decoding audio needs soundfile and soxr: pip install 'ember[media]'"
        ) from exc
    return soundfile, soxr
