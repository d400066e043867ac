"""A model's files -> its family -> a ``ResolvedModel``: where the files are is
``ember.models.resolve``'s (local directory or hub download), which family they are and
what that family reads from them is the registry's (``ember.families``: detection and
facts). Nothing is guessed silently."""

from __future__ import annotations

from pathlib import Path

from ember.families.registry import SCORE_MODULES, ModelFiles, detect
from ember.models.resolve import locate
from ember.models.spec import ModelSpec, ResolvedModel
from ember.models.st_files import StModules, st_modules, st_pipeline


def resolve_model(spec: ModelSpec) -> ResolvedModel:
    root, served_name = locate(spec)
    return resolve_files(spec, root, served_name, st_modules(root, SCORE_MODULES))


def resolve_files(
    spec: ModelSpec, root: Path, served_name: str, modules: StModules
) -> ResolvedModel:
    """A model directory as the family its files name resolves it."""

    def part(
        directory: Path, entries: list[tuple[str, Path]], where: Path, name: str
    ) -> ResolvedModel:
        pipeline = st_pipeline(directory, entries, where, SCORE_MODULES)
        return resolve_files(spec, directory, name, pipeline)

    files = ModelFiles(spec, root, served_name, modules, part)
    family = detect(files)
    return family.resolve(files, family)
