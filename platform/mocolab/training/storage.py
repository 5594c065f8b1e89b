"""Where runs keep their state: a local folder or any URI Ray Train can write (s3://, gs://, file://, ...).

A URI is never resolved as a local path: it goes to Ray Train as given, and
the files mocolab itself keeps beside a run's checkpoints (its manifest, the
local-mode checkpoints) are read and written through the same
pyarrow filesystem Ray uses. Credentials and endpoints travel the way pyarrow
takes them: the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...) or the
URI's query (``s3://bucket/runs?endpoint_override=host:9000&scheme=http``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from mocolab.config.addresses import check_url

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(location: str) -> bool:
    """``s3://b/x``, ``file:///x``: a URI; ``runs``, ``/data/runs``, ``C:\\runs``: a local path."""
    return bool(_SCHEME.match(location))


def shown(location: str) -> str:
    """The location without credentials or query (for output)."""
    if not is_uri(location):
        return location
    scheme, rest = location.split("://", 1)
    rest = rest.split("?", 1)[0]
    return f"{scheme}://{rest.rsplit('@', 1)[-1]}"


def _check_endpoints(location: str) -> None:
    """The endpoint a URI's query or the environment names, port included: pyarrow takes port 99999 as
    34463 (modulo 65536) and connects there, and a port that is not a number fails at the first request."""
    for endpoint in parse_qs(urlsplit(location).query).get("endpoint_override", []):
        check_url(endpoint if "://" in endpoint else f"http://{endpoint}", "run.output_dir",
                  f"{shown(location)}?endpoint_override={endpoint}")
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        if os.environ.get(var):
            check_url(os.environ[var], var)


class Location:
    """A folder on a local disk or behind a URI; paths below it are '/'-joined names."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.remote = is_uri(location)
        if self.remote:
            import pyarrow.fs

            _check_endpoints(location)

            try:
                self.fs, self.root = pyarrow.fs.FileSystem.from_uri(location)
            except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a bad URI
                raise ValueError(f"run.output_dir: {shown(location)} is not a storage URI pyarrow can open "
                                 f"({type(err).__name__}: {err})") from None
        else:
            self.root = str(Path(location).expanduser())

    def check(self, field: str = "run.output_dir") -> None:
        """Fail before any work when the storage does not answer (a clear error, not a traceback)."""
        if not self.remote:
            return
        try:
            self.fs.get_file_info(self.root)
        except OSError as err:
            raise ValueError(f"{field}: {self} does not answer ({err}); check the endpoint and the "
                             f"credentials (environment, or the URI's query)") from None

    def __str__(self) -> str:
        return shown(self.location)

    def child(self, *names: str) -> "Location":
        if not self.remote:
            return Location(str(Path(self.root, *names)))
        base, _, query = self.location.partition("?")
        return Location("/".join([base.rstrip("/"), *names]) + (f"?{query}" if query else ""))

    def _path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def exists(self, name: str) -> bool:
        if not self.remote:
            return Path(self.root, name).exists()
        import pyarrow.fs

        return self.fs.get_file_info(self._path(name)).type != pyarrow.fs.FileType.NotFound

    def read_text(self, name: str) -> str:
        if not self.remote:
            return Path(self.root, name).read_text()
        with self.fs.open_input_stream(self._path(name)) as fh:
            return fh.read().decode()

    def write_text(self, name: str, text: str) -> None:
        """Whole or not at all: a local file is renamed into place; an object store PUT is atomic."""
        if not self.remote:
            target = Path(self.root, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
            return
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(self._path(name)) as fh:
            fh.write(text.encode())

    def delete(self, name: str) -> None:
        """Remove the file ``name`` if it is there."""
        if not self.remote:
            Path(self.root, name).unlink(missing_ok=True)
            return
        try:
            self.fs.delete_file(self._path(name))
        except FileNotFoundError:
            pass

    def delete_dir(self, name: str) -> None:
        """Remove the folder ``name`` and everything in it, if it is there."""
        if not self.remote:
            shutil.rmtree(Path(self.root, name), ignore_errors=True)
            return
        if self.exists(name):
            self.fs.delete_dir(self._path(name))

    def put_dir(self, local_dir: str | Path, name: str) -> None:
        """Copy a local folder's files to ``name`` here (a local-mode checkpoint)."""
        if not self.remote:
            target = Path(self.root, name)
            target.mkdir(parents=True, exist_ok=True)
            for f in Path(local_dir).iterdir():
                shutil.copy2(f, target / f.name)
            return
        import pyarrow.fs

        self.fs.create_dir(self._path(name), recursive=True)
        pyarrow.fs.copy_files(str(local_dir), self._path(name), destination_filesystem=self.fs)

    def put_file(self, local_file: str | Path, name: str) -> None:
        if not self.remote:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            shutil.copy2(local_file, Path(self.root, name))
            return
        self.fs.create_dir(self.root, recursive=True)
        with open(local_file, "rb") as src, self.fs.open_output_stream(self._path(name)) as dst:
            shutil.copyfileobj(src, dst)

    def get_dir(self, name: str, local_dir: str | Path) -> bool:
        """Copy ``name`` here to a local folder; False when there is nothing."""
        if not self.exists(name):
            return False
        if not self.remote:
            shutil.copytree(Path(self.root, name), local_dir, dirs_exist_ok=True)
            return True
        import pyarrow.fs

        pyarrow.fs.copy_files(self._path(name), str(local_dir), source_filesystem=self.fs)
        return True

    def children(self) -> list[str]:
        """Names directly below this location ([] when it does not exist)."""
        if not self.remote:
            root = Path(self.root)
            return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        import pyarrow.fs

        try:
            infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self.root, allow_not_found=True))
        except OSError:
            return []
        return sorted(i.base_name for i in infos)

    def lock_folder(self) -> Path:
        """Where the run's NameLock lives: the run's own folder, or (for a URI, where no lock file can
        be held) a folder on this machine named by the URI: it guards one machine, not a cluster."""
        if not self.remote:
            return Path(self.root)
        digest = hashlib.sha256(shown(self.location).encode()).hexdigest()[:16]
        return Path(os.environ.get("MOCOLAB_LOCKS", Path(tempfile.gettempdir()) / "mocolab-locks")) / digest
