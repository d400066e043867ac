"""Build the media benchmark models into a directory that both servers then load.

    PYTHONPATH=. .venv/bin/python benchmarks/media_models.py clip-vit-b32 /tmp/clip-b32
    PYTHONPATH=. .venv/bin/python benchmarks/media_models.py clap-base /tmp/clap-base

``clip-vit-b32`` is openai/clip-vit-base-patch32's configuration and ``clap-base``
laion/clap-htsat-unfused's, both with seeded random weights (real compute, meaningless
vectors), in the hub layout that Infinity's transformers 4.x also reads. The tiny test
models (``tiny-clip``, ``tiny-siglip``, ``tiny-clap``, ``tiny-colpali``, ``tiny-colqwen2``)
build the same way. The builders live in tests/fixtures/media_models.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures import media_models  # noqa: E402

BUILDERS = {
    "clip-vit-b32": media_models.build_clip_vit_b32,
    "clap-base": media_models.build_clap_base,
    "tiny-clip": media_models.build_tiny_clip,
    "tiny-siglip": media_models.build_tiny_siglip,
    "tiny-clap": media_models.build_tiny_clap,
    "tiny-colpali": media_models.build_tiny_colpali,
    "tiny-colqwen2": media_models.build_tiny_colqwen2,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(BUILDERS))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(BUILDERS[args.model](args.directory))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
