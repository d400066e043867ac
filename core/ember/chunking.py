"""Long documents: what a request asks of an input longer than a chunk, and where each
chunk lies in it.

Every embed route and ``ember embed`` decode their fields (``overflow``, ``chunking``,
``late_chunking``, ``aggregate``) into one ``Chunking``; the processor plans ``Span``s over
the input's tokens (``ember.processors.chunks``) and the engine embeds them
(``ember.engine.long_inputs``). Offsets are in Unicode code points of the input as sent
(Python ``str`` indices: ``text[char_start:char_end]`` is the chunk); token positions count
the input's own tokens, without the model's special tokens and without a prompt.

The ground floor: imports Ember's errors only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from ember.errors import BadRequest

Overflow = Literal["error", "truncate", "chunk"]
Boundary = Literal["token", "sentence"]
Aggregate = Literal["none", "mean", "max", "first"]
OVERFLOWS: tuple[str, ...] = get_args(Overflow)
BOUNDARIES: tuple[str, ...] = get_args(Boundary)
AGGREGATES: tuple[str, ...] = get_args(Aggregate)

# The poolings late chunking can apply to a chunk's own token vectors, across windows too:
# each is a sum or a maximum over the chunk's tokens, which partial sums and maxima of the
# windows a long document is read in combine into exactly. A CLS or last-token pooling
# has no per-chunk meaning (one position stands for the whole text).
LATE_POOLINGS = ("mean", "max", "mean_sqrt_len")
# Past the model's length, late chunking reads the document in windows that overlap by
# this share of a window; each token's vector comes from the window it is most central in.
LATE_WINDOW_OVERLAP = 0.25


@dataclass(frozen=True, slots=True)
class Chunking:
    """How to cut each input into chunks and what to answer for it.

    ``size``: content tokens per chunk (None: as many as the model takes beside its special
    tokens and prompt); ``overlap``: tokens a chunk repeats of the one before; ``boundary``:
    cut only between words (``token``) or, where a sentence ends within the chunk's room,
    there (``sentence``). ``late``: one forward over the whole document, each chunk pooled
    from its tokens' vectors (overlapping windows past the model's length). ``given``: the
    request's strings are one document's chunks, in order (Jina's ``late_chunking``);
    the answer is then one vector per string. ``aggregate``: the document vector beside
    its chunks (``mean`` weighted by each chunk's tokens). ``text``: return each chunk's
    text too."""

    size: int | None = None
    overlap: int = 0
    boundary: Boundary = "token"
    late: bool = False
    given: bool = False
    aggregate: Aggregate = "mean"
    text: bool = False

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 1:
            raise BadRequest(f"chunking size must be at least 1, got {self.size}", param="size")
        if self.overlap < 0:
            raise BadRequest(
                f"chunking overlap must be 0 or more, got {self.overlap}", param="overlap"
            )
        if self.size is not None and self.overlap >= self.size:
            raise BadRequest(
                f"chunking overlap ({self.overlap}) must be less than its size ({self.size})",
                param="overlap",
            )

    def within(self, room: int) -> int:
        """The chunk size for a model that takes ``room`` content tokens per input."""
        if self.size is None:
            if self.overlap >= room:
                raise BadRequest(
                    f"chunking overlap ({self.overlap}) must be less than the chunk size, "
                    f"this model's {room} tokens",
                    param="overlap",
                )
            return room
        if self.size > room and not self.late:
            raise BadRequest(
                f"chunking size {self.size} is more than the {room} tokens this model takes "
                "per input beside its special tokens and prompt: send at most that, or "
                "late_chunking (its chunks may be any size)",
                param="size",
            )
        return self.size


@dataclass(frozen=True, slots=True)
class Span:
    """One chunk of an input: its tokens ``[token_start, token_end)`` among the input's own
    tokens and its characters ``[char_start, char_end)`` (code points) of the input."""

    token_start: int
    token_end: int
    char_start: int
    char_end: int

    @property
    def tokens(self) -> int:
        return self.token_end - self.token_start


def chunking_of(
    *,
    overflow: str | None,
    size: int | None = None,
    overlap: int | None = None,
    boundary: str | None = None,
    late: bool = False,
    aggregate: str | None = None,
    text: bool = False,
    chunked: bool = False,
) -> Chunking | None:
    """The ``Chunking`` a request's long-document fields ask for (None: none); ``chunked``
    says a ``chunking`` object was sent. Late chunking with no chunking asked is Jina's
    shape: the strings are one document's chunks."""
    if overflow is not None and overflow not in OVERFLOWS:
        raise BadRequest(f"overflow must be one of {', '.join(OVERFLOWS)}", param="overflow")
    wants = chunked or overflow == "chunk"
    if wants and overflow in ("error", "truncate"):
        raise BadRequest(
            f"chunking cuts long inputs and overflow {overflow!r} says not to: send "
            "overflow 'chunk' or leave it out",
            param="overflow",
        )
    if not wants and aggregate is not None:
        raise BadRequest(
            "aggregate combines a document's chunks: send chunking or overflow 'chunk' too",
            param="aggregate",
        )
    if not wants and not late:
        return None
    return Chunking(
        size=size,
        overlap=overlap or 0,
        boundary=boundary or "token",  # type: ignore[arg-type]  # the dialects' Literal
        late=late,
        given=late and not wants,
        aggregate=aggregate or "mean",  # type: ignore[arg-type]
        text=text,
    )
