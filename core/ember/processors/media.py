"""The media processor: text, images and audio -> a model's own features, one item at a
time, and a batch of items of one modality -> one ``FeatureBatch``.

Every input goes through the model's own transformers processor (CLIPProcessor,
SiglipProcessor, ClapProcessor, ColPaliProcessor, ColQwen2Processor), so the features are
what the model was trained on by construction: SigLIP's text padded to its max length,
ColPali's query prefix and augmentation tokens, Qwen2-VL's dynamic resolution. Each item
is processed alone (as it would be if sent alone; batching never changes a vector) and
``collate`` right-pads the token arrays and concatenates the rest.

Decoding and preprocessing run on worker threads (the engine's media pool): Pillow and
the image processors' numpy work release the GIL, so they overlap the running forward.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.batch import FeatureBatch, Features
from ember.capabilities import Modality
from ember.errors import BadRequest, ConfigError, MissingDependency
from ember.media.budget import DecodeGuard, MediaBudget
from ember.media.limits import MediaLimits
from ember.models.spec import ResolvedModel
from ember.processors.cut import TextCut, longest_token_chars
from ember.processors.text import Direction

log = logging.getLogger(__name__)

LONG_CLIP_SEED = 0
_LONG_CLIP_LOCK = threading.Lock()

# Token arrays, right-padded to the batch's longest; every other array is concatenated on
# its first axis (pixel values, audio features, Qwen2-VL's patches and grids).
SEQUENCE_ARRAYS = ("input_ids", "attention_mask", "token_type_ids")
# Processor outputs that are for training or for the cut, not for the forward pass.
DROPPED_ARRAYS = ("labels", "offset_mapping")


class MediaProcessor:
    """Text and media of one CLIP/SigLIP/CLAP/ColPali/ColQwen2 model, via its processor."""

    masks_positions = False
    side_prompts = False

    def __init__(self, model: ResolvedModel, max_length: int | None = None) -> None:
        import transformers

        assert model.family.media is not None
        self.facts = model.family.media
        self.kind = model.family.name  # for errors
        self.model_name = model.served_name
        self.max_length = min(max_length or model.max_length, model.max_length)
        try:
            processor_class = getattr(transformers, self.facts.processor_class)
            self.processor: Any = processor_class.from_pretrained(str(model.path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{model.path}: cannot load the model's processor: {exc}") from exc
        self.tokenizer = self.processor.tokenizer
        self._cut, self._cutter = self._text_cut(self.tokenizer, self.max_length)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        # ColPali and ColQwen2 encode every text as a query (their processors' one text path).
        self.encodes_queries = self.facts.queries is not None
        self._queries = (
            self.facts.queries(self.processor, self.max_length, self._cut)
            if self.facts.queries is not None
            else None
        )
        self.limits = model.spec.media or MediaLimits()
        vision = model.config.get("vision_config") or {}
        self.patch_size = int(vision.get("patch_size") or 1)
        extractor = getattr(self.processor, "feature_extractor", None)
        self.sampling_rate = int(getattr(extractor, "sampling_rate", 0) or 0)

    # ---- text ------------------------------------------------------------------------------
    def encode(
        self,
        texts: list[str],
        *,
        truncate: bool = True,
        direction: Direction = "right",
        query: bool | None = False,
    ) -> list[Features]:
        if direction != "right":
            raise BadRequest(
                f"model {self.model_name!r} ({self.kind}) truncates text on the right only",
                param="truncation_direction",
            )
        return self._texts(texts, truncate)

    def _texts(self, texts: list[str], truncate: bool) -> list[Features]:
        if self._queries is not None:
            return [self._query(text, index, truncate) for index, text in enumerate(texts)]
        pieces = self._pieces(texts)
        options: dict[str, Any] = {"max_length": self.max_length}
        if self.facts.pads_text:  # as SigLIP's processor documents: to the max length
            options["padding"] = "max_length"
        # One call for the batch, unpadded (SigLIP's padding is per text): each item's
        # arrays are what the tokenizer gives that text alone.
        encoded = self.tokenizer(pieces, truncation=True, **options)
        items = []
        for index, text in enumerate(pieces):
            arrays = {k: np.asarray([v[index]], dtype=np.int64) for k, v in encoded.items()}
            if not truncate and int(arrays["input_ids"].shape[-1]) >= self.max_length:
                full = len(self.tokenizer(text, verbose=False)["input_ids"])
                if full > self.max_length:
                    raise self._too_long(index, full, text is not texts[index])
            items.append(self._features("text", arrays))
        return items

    def _query(self, text: str, index: int, truncate: bool) -> Features:
        """One ColPali/ColQwen2 query (one at a time: the processor pads its batches)."""
        assert self._queries is not None
        arrays, piece = self._queries.encode(text)
        length = int(arrays["input_ids"].shape[-1])
        if length > self.max_length:
            if not truncate:
                raise self._too_long(index, length, len(piece) < len(text))
            arrays = self._queries.truncated(arrays)
        return self._features("text", self._arrays(arrays))

    def _too_long(self, index: int, full: int, cut: bool) -> BadRequest:
        count = f"more than {full}" if cut else str(full)
        return BadRequest(
            f"input {index}: {count} tokens, more than model {self.model_name!r} "
            f"takes ({self.max_length}); send truncate=true or shorten it",
            param="input",
        )

    @staticmethod
    def _text_cut(tokenizer: Any, max_length: int) -> tuple[TextCut | None, Any]:
        """The cut for texts longer than the model uses, checked with a truncating copy of
        the fast tokenizer's backend (none for a slow tokenizer: texts go whole)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None, None
        from tokenizers import Tokenizer

        cutter = Tokenizer.from_str(backend.to_str())
        cutter.no_padding()
        cutter.enable_truncation(max_length)
        return TextCut(max_length, longest_token_chars(cutter)), cutter

    def _pieces(self, texts: list[str], special_tokens: bool = True) -> list[str]:
        """``texts``, each longer than the model can use cut to what its tokens come from."""
        cut = self._cut
        if cut is None or all(len(t) <= cut.chars for t in texts):
            return texts
        long = [i for i, t in enumerate(texts) if len(t) > cut.chars]
        _, pieces = cut.encode(self._cutter, [texts[i] for i in long], "right", special_tokens)
        out = list(texts)
        for i, piece in zip(long, pieces, strict=True):
            out[i] = piece
        return out

    def from_ids(
        self, sequences: list[list[int]], *, truncate: bool = True, query: bool | None = False
    ) -> list[Features]:
        raise BadRequest(
            f"model {self.model_name!r} ({self.kind}) takes text, not token ids", param="input"
        )

    def encode_pairs(self, pairs: list[tuple[str, str]], *, truncate: bool = True) -> list:
        raise BadRequest(f"model {self.model_name!r} ({self.kind}) does not score text pairs")

    def tokenize_detail(self, text: str, *, add_special_tokens: bool = True) -> list[dict]:
        """TEI's /tokenize rows, from the model's own tokenizer, truncated at the max length
        as a text model's are; a long text is cut first, never tokenised whole."""
        enc = self.tokenizer(
            self._pieces([text], add_special_tokens)[0],
            add_special_tokens=add_special_tokens,
            return_offsets_mapping=True,
            truncation=True,
            max_length=self.max_length,
        )
        special = set(self.tokenizer.all_special_ids)
        rows = []
        for token_id, (start, stop) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
            rows.append(
                {
                    "id": int(token_id),
                    "text": self.tokenizer.convert_ids_to_tokens(int(token_id)),
                    "special": int(token_id) in special,
                    "start": int(start) if token_id not in special else None,
                    "stop": int(stop) if token_id not in special else None,
                }
            )
        return rows

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool = True) -> list[str]:
        return list(self.tokenizer.batch_decode(ids, skip_special_tokens=skip_special_tokens))

    # ---- media -----------------------------------------------------------------------------
    def image(
        self,
        data: bytes,
        index: int,
        guard: DecodeGuard | None = None,
        budget: MediaBudget | None = None,
    ) -> Features:
        """Decode and preprocess one image (on a worker thread), its pixels held in the
        server's decode budget until the processor has resized them."""
        from ember.media.image import decoding_image

        with decoding_image(data, index, self.limits, guard, budget) as image:
            if guard is not None:
                guard.check()
            return self.image_features(image, index)

    def image_features(self, image: Any, index: int = 0) -> Features:
        try:
            if self.facts.queries is not None:
                raw = self.processor.process_images([image], return_tensors="pt")
            else:
                raw = self.processor.image_processor(images=[image], return_tensors="np")
        except (ValueError, TypeError, OSError) as exc:
            raise BadRequest(
                f"input {index}: the image could not be preprocessed: {exc}", param="input"
            ) from None
        return self._features("image", self._arrays(raw))

    def audio(
        self,
        data: bytes,
        index: int,
        guard: DecodeGuard | None = None,
        budget: MediaBudget | None = None,
    ) -> Features:
        """Decode, resample and featurise one clip (on a worker thread); a clip is bounded
        by ``max_audio_seconds``, so it takes no share of the pixel budget."""
        from ember.media import decode_audio

        clip = decode_audio(data, index, self.sampling_rate, self.limits, guard)
        if guard is not None:
            guard.check()
        return self.audio_features(clip, index)

    def audio_features(self, clip: np.ndarray, index: int = 0) -> Features:
        extractor = self.processor.feature_extractor
        try:
            if len(clip) > int(getattr(extractor, "nb_max_samples", len(clip))):
                # CLAP crops (rand_trunc) or samples chunks (fusion) of a clip longer than
                # its window at random, from numpy's global generator: seeded per call under
                # a lock, so one clip always gets one vector.
                with _LONG_CLIP_LOCK:
                    np.random.seed(LONG_CLIP_SEED)
                    raw = extractor([clip], sampling_rate=self.sampling_rate, return_tensors="np")
            else:
                raw = extractor([clip], sampling_rate=self.sampling_rate, return_tensors="np")
        except (ValueError, TypeError) as exc:
            raise BadRequest(
                f"input {index}: the audio could not be preprocessed: {exc}", param="input"
            ) from None
        return self._features("audio", self._arrays(raw))

    def warm_up_item(self, modality: Modality) -> Features:
        """A synthetic input of ``modality`` for the start-up warm-up."""
        if modality == "image":
            from PIL import Image

            return self.image_features(Image.new("RGB", (224, 224), (128, 96, 64)))
        if modality == "audio":
            seconds = np.arange(self.sampling_rate, dtype=np.float32) / self.sampling_rate
            return self.audio_features(0.1 * np.sin(2 * np.pi * 440 * seconds))
        return self.encode(["warm-up"])[0]

    # ---- batching --------------------------------------------------------------------------
    @staticmethod
    def _arrays(raw: Any) -> dict[str, np.ndarray]:
        return {
            k: v.numpy() if hasattr(v, "numpy") else np.asarray(v)
            for k, v in dict(raw).items()
            if k not in DROPPED_ARRAYS
        }

    def _features(self, modality: Modality, arrays: dict[str, np.ndarray]) -> Features:
        if "input_ids" in arrays:
            cost = int(arrays["input_ids"].shape[-1])
        elif modality == "image":
            height, width = arrays["pixel_values"].shape[-2:]
            cost = (height // self.patch_size) * (width // self.patch_size) + 1
        else:  # audio: spectrogram frames
            cost = int(arrays["input_features"].shape[-2])
        # Arrays concatenated whole must agree in their trailing shape to share a batch;
        # Qwen2-VL's patch rows are concatenated across images of any size.
        shapes = tuple(
            (name, a.shape[1:])
            for name, a in sorted(arrays.items())
            if name not in SEQUENCE_ARRAYS and not (self.facts.flat_patches and a.ndim == 2)
        )
        return Features(modality, arrays, cost, (modality, shapes))

    def filler(self, length: int) -> Features:
        """A text of ``length`` tokens for the warm-up's largest batch."""
        text = " ".join(["warm"] * max(1, length))
        return self._texts([text], truncate=True)[0]

    def collate(self, items: Sequence[Features]) -> FeatureBatch:
        modality = items[0].modality
        arrays: dict[str, np.ndarray] = {}
        for name in items[0].arrays:
            parts = [it.arrays[name] for it in items]
            if name in SEQUENCE_ARRAYS:
                longest = max(p.shape[-1] for p in parts)
                fill = self.pad_id if name == "input_ids" else 0
                padded = np.full((len(parts), longest), fill, dtype=parts[0].dtype)
                for row, part in enumerate(parts):
                    padded[row, : part.shape[-1]] = part[0]
                arrays[name] = padded
            else:
                arrays[name] = np.concatenate(parts, axis=0)
        return FeatureBatch(modality, arrays)


def build_media_processor(model: ResolvedModel, max_length: int | None = None) -> MediaProcessor:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise MissingDependency(
            f"{model.served_name} is a {model.family.name} model, served "
            "with its transformers processor: pip install 'ember[torch,media]'"
        ) from None
    return MediaProcessor(model, max_length)
