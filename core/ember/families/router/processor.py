"""A sentence-transformers Router's text processor: each input through its route's own.

A Router sends a query, a document and an input marked as neither through routes of their
own (the family's facts, ``Routes``), each with its tokenizer: a StaticEmbedding's without
special tokens, a transformer's with them and its max length. Every input's tokens carry
their route as their ``part``, so the batcher keeps routes apart (``Tokens.key``) and the
backend and heads run each batch through its route's network and head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ember.batch import TokenBatch, Tokens
from ember.errors import BadRequest
from ember.families.router.facts import Routes
from ember.models.spec import ResolvedModel
from ember.processors.text import Direction


class RouterProcessor:
    encodes_queries = True
    masks_positions = False
    # sentence-transformers' encode_query routes to "query" and applies the "query" prompt.
    side_prompts = True

    def __init__(self, model: ResolvedModel, max_length: int | None = None) -> None:
        from ember.processors import TextProcessor, build_processor

        routes = model.facts
        assert isinstance(routes, Routes)
        self.name = model.served_name
        self.routes: dict[str, TextProcessor] = {
            name: build_processor(sub, max_length) for name, sub in routes.models.items()
        }
        self._sides = {True: routes.query, False: routes.document, None: routes.default}
        self.default = routes.default
        # Warm-up and /info follow the document side: the route with the network to warm.
        self.main = routes.document or routes.default
        self.max_length = self.routes[self.main].max_length

    def _route(self, query: bool | None) -> str:
        route = self._sides[query]
        if route is None:
            side = "query" if query else "document"
            raise BadRequest(
                f"model {self.name!r} is a Router without a {side} route; send no input_type "
                "or prompt_name for its default route",
                param="input_type",
            )
        return route

    def encode(
        self,
        texts: list[str],
        *,
        truncate: bool = True,
        direction: Direction = "right",
        query: bool | None = None,
    ) -> list[Tokens]:
        route = self._route(query)
        tokens = self.routes[route].encode(texts, truncate=truncate, direction=direction)
        return [replace(t, part=route) for t in tokens]

    def encode_pairs(self, pairs: list[tuple[str, str]], *, truncate: bool = True) -> list[Tokens]:
        tokens = self.routes[self.default].encode_pairs(pairs, truncate=truncate)
        return [replace(t, part=self.default) for t in tokens]

    def from_ids(
        self, sequences: list[list[int]], *, truncate: bool = True, query: bool | None = None
    ) -> list[Tokens]:
        route = self._route(query)
        tokens = self.routes[route].from_ids(sequences, truncate=truncate)
        return [replace(t, part=route) for t in tokens]

    def collate(self, tokens: Sequence[Tokens]) -> TokenBatch:
        route = tokens[0].part
        assert route is not None and all(t.part == route for t in tokens)
        return replace(self.routes[route].collate(tokens), part=route)

    def filler(self, length: int) -> Tokens:
        return replace(self.routes[self.main].filler(length), part=self.main)

    def tokenize_detail(self, text: str, *, add_special_tokens: bool = True) -> list[dict]:
        return self.routes[self.default].tokenize_detail(
            text, add_special_tokens=add_special_tokens
        )

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool = True) -> list[str]:
        return self.routes[self.default].decode(ids, skip_special_tokens=skip_special_tokens)
