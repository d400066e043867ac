"""OpenAI batch files through ``ember embed``: the Batch API's (and vLLM ``run-batch``'s)
JSON Lines in, its result lines out, resumably.

Each input line is ``{"custom_id", "method": "POST", "url", "body"}``; ``url`` is any model
route (``/v1/embeddings``, ``/v1/rerank``, ``/score``, ...) and its body runs through that
route's own operation (``ember.platform.dispatch_route``), so a result body is what the
HTTP route answers for it. Each output line is ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``, one per input line, in input order. A
line that fails (not JSON, no ``custom_id``, a ``custom_id`` seen before, an unknown
``url``, a body the route refuses) gets its own line with the route's error status and
OpenAI-shaped error body, plus ``error: {"code", "message", "param", "line"}`` (the
Batch API's error object; vLLM's readers look there): the job goes on. A line with no
usable ``custom_id``, or a repeated one, is answered with ``custom_id: null`` and its line
number, so that every ``custom_id`` appears exactly once.

Lines run concurrently through the one engine, up to ``in_flight`` inputs queued ahead, so
the batcher forms batches across lines, as for a corpus. Results are appended to the
output file; every ``commit_lines`` lines the file is fsynced and then the checkpoint
(``<output>.ember-job.json``: lines done, bytes written) replaced atomically. A resumed
run cuts the file back to the checkpoint's length and continues at the next input line, so
after a kill at any instant every ``custom_id`` appears exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from ember.api.routes import ROUTES_BY_PATH
from ember.config import ServerSettings
from ember.engine import EngineArray
from ember.errors import BadRequest, ConfigError, EmberError, NotFound
from ember.jobs.batch_results import (
    ResultsFile,
    input_lines,
    prefix_digest,
    seen_ids,
)
from ember.jobs.inputs import BATCH_FORMAT, InputSpec
from ember.jobs.lock import LOCK, hold_output
from ember.jobs.runner import JobOptions, job_identity, job_settings
from ember.lanes import bulk_by_default
from ember.platform import dispatch_route

log = logging.getLogger(__name__)

# Body fields whose lists are a line's inputs: what a line weighs in the in-flight window.
_INPUT_FIELDS = ("input", "inputs", "texts", "documents", "text_1", "text_2", "images")


def is_batch_file(path: Path, given_format: str | None) -> bool:
    """Named ``--input-format openai-batch``, or a JSON Lines file whose first record has
    a ``custom_id`` and a ``body`` (a corpus has its text column instead)."""
    if given_format is not None:
        return given_format == BATCH_FORMAT
    if path.suffix.lower() not in (".jsonl", ".ndjson", ".json") or not path.is_file():
        return False
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                try:
                    first = orjson.loads(line)
                except orjson.JSONDecodeError:
                    return False
                return isinstance(first, dict) and "custom_id" in first and "body" in first
    return False


@dataclass(frozen=True)
class BatchSummary:
    output: Path
    requests: int
    requests_this_run: int
    errors: int
    resumed_from: int
    seconds: float


@dataclass
class _Line:
    """One input line: where it is, its custom_id, and its result once known."""

    number: int  # 1-based, as editors count
    raw: bytes = b""
    custom_id: Any = None
    task: asyncio.Future | None = None
    result: dict[str, Any] | None = None
    weight: int = 1


class LineError(Exception):
    def __init__(self, error: EmberError, custom_id: Any = None) -> None:
        super().__init__(error.message)
        self.error, self.custom_id = error, custom_id


def parse_line(raw: bytes, number: int, seen: set[str]) -> tuple[str, str, Any]:
    """(custom_id, url, body) of one input line, or LineError naming what is wrong. A
    custom_id joins ``seen`` as soon as it is read, so a repeat is refused whatever else
    was wrong with either line (a resumed job rebuilds ``seen`` the same way)."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineError(BadRequest(f"line {number} is not JSON: {exc}")) from None
    if not isinstance(record, dict):
        raise LineError(BadRequest(f"line {number} is not a JSON object"))
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(BadRequest(f"line {number} has no custom_id", param="custom_id"))
    if custom_id in seen:  # answered with no custom_id: each appears once
        raise LineError(
            BadRequest(
                f"line {number}: custom_id {custom_id!r} repeats an earlier line's",
                param="custom_id",
            )
        )
    seen.add(custom_id)
    method = record.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        raise LineError(
            BadRequest(f"line {number}: method {method!r}; batch lines are POST", param="method"),
            custom_id,
        )
    url = record.get("url")
    if not isinstance(url, str):
        raise LineError(BadRequest(f"line {number} has no url", param="url"), custom_id)
    url = url.split("?", 1)[0]
    if url not in ROUTES_BY_PATH:
        raise LineError(NotFound(f"line {number}: no model route {url!r}", param="url"), custom_id)
    if "body" not in record:
        raise LineError(BadRequest(f"line {number} has no body", param="body"), custom_id)
    return custom_id, url, record["body"]


def result_line(custom_id: Any, status: int, body: Any, error: dict | None) -> dict[str, Any]:
    """The Batch API's result object."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body},
        "error": error,
    }


def error_line(exc: BaseException, custom_id: Any, number: int) -> dict[str, Any]:
    """A failed line: the status and body the HTTP route answers (its one error handler),
    and the Batch API's error object beside them."""
    from ember.api.errors import exception_response

    response = exception_response(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
    body = orjson.loads(response.body)
    detail = body.get("error", {})
    error = {
        "code": detail.get("type", "server_error"),
        "message": detail.get("message", str(exc)),
        "param": detail.get("param"),
        "line": number,
    }
    return result_line(custom_id, response.status_code, body, error)


def _weight(body: Any) -> int:
    if not isinstance(body, dict):
        return 1
    return max(
        1, sum(len(v) for k, v in body.items() if k in _INPUT_FIELDS and isinstance(v, list))
    )


@bulk_by_default
async def run_batch_job(
    engines: EngineArray,
    source: Path,
    output: Path,
    *,
    job: dict[str, Any],
    in_flight: int,
    commit_lines: int,
    max_client_batch_size: int,
    overwrite: bool = False,
    progress: bool = False,
) -> BatchSummary:
    """Answer every line of ``source`` into ``output``, continuing from its checkpoint."""
    from tqdm import tqdm

    results = ResultsFile(output)
    checkpoint = results.open(job, overwrite=overwrite)
    digest = prefix_digest(source, checkpoint.lines_done)
    if checkpoint.lines_done and digest.hexdigest() != checkpoint.input_digest:
        raise ConfigError(
            f"{source} changed since {output} was started: its first {checkpoint.lines_done} "
            "lines differ from the ones answered; write to a new --output, or pass --overwrite "
            "to start again"
        )
    resumed = checkpoint.requests
    if checkpoint.complete:
        log.info("%s is complete (%d requests); nothing to do", output, resumed)
        return BatchSummary(output, resumed, 0, checkpoint.errors, resumed, 0.0)
    seen = seen_ids(source, checkpoint.lines_done) if checkpoint.lines_done else set()
    total = sum(1 for _, raw in input_lines(source, 0) if raw.strip())
    bar = tqdm(total=total, initial=resumed, unit="req", desc="batch", disable=not progress)
    window: deque[_Line] = deque()
    queued = 0
    pending: list[bytes] = []
    consumed = checkpoint.lines_done
    started = time.perf_counter()

    def start(number: int, raw: bytes) -> _Line:
        line = _Line(number, raw)
        try:
            line.custom_id, url, body = parse_line(raw, number, seen)
            line.weight = _weight(body)
            line.task = asyncio.ensure_future(
                dispatch_route(engines, url, body, max_client_batch_size=max_client_batch_size)
            )
        except LineError as exc:
            line.custom_id = exc.custom_id
            line.result = error_line(exc.error, exc.custom_id, number)
        return line

    async def finish(line: _Line) -> dict[str, Any]:
        if line.result is not None:
            return line.result
        assert line.task is not None
        try:
            body = await line.task
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return error_line(exc, line.custom_id, line.number)
        return result_line(line.custom_id, 200, body, None)

    lines = input_lines(source, checkpoint.lines_done)
    exhausted = False
    try:
        while True:
            # Bounded by the inputs queued and by the lines held (error lines queue none).
            while not exhausted and (
                not window or (queued < in_flight and len(window) < in_flight)
            ):
                nxt = next(lines, None)
                if nxt is None:
                    exhausted = True
                    break
                number, raw = nxt
                # A blank line answers nothing; its placeholder keeps ``consumed`` in order.
                line = start(number, raw) if raw.strip() else _Line(number, raw, result={})
                window.append(line)
                queued += line.weight if line.task is not None else 0
            if not window:
                break
            line = window.popleft()
            result = await finish(line)
            if line.task is not None:
                queued -= line.weight
            consumed = line.number
            digest.update(line.raw)
            checkpoint.input_digest = digest.hexdigest()
            if result:  # a blank line's placeholder answers nothing
                pending.append(orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
                checkpoint.requests += 1
                checkpoint.errors += int(result["error"] is not None)
                bar.update(1)
            if len(pending) >= commit_lines:
                await asyncio.to_thread(results.append, checkpoint, pending, consumed)
                pending = []
        checkpoint.complete = True
        await asyncio.to_thread(results.append, checkpoint, pending, consumed)
    finally:
        bar.close()
        for line in window:
            if line.task is not None:
                line.task.cancel()
        await asyncio.gather(
            *(ln.task for ln in window if ln.task is not None), return_exceptions=True
        )
    return BatchSummary(
        output,
        checkpoint.requests,
        checkpoint.requests - resumed,
        checkpoint.errors,
        resumed,
        time.perf_counter() - started,
    )


def batch_identity(settings: ServerSettings, source: Path) -> dict[str, Any]:
    """What a resume must not change: the corpus job's identity of this input and model."""
    spec = settings.model_specs()[0]
    return job_identity(spec, InputSpec(source, "jsonl"), BATCH_FORMAT, JobOptions(output=source))


async def _run(
    settings: ServerSettings, source: Path, output: Path, **options: Any
) -> BatchSummary:
    engines = EngineArray(settings.model_specs())
    await engines.start()
    try:
        return await run_batch_job(engines, source, output, **options)
    finally:
        await engines.stop()


def run_batch_file(
    settings: ServerSettings,
    source: Path,
    output: Path,
    *,
    in_flight: int,
    commit_lines: int,
    overwrite: bool = False,
    progress: bool = True,
) -> BatchSummary:
    """Load the model, answer every line of the batch file, stop the model."""
    if not source.is_file():
        raise BadRequest(f"input {source} is not a file")
    if output.is_dir():
        raise ConfigError(f"--output {output} is a directory; a batch file's results are a file")
    job = batch_identity(settings, source)
    limit = settings.max_client_batch_size
    tuned = job_settings(settings, JobOptions(output=output, in_flight=in_flight))
    # A line alone may queue a whole request (rerank: its documents and its query).
    tuned = tuned.model_copy(update={"max_queue_size": str(in_flight + limit + 1)})
    run = partial(
        _run,
        tuned,
        source,
        output,
        job=job,
        in_flight=in_flight,
        commit_lines=commit_lines,
        max_client_batch_size=limit,
        overwrite=overwrite,
        progress=progress,
    )
    # One job per results file, as per corpus output directory (ember.jobs.lock).
    with hold_output(output.parent, f"{LOCK}.{output.name}"):
        return asyncio.run(run())
