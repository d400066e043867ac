"""Where a job's dataset lives: a local directory, or an object store through ``pyarrow.fs``.

A local directory publishes by rename (write a temporary file, fsync, rename, fsync the
directory), so a kill at any instant leaves whole files only. An object store (``s3://``,
``gs://``, anything ``pyarrow.fs`` opens) has no rename, but a single PUT is atomic: an
object is there whole or not at all, so it is written at its final name in one request and
an append is a rewrite (only the small dead-letter file is appended to). Ray workers and the
driver each open the same store from its URI, so nothing but the URI crosses the wire.

Credentials and endpoints are the filesystem's own (``AWS_*`` variables, instance roles,
``gcloud`` credentials): Ember reads none of them.
"""

from __future__ import annotations

import io
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.errors import BadRequest

TEMP_SUFFIX = ".tmp"
SCHEMES = ("s3://", "gs://", "gcs://", "hdfs://", "abfs://", "abfss://", "file://")


def is_uri(target: str | Path) -> bool:
    """An object-store URI (kept a string: ``Path`` would fold ``s3://b`` into ``s3:/b``)."""
    return isinstance(target, str) and target.startswith(SCHEMES) and not target.startswith("file")


def _sync_dir(directory: Path) -> None:
    """Make a rename durable (the directory entry), where the OS allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Publish ``data`` at ``path`` by rename: a reader sees the old file or the new one."""
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: give back what the attempt took
        raise
    _sync_dir(path.parent)


class _Raw(io.RawIOBase):
    """A pyarrow random-access file as Python's raw binary file."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._native.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._native.seek(offset, whence)

    def tell(self) -> int:
        return self._native.tell()

    def close(self) -> None:
        self._native.close()
        super().close()


@dataclass(frozen=True)
class Store:
    """One directory (``root``) of one filesystem; ``uri`` is how the user named it."""

    uri: str
    root: str
    fs: Any = field(default=None, compare=False, repr=False)  # pyarrow FileSystem; None: local

    @classmethod
    def of(cls, target: str | Path) -> Store:
        """The store a ``--output`` (or input) names: a local path, or a URI ``pyarrow.fs``
        opens (``s3://bucket/prefix``)."""
        if isinstance(target, Store):
            return target
        if not is_uri(target):
            text = str(target)
            path = Path(text[len("file://") :] if text.startswith("file://") else text)
            return cls(str(path), str(path))
        from pyarrow import fs as pafs

        try:
            filesystem, root = pafs.FileSystem.from_uri(str(target))
        except (ValueError, OSError) as exc:  # pyarrow.lib.ArrowInvalid is a ValueError
            raise BadRequest(f"cannot open {target}: {exc}") from None
        return cls(str(target).rstrip("/"), root.rstrip("/"), filesystem)

    @property
    def local(self) -> bool:
        return self.fs is None

    @property
    def dir(self) -> Path:
        """The local directory (only a local store has one)."""
        assert self.local, "an object store has no local directory"
        return Path(self.root)

    def __str__(self) -> str:
        return self.uri

    def path(self, name: str) -> str:
        """``name``'s path within the filesystem."""
        return str(Path(self.root) / name) if self.local else posixpath.join(self.root, name)

    def child(self, name: str) -> Store:
        """The store of the directory ``name`` inside this one."""
        return Store(posixpath.join(self.uri, name), self.path(name), self.fs)

    def display(self, name: str) -> str:
        """``name`` as a user would find it (for messages)."""
        return self.path(name) if self.local else f"{self.uri}/{name}"

    # ---- reading ------------------------------------------------------------------------
    def exists(self, name: str) -> bool:
        if self.local:
            return Path(self.path(name)).is_file()
        from pyarrow import fs as pafs

        return self.fs.get_file_info(self.path(name)).type == pafs.FileType.File

    def read_bytes(self, name: str) -> bytes:
        if self.local:
            return Path(self.path(name)).read_bytes()
        with self.fs.open_input_stream(self.path(name)) as fh:
            return fh.read()

    def open_input(self, name: str | None = None) -> Any:
        """A seekable binary file (``name`` None: the store's root is itself a file)."""
        where = self.root if name is None else self.path(name)
        if self.local:
            return open(where, "rb")  # noqa: SIM115 - the caller closes it
        # pyarrow's files cannot readline: buffered by Python, they read lines as a local one
        return io.BufferedReader(_Raw(self.fs.open_input_file(where)), 1 << 20)

    def names(self) -> list[str]:
        """The files directly in the store's directory."""
        if self.local:
            directory = Path(self.root)
            if not directory.is_dir():
                return []
            return sorted(p.name for p in directory.iterdir() if p.is_file())
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(self.root, allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)

    def read_schema(self, name: str) -> Any:
        import pyarrow.parquet as pq

        if self.local:
            return pq.read_schema(self.path(name))
        return pq.read_schema(self.path(name), filesystem=self.fs)

    # ---- writing ------------------------------------------------------------------------
    def make(self) -> None:
        """Create the directory (an object store's prefixes need none)."""
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        else:
            self.fs.create_dir(self.root, recursive=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Publish ``data`` as ``name`` whole: a rename locally, one PUT in an object store."""
        if self.local:
            atomic_write(Path(self.path(name)), data)
            return
        with self.fs.open_output_stream(self.path(name)) as fh:
            fh.write(data)

    def append_bytes(self, name: str, data: bytes) -> None:
        """Append and flush to disk (an object store: the object rewritten with ``data``)."""
        if self.local:
            with open(self.path(name), "ab") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            return
        old = self.read_bytes(name) if self.exists(name) else b""
        self.write_bytes(name, old + data)

    def write_table(self, name: str, table: Any) -> None:
        """``table`` as the Parquet file ``name``, published whole."""
        import pyarrow.parquet as pq

        if self.local:
            path = Path(self.path(name))
            tmp = path.with_name(path.name + TEMP_SUFFIX)
            try:
                pq.write_table(table, tmp)
                with tmp.open("rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except OSError:
                tmp.unlink(missing_ok=True)
                raise
            _sync_dir(path.parent)
            return
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        self.write_bytes(name, buffer.getvalue())

    def move(self, src: str, dst: str) -> None:
        """Give the file ``src`` the name ``dst`` (an object store: a server-side copy, then
        the source deleted, so a kill between leaves a copy, never nothing)."""
        if self.local:
            os.replace(self.path(src), self.path(dst))
            _sync_dir(Path(self.path(dst)).parent)
            return
        self.fs.copy_file(self.path(src), self.path(dst))
        self.fs.delete_file(self.path(src))

    def delete(self, name: str) -> None:
        if self.local:
            Path(self.path(name)).unlink(missing_ok=True)
            return
        from pyarrow import fs as pafs

        if self.fs.get_file_info(self.path(name)).type != pafs.FileType.NotFound:
            self.fs.delete_file(self.path(name))

    def delete_dir(self, name: str) -> None:
        """Remove the directory ``name`` and all it holds, if it is there."""
        if self.local:
            import shutil

            shutil.rmtree(self.path(name), ignore_errors=True)
            return
        from pyarrow import fs as pafs

        if self.fs.get_file_info(self.path(name)).type != pafs.FileType.NotFound:
            self.fs.delete_dir(self.path(name))
