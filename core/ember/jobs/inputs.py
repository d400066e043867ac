"""Reading a corpus: JSON Lines, CSV, Parquet or plain text, as (id, text) rows in file order.

Rows are streamed, never loaded whole, and can start at any row: a resumed job skips the
rows its checkpoint already holds. Ids pass through unchanged from the id column; without
one, a row's id is its 0-based position in the file (a text file's line number).
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from ember.errors import BadRequest

Format = Literal["jsonl", "csv", "parquet", "text"]
FORMATS: tuple[Format, ...] = ("jsonl", "csv", "parquet", "text")
# An OpenAI batch file's format name (``ember.jobs.batch`` runs it): here, where the CLI's
# parser reads it without importing the routes the batch job dispatches to.
BATCH_FORMAT = "openai-batch"
SUFFIXES: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
}
# Parquet is read a record batch at a time: bounded memory whatever the file's size.
PARQUET_BATCH_ROWS = 4096
# A line (text, JSON Lines) longer than this is refused, not read whole: a model uses a few
# thousand characters of a text (longer ones are cut before tokenising), and a file of one
# endless line would otherwise be read into memory at once. CSV has its own bound
# (``csv.field_size_limit``).
MAX_ROW_BYTES = 16 * 1024 * 1024
Row = tuple[Any, str]
# Byte-order marks of encodings the line formats are not read in (UTF-32 before UTF-16:
# the UTF-32LE mark begins with UTF-16LE's).
FOREIGN_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
SNIFF_BYTES = 4096


def detect_format(path: Path, given: str | None = None) -> Format:
    """The format named, else the one the file's suffix says."""
    if given:
        if given not in FORMATS:
            raise BadRequest(f"--input-format must be one of {', '.join(FORMATS)}, got {given!r}")
        return given  # type: ignore[return-value]
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise BadRequest(
            f"cannot tell the format of {path.name} from its suffix; pass --input-format "
            f"({', '.join(FORMATS)})"
        )
    return fmt


@dataclass(frozen=True)
class InputSpec:
    """Where the corpus is and which columns hold the text and the id."""

    path: Path | str  # a local file, or a URI pyarrow.fs opens (s3://bucket/corpus.jsonl)
    format: Format
    text_column: str = "text"
    id_column: str | None = None

    @classmethod
    def of(
        cls,
        path: str | Path,
        *,
        format: str | None = None,
        text_column: str = "text",
        id_column: str | None = None,
    ) -> InputSpec:
        from ember.jobs.store import Store, is_uri

        if is_uri(path):
            store = Store.of(str(path))
            parent, name = store.root.rsplit("/", 1) if "/" in store.root else ("", store.root)
            if not Store(store.uri, parent, store.fs).exists(name):
                raise BadRequest(f"input {path} is not a file")
            return cls(str(path), detect_format(Path(name), format), text_column, id_column or None)
        path = Path(path)
        if not path.is_file():
            raise BadRequest(f"input {path} is not a file")
        return cls(path, detect_format(path, format), text_column, id_column or None)

    @property
    def name(self) -> str:
        """The file's name, for messages."""
        return str(self.path).rstrip("/").rsplit("/", 1)[-1]

    @property
    def identity(self) -> str:
        """The input as a job records it: a local file's absolute path, or its URI."""
        return str(self.path) if isinstance(self.path, str) else str(self.path.resolve())

    def open(self) -> Any:
        """The file, binary and seekable, wherever it is."""
        if isinstance(self.path, Path):
            return self.path.open("rb")
        from ember.jobs.store import Store

        return Store.of(self.path).open_input()

    def offsets(self, start: int, every: int) -> list[int] | None:
        """Byte offsets of rows ``start``, ``start + every``, ... (one pass over the raw
        lines, nothing decoded), so a worker reads its shard from there without the rows
        before it; None for formats read otherwise (Parquet skips row groups, CSV records
        may span lines)."""
        if self.format not in ("jsonl", "text"):
            return None
        found: list[int] = []
        with self.open() as fh:
            index, at = 0, 0
            while True:
                line = fh.readline(MAX_ROW_BYTES + 1)
                if not line:
                    return found
                if self.format == "jsonl" and not line.strip():
                    at += len(line)
                    continue
                if index >= start and (index - start) % every == 0:
                    found.append(at)
                index += 1
                at += len(line)

    def count_rows(self) -> int:
        """Rows in the file (the progress bar's total): Parquet's footer, else one pass."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            with self.open() as fh:
                return pq.ParquetFile(fh).metadata.num_rows
        return sum(1 for _ in self._raw_rows())

    def rows(
        self, start: int = 0, stop: int | None = None, offset: int | None = None
    ) -> Iterator[Row]:
        """(id, text) for rows ``start`` to ``stop`` (exclusive), in file order; ``offset``
        (from ``offsets``): where row ``start`` begins in the file, read from there."""
        if self.format == "parquet":
            yield from self._parquet_rows(start, stop)
            return
        if offset is not None:
            raws = enumerate(self._raw_rows(offset), start)
            for index, raw in itertools.islice(raws, None if stop is None else stop - start):
                yield self._row(index, raw)
            return
        for index, raw in itertools.islice(enumerate(self._raw_rows()), start, stop):
            yield self._row(index, raw)

    # ---- per format --------------------------------------------------------------------
    def _raw_rows(self, offset: int = 0) -> Iterator[Any]:
        """Undecoded rows of a line-based format: lines, CSV records or JSON lines (from
        byte ``offset``, a row's start, for the line formats)."""
        with self.open() as fh:
            self._check_encoding(fh.read(SNIFF_BYTES))
            fh.seek(offset)
            if self.format == "csv":
                text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
                reader = csv.DictReader(text)
                try:
                    self._check_columns(reader.fieldnames or [])
                    yield from reader
                except UnicodeDecodeError as exc:  # decoded a block ahead: where is near
                    where = f"{self.name}, near line {reader.line_num + 1},"
                    raise self._not_utf8(where, exc) from None
                except csv.Error as exc:  # a field over csv.field_size_limit, a bad quote
                    raise BadRequest(f"record {reader.line_num} of {self.name}: {exc}") from None
                return
            for number in itertools.count(1):
                line = fh.readline(MAX_ROW_BYTES + 1)
                if not line:
                    return
                if len(line) > MAX_ROW_BYTES:
                    raise BadRequest(
                        f"line {number} of {self.name} is longer than the "
                        f"{MAX_ROW_BYTES:,} bytes a row may take"
                    )
                if self.format == "jsonl" and not line.strip():
                    continue  # blank lines separate nothing in JSON Lines
                yield line

    def _row(self, index: int, raw: Any) -> Row:
        if self.format == "text":
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise self._not_utf8(f"row {index} of {self.name}", exc) from None
            return index, text
        if self.format == "jsonl":
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise BadRequest(f"row {index} of {self.name} is not JSON: {exc}") from None
            if isinstance(record, str):  # a line that is just a JSON string is the text
                return index, record
            if not isinstance(record, dict):
                raise BadRequest(f"row {index} of {self.name} is not a JSON object")
        else:
            record = raw
        return self._pick(index, record)

    def _pick(self, index: int, record: dict[str, Any]) -> Row:
        text = record.get(self.text_column)
        if not isinstance(text, str):
            raise BadRequest(
                f"row {index} of {self.name} has no text in column {self.text_column!r} "
                f"(columns: {', '.join(map(str, record)) or 'none'})"
            )
        if self.id_column is None:
            return index, text
        if self.id_column not in record or record[self.id_column] is None:
            raise BadRequest(f"row {index} of {self.name} has no id {self.id_column!r}")
        row_id = record[self.id_column]
        if self.format == "jsonl" and isinstance(row_id, float) and abs(row_id) >= 2**63:
            # orjson reads an integer past 64 bits as a float: the id would lose digits.
            raise BadRequest(
                f"row {index} of {self.name}: id {row_id:.0f} is too large for a 64-bit "
                "integer; write ids this large as strings"
            )
        return row_id, text

    def _check_encoding(self, head: bytes) -> None:
        """Refuse a UTF-16 or UTF-32 file up front: read as UTF-8 it fails at its first byte
        (with a mark) or, without one, reads as text full of NUL characters."""
        for bom, name in FOREIGN_BOMS:
            if head.startswith(bom):
                raise BadRequest(
                    f"{self.name} is {name} (it starts with a byte-order mark); "
                    f"{self.format} inputs are read as UTF-8: convert it first, e.g. "
                    f"iconv -f {name} -t UTF-8"
                )
        if b"\x00" in head:
            raise BadRequest(
                f"{self.name} holds NUL bytes, so it is not UTF-8 text (UTF-16 or UTF-32 "
                f"without a byte-order mark?); {self.format} inputs are read as UTF-8: "
                "convert it first"
            )

    def _not_utf8(self, where: str, exc: UnicodeDecodeError) -> BadRequest:
        return BadRequest(f"{where} is not UTF-8 ({exc.reason}); convert the file to UTF-8 first")

    def _check_columns(self, names: list[str]) -> None:
        missing = [c for c in (self.text_column, self.id_column) if c and c not in names]
        if missing:
            raise BadRequest(
                f"{self.name} has no column {missing[0]!r}; its columns: {', '.join(names)}"
            )

    def _parquet_rows(self, start: int, stop: int | None) -> Iterator[Row]:
        import pyarrow.parquet as pq

        with self.open() as fh:
            yield from self._parquet_file_rows(pq.ParquetFile(fh), start, stop)

    def _parquet_file_rows(self, file: Any, start: int, stop: int | None) -> Iterator[Row]:
        self._check_columns(file.schema_arrow.names)
        columns = [c for c in (self.text_column, self.id_column) if c]
        stop = file.metadata.num_rows if stop is None else stop
        # Skip whole row groups before ``start`` without reading them.
        first, index = 0, 0
        meta = file.metadata
        while first < meta.num_row_groups and index + meta.row_group(first).num_rows <= start:
            index += meta.row_group(first).num_rows
            first += 1
        groups = list(range(first, meta.num_row_groups))
        if not groups or start >= stop:
            return
        for batch in file.iter_batches(PARQUET_BATCH_ROWS, row_groups=groups, columns=columns):
            texts = batch.column(self.text_column).to_pylist()
            ids = batch.column(self.id_column).to_pylist() if self.id_column else None
            for i, text in enumerate(texts):
                at = index + i
                if at < start:
                    continue
                if at >= stop:
                    return
                record = {self.text_column: text}
                if ids is not None:
                    record[self.id_column] = ids[i]  # type: ignore[index]
                yield self._pick(at, record)
            index += len(texts)
