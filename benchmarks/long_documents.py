"""Long documents: a ~32k-token document chunked by the server against the same chunks sent
as separate inputs, and late chunking, on one `ember serve` (issue 41's speed bar: chunked
at >= 0.9x the tokens/s of the separate chunks).

    PYTHONPATH=core:. .venv/bin/python benchmarks/long_documents.py            # ~2 min
    PYTHONPATH=core:. .venv/bin/python benchmarks/long_documents.py --tokens 8000 --rounds 3

The document: the benchmark corpus's seeded sentences joined into one text of about
``--tokens`` tokens. Each round sends, one after another: the document with
a ``chunking`` object (chunks of the model's length, the server plans and batches them);
the same chunks' texts (as the server returned them) in one request of separate inputs;
and the document with ``late_chunking`` (overlapping windows, every token encoded counted).
Tokens/s is the answer's ``usage.prompt_tokens`` over the request's wall time; the report
takes the median round. Writes ``results/<date>-long-documents.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import corpus, roofline, run  # noqa: E402


def document(tokens: int, seed: int = 41) -> str:
    """Seeded corpus sentences joined until about ``tokens`` tokens (~1.3 tokens a word)."""
    words, sentences = 0, []
    for sentence in corpus.make_sentences(40_000, seed=seed):
        sentences.append(sentence)
        words += len(sentence.split())
        if words * 1.3 >= tokens:
            break
    return " ".join(sentences)


def timed(client: httpx.Client, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    response = client.post("/v1/embeddings", json={"model": run.MODEL_NAME, **body})
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    return seconds, response.json()


def measure(base_url: str, doc: str, rounds: int) -> dict[str, Any]:
    rows: dict[str, list[float]] = {"chunked": [], "separate": [], "late": []}
    tokens: dict[str, int] = {}
    chunks = 0
    with httpx.Client(base_url=base_url, timeout=600, trust_env=False) as client:
        texts: list[str] = []
        for _ in range(rounds + 1):  # the first round warms up, unrecorded
            seconds, answer = timed(
                client, {"input": doc, "chunking": {"return_text": True}, "aggregate": "mean"}
            )
            texts = [c["text"] for c in answer["data"][0]["chunks"]]
            chunks, tokens["chunked"] = len(texts), answer["usage"]["prompt_tokens"]
            rows["chunked"].append(tokens["chunked"] / seconds)
            seconds, answer = timed(client, {"input": texts})
            tokens["separate"] = answer["usage"]["prompt_tokens"]
            rows["separate"].append(tokens["separate"] / seconds)
            seconds, answer = timed(client, {"input": doc, "late_chunking": True, "chunking": {}})
            tokens["late"] = answer["usage"]["prompt_tokens"]
            rows["late"].append(tokens["late"] / seconds)
    medians = {k: statistics.median(v[1:]) for k, v in rows.items()}
    return {
        "chunks": chunks,
        "tokens": tokens,
        "tokens_per_s": {k: round(v, 1) for k, v in medians.items()},
        "rounds": {k: [round(x, 1) for x in v[1:]] for k, v in rows.items()},
        "chunked_vs_separate": round(medians["chunked"] / medians["separate"], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ember", default="auto:auto", help="backend:dtype (benchmarks/run.py)")
    parser.add_argument("--model", type=Path, default=None, help="default: the packaged MiniLM")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--request-timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=run.RESULTS)
    args = parser.parse_args()
    from ember.models.resolve import default_model_path

    model = args.model or default_model_path()
    doc = document(args.tokens)
    server = run.ember_server(args.ember, args.python)
    # A 32k-token document takes tens of seconds on a few CPU cores: past the default
    # --request-timeout, admission would refuse it (429) before any work.
    server.env["EMBER_REQUEST_TIMEOUT"] = str(args.request_timeout)
    live = run.start_server(server, model, "long-docs", 300)
    if "error" in live.row:
        print(json.dumps(live.row, indent=1))
        return 1
    try:
        assert live.base_url is not None
        result = measure(live.base_url, doc, args.rounds)
    finally:
        assert live.proc is not None
        run.stop(live.proc)
    result.update(
        date=dt.date.today().isoformat(),
        cpu={k: v for k, v in roofline.cpu_kind().items() if k != "flags"},
        load_average=[round(x, 2) for x in os.getloadavg()],
        server=live.row,
        document_chars=len(doc),
        command=" ".join(sys.argv),
    )
    stem = args.out / f"{result['date']}-long-documents"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    t = result["tokens_per_s"]
    lines = [
        f"# Long documents — {result['date']}",
        "",
        f"`{result['command']}` on {result['cpu']['model_name']} "
        f"({' '.join(result['cpu']['key_flags']) or 'no AVX-512/AMX'}), load average "
        f"{result['load_average'][0]} at the end; server {live.row.get('server')} (MiniLM), "
        f"cold start {live.row.get('cold_start_s')} s. Document: {len(doc):,} characters, "
        f"{result['tokens']['chunked']:,} tokens encoded as {result['chunks']} chunks.",
        "",
        "| request | tokens encoded | tokens/s (median of rounds) |",
        "|---|---:|---:|",
        f"| one document, `chunking` at the model's length | {result['tokens']['chunked']:,} "
        f"| {t['chunked']} |",
        f"| its chunks as separate inputs | {result['tokens']['separate']:,} | {t['separate']} |",
        f"| one document, `late_chunking` (windows) | {result['tokens']['late']:,} | {t['late']} |",
        "",
        f"Chunked / separate: **{result['chunked_vs_separate']}x** (the bar: >= 0.9x).",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
