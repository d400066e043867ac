"""Admission on a real host: what a flood with a short deadline and a request too large for
its deadline get, measured and printed (it passes or fails nothing: the outcome depends on
the host's speed and load, which is why it is not a test).

    PYTHONPATH=core:. .venv/bin/python benchmarks/admission.py            # idle host, ~1 min
    PYTHONPATH=core:. .venv/bin/python benchmarks/admission.py --busy     # every core also busy

(1) The flood: 40 requests of 16 texts at once, on MiniLM in-process (CPU), with a deadline
of 1 s or six times what one request took there, whichever is longer: the requests the
measured rate cannot answer in time should get 429 at arrival, not 504 after waiting, so
the admitted ones finish. Printed: done / refused (429) / expired (504).
(2) The oversize request (issue 27): ``--inputs`` texts of about 256 tokens each, alone on
the idle engine after the flood measured its rate, with the default 60 s deadline and with
``--short-deadline``: each prints its status, how long the answer took and its message (a
429 names how many inputs fit).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ember.config import settings_from_env  # noqa: E402
from ember.engine import EmbedRequest, EngineArray  # noqa: E402
from ember.engine.engine import Engine  # noqa: E402
from ember.errors import EmberError, Overloaded, RequestTimeout  # noqa: E402
from ember.models.resolve import default_model_path  # noqa: E402
from tests.support import busy_cores  # noqa: E402

FLOOD_TEXT = "sentence {} of a flood of requests about retrieval"
LONG_TEXT = "the measured rate of a server decides what it admits " * 26  # ~256 tokens


async def flood(engine: Engine) -> str:
    texts = [FLOOD_TEXT.format(i) for i in range(16)]
    started = time.perf_counter()
    await engine.embed(
        EmbedRequest(texts)
    )  # a measured rate for full batches, on this host as it is
    one = time.perf_counter() - started
    engine.spec = replace(engine.spec, request_timeout=max(1.0, 6 * one))
    outcomes = await asyncio.wait_for(
        asyncio.gather(
            *(engine.embed(EmbedRequest(texts)) for _ in range(40)), return_exceptions=True
        ),
        timeout=120,
    )
    done = sum(not isinstance(o, BaseException) for o in outcomes)
    refused = sum(isinstance(o, Overloaded) for o in outcomes)
    expired = sum(isinstance(o, RequestTimeout) for o in outcomes)
    return (
        f"flood: one request {one:.2f}s, deadline {engine.spec.request_timeout:.2f}s: "
        f"{done} done, {refused} refused (429), {expired} expired (504) of 40"
    )


async def oversize(engine: Engine, inputs: int, deadline: float) -> str:
    engine.spec = replace(engine.spec, request_timeout=deadline)
    started = time.perf_counter()
    try:
        result = await engine.embed(EmbedRequest([LONG_TEXT] * inputs))
    except EmberError as exc:
        seconds = time.perf_counter() - started
        said = f"{exc.status_code} after {seconds:.2f}s: {exc.message}"
        return f"{inputs} x ~256 tokens, deadline {deadline:g}s: {said}"
    seconds = time.perf_counter() - started
    return (
        f"{inputs} x ~256 tokens, deadline {deadline:g}s: 200 after {seconds:.2f}s "
        f"({result.prompt_tokens} tokens)"
    )


async def main(args: argparse.Namespace) -> None:
    settings = settings_from_env(model_id=str(default_model_path()), device="cpu")
    engines = EngineArray(settings.model_specs())
    await engines.start()  # loading is not measured: a busy host turns busy after it
    engine = engines.get(None)
    try:
        if args.busy:
            with busy_cores(seconds=300):
                print(await flood(engine), "(every core busy)", flush=True)
        else:
            print(await flood(engine), "(idle host)", flush=True)
        rate = engine.batcher.throughput
        print(
            f"measured: {rate.per_second or 0:.0f} inputs/s, "
            f"{rate.cost_per_second or 0:.0f} tokens/s, "
            f"{engine.text_cost.chars_per_token or 0:.2f} characters/token",
            flush=True,
        )
        for deadline in (60.0, args.short_deadline):
            answer = await oversize(engine, args.inputs, deadline)
            print(answer, flush=True)
            fit = re.search(r"about (\d+) of them fit", answer)
            if fit and int(fit.group(1)) > 0:  # split as told: does that many finish in time?
                print("  split as told:", await oversize(engine, int(fit.group(1)), deadline))
    finally:
        await engines.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", action="store_true", help="spin every core meanwhile")
    parser.add_argument("--inputs", type=int, default=2048, help="texts in the large request")
    parser.add_argument("--short-deadline", type=float, default=5.0)
    asyncio.run(main(parser.parse_args()))
