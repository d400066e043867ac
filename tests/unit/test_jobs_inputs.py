"""Reading a corpus: every format gives the same (id, text) rows in file order, from any row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ember.errors import BadRequest
from ember.jobs.inputs import InputSpec, detect_format

TEXTS = [
    f"row {i}: " + "word " * (i % 7) + ('comma, and "quotes"' if i % 5 == 0 else "")
    for i in range(23)
]
IDS = [f"doc-{i:03d}" for i in range(23)]


def write_all(root: Path) -> dict[str, Path]:
    """The same corpus in each format (Parquet in row groups of 5, to test skipping)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {
        f: root / f"corpus.{s}"
        for f, s in [("jsonl", "jsonl"), ("csv", "csv"), ("parquet", "parquet"), ("text", "txt")]
    }
    with paths["jsonl"].open("w") as fh:
        for i, (doc, text) in enumerate(zip(IDS, TEXTS, strict=True)):
            fh.write(json.dumps({"doc": doc, "body": text, "n": i}) + "\n")
            if i == 10:
                fh.write("\n")  # a blank line is no row
    with paths["csv"].open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["doc", "body"])
        writer.writerows(zip(IDS, TEXTS, strict=True))
    pq.write_table(pa.table({"doc": IDS, "body": TEXTS}), paths["parquet"], row_group_size=5)
    paths["text"].write_text("".join(t + "\n" for t in TEXTS))
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_columns_pick_text_and_id_in_order(corpus: dict[str, Path], fmt: str) -> None:
    spec = InputSpec.of(corpus[fmt], text_column="body", id_column="doc")
    assert spec.format == fmt
    assert list(spec.rows()) == list(zip(IDS, TEXTS, strict=True))
    assert spec.count_rows() == len(TEXTS)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "text"])
@pytest.mark.parametrize(
    ("start", "stop"), [(0, 3), (4, 11), (5, 10), (12, None), (22, None), (23, None), (30, None)]
)
def test_any_range_reads_the_same_rows(
    corpus: dict[str, Path], fmt: str, start: int, stop: int | None
) -> None:
    """A resumed job starts mid-file; Parquet skips whole row groups to get there."""
    spec = InputSpec.of(corpus[fmt], text_column="body")
    got = list(spec.rows(start, stop))
    want = list(enumerate(TEXTS))[start:stop]
    assert got == want  # no id column: the id is the row's position


def test_text_lines_keep_blank_lines_and_strip_only_the_newline(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"first \r\n\nthird\tline\nlast without newline")
    spec = InputSpec.of(path)
    assert list(spec.rows()) == [
        (0, "first "),
        (1, ""),
        (2, "third\tline"),
        (3, "last without newline"),
    ]
    assert spec.count_rows() == 4


def test_jsonl_lines_may_be_plain_strings(tmp_path: Path) -> None:
    path = tmp_path / "s.ndjson"
    path.write_text('"just text"\n{"text": "an object"}\n')
    assert list(InputSpec.of(path).rows()) == [(0, "just text"), (1, "an object")]


def test_integer_ids_pass_through_as_integers(tmp_path: Path) -> None:
    path = tmp_path / "ints.jsonl"
    path.write_text('{"id": 7, "text": "a"}\n{"id": 3, "text": "b"}\n')
    assert list(InputSpec.of(path, id_column="id").rows()) == [(7, "a"), (3, "b")]


@pytest.mark.parametrize(
    ("name", "content", "options", "fragment"),
    [
        ("bad.jsonl", '{"text": "ok"}\n{broken\n', {}, "row 1 of bad.jsonl is not JSON"),
        ("arr.jsonl", "[1, 2]\n", {}, "not a JSON object"),
        ("missing.jsonl", '{"body": "x"}\n', {}, "no text in column 'text' (columns: body)"),
        ("noid.jsonl", '{"text": "x"}\n', {"id_column": "doc"}, "has no id 'doc'"),
        ("nocol.csv", "a,b\n1,2\n", {}, "has no column 'text'; its columns: a, b"),
        ("number.jsonl", '{"text": 5}\n', {}, "no text in column"),
    ],
)
def test_bad_rows_name_the_row_and_the_problem(
    tmp_path: Path, name: str, content: str, options: dict[str, str], fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(BadRequest) as err:
        list(InputSpec.of(path, **options).rows())
    assert fragment in err.value.message


def test_format_from_suffix_or_flag(tmp_path: Path) -> None:
    assert detect_format(Path("x.NDJSON")) == "jsonl"
    assert detect_format(Path("x.dat"), "csv") == "csv"
    with pytest.raises(BadRequest, match="--input-format"):
        detect_format(Path("x.dat"))
    with pytest.raises(BadRequest, match="must be one of"):
        detect_format(Path("x.csv"), "xml")
    with pytest.raises(BadRequest, match="is not a file"):
        InputSpec.of(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("name", "data", "fragment"),
    [
        ("u16.txt", "hello\nworld\n".encode("utf-16"), "is UTF-16 (it starts with a byte-order"),
        ("u16.csv", "text\nhello\n".encode("utf-16"), "iconv -f UTF-16 -t UTF-8"),
        ("u32.jsonl", '{"text": "a"}\n'.encode("utf-32"), "is UTF-32"),
        ("le.txt", "hello\nworld\n".encode("utf-16-le"), "holds NUL bytes"),
        ("latin1.txt", "ok\ncaf\xe9\n".encode("latin-1"), "row 1 of latin1.txt is not UTF-8"),
        ("latin1.csv", "text\ncaf\xe9\n".encode("latin-1"), "latin1.csv, near line"),
    ],
)
def test_text_that_is_not_utf8_is_one_line(
    tmp_path: Path, name: str, data: bytes, fragment: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(BadRequest) as err:
        list(InputSpec.of(path).rows())
    assert fragment in err.value.message and "\n" not in err.value.message


def test_ids_past_64_bits_are_refused_not_rounded(tmp_path: Path) -> None:
    """orjson reads an integer past 2^64 as a float (digits lost): refused at its row."""
    path = tmp_path / "big.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n{"id": 18446744073709551616, "text": "b"}\n')
    with pytest.raises(BadRequest, match="row 1 of big.jsonl: id 18446744073709551616 is too"):
        list(InputSpec.of(path, id_column="id").rows())


@pytest.mark.parametrize("name", ["long.txt", "long.jsonl", "long.csv"])
def test_a_row_past_the_bound_is_refused_before_it_is_read_whole(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line (or CSV field) over the bound is a one-line error naming it, not a read of
    the whole line into memory; the rows before it are read as usual."""
    from ember.jobs import inputs

    monkeypatch.setattr(inputs, "MAX_ROW_BYTES", 1000)
    long = "y" * 200_000  # over csv's own field bound (131,072 characters)
    rows = {
        "long.txt": f"short\n{long}\n",
        "long.jsonl": f'{{"text": "short"}}\n{{"text": "{long}"}}\n',
        "long.csv": f"text\nshort\n{long}\n",
    }
    path = tmp_path / name
    path.write_text(rows[name])
    spec = InputSpec.of(path)
    read = spec.rows()
    assert next(read)[1] == "short"
    with pytest.raises(BadRequest) as err:
        next(read)
    message = err.value.message
    assert f"of {name}" in message and ("1,000 bytes" in message or "field limit" in message)
