"""A Router's facts: its routes, each a model of its own, and the sides they take."""

from __future__ import annotations

from dataclasses import dataclass

from ember.models.spec import Facts, ResolvedModel


@dataclass(frozen=True)
class Routes(Facts):
    """The family's facts: each route's pipeline resolved as a model of its own, by route
    name, and the route a query, a document and an input marked as neither take (as
    ``Router._resolve_route`` resolves them for text; None: no route for that side)."""

    models: dict[str, ResolvedModel]
    query: str | None
    document: str | None
    default: str

    @property
    def parts(self) -> tuple[ResolvedModel, ...]:
        return tuple(self.models.values())
