"""The reproduction's MLflow store as git keeps it: packed with xz, expanded on first use into an ignored file.

The sqlite store is about fourteen times the size of its xz form, and a checkout has to travel (to a GPU
machine that takes a bounded working tree, to every clone). So ``results/runs.db.xz`` is committed and
``results/runs.db``, what MLflow reads and writes, is expanded from it when missing or when the packed file
changed (a pull); ``mocolab repro`` packs it again after new runs, ``mocolab repro --pack`` alone.

A small state file beside the store (``runs.db.unpacked``, ignored too) records the packed file's hash and
the store's as expanded or packed: it tells a store that only mirrors an older packed file (expanded again)
from one that holds runs the packed file lacks (kept; and refused, never overwritten, when the packed
file changed under it too).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

PACKED_SUFFIX = ".xz"
STATE_SUFFIX = ".unpacked"
PRESET = 6  # xz's default: within 4 % of preset 9 on this store, at a quarter of its memory (190 MB)
CHUNK = 1 << 20
PACK_COMMAND = "mocolab repro --pack"


def packed_path(store: Path) -> Path:
    return store.with_name(store.name + PACKED_SUFFIX)


def state_path(store: Path) -> Path:
    return store.with_name(store.name + STATE_SUFFIX)


def _sha256(read: Callable[[int], bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return _sha256(f.read)


def _packed_content_sha256(packed: Path) -> str:
    """The hash of what ``packed`` expands to, without writing it."""
    try:
        with lzma.open(packed, "rb") as f:
            return _sha256(f.read)
    except (lzma.LZMAError, EOFError) as err:
        raise _damaged(packed, err) from None


def _damaged(packed: Path, err: Exception) -> ValueError:
    return ValueError(f"{packed}: not an xz file of the MLflow store ({type(err).__name__}: {err}); restore it "
                      f"with `git checkout -- {packed}`")


def _read_state(store: Path) -> dict | None:
    try:
        state = json.loads(state_path(store).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _write_state(store: Path, packed_sha: str, store_sha: str) -> None:
    stat = store.stat()
    _replace_with(state_path(store), lambda f: f.write(json.dumps(
        {"packed_sha256": packed_sha, "store_sha256": store_sha, "store_size": stat.st_size,
         "store_mtime_ns": stat.st_mtime_ns}).encode()))


def _replace_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``path`` written whole or not at all: a reader (another test process, MLflow) never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would keep the file from the user's group
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _store_sha256(store: Path, state: dict | None) -> str:
    """The store's hash, read from the state where the file's size and mtime are the ones recorded there."""
    stat = store.stat()
    if state and state.get("store_size") == stat.st_size and state.get("store_mtime_ns") == stat.st_mtime_ns:
        return str(state.get("store_sha256"))
    return file_sha256(store)


def _expand(packed: Path, store: Path) -> str:
    """``store`` := what ``packed`` holds; the store's hash."""
    digest = hashlib.sha256()

    def write(out: BinaryIO) -> None:
        try:
            with lzma.open(packed, "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except (lzma.LZMAError, EOFError) as err:
            raise _damaged(packed, err) from None

    _replace_with(store, write)
    return digest.hexdigest()


def unpack(store: Path) -> bool:
    """Expand ``store``'s packed file into it where the store is missing or mirrors an older packed file;
    True when it did. No packed file beside the store: nothing to do (a store that is not committed packed).

    A store that holds runs its packed file lacks is kept; if the packed file changed since it was expanded
    as well, both hold runs the other lacks and neither is overwritten: a ValueError names them.
    """
    packed = packed_path(store)
    if not packed.is_file():
        return False
    packed_sha = file_sha256(packed)
    state = _read_state(store)
    if not store.exists():
        _write_state(store, packed_sha, _expand(packed, store))
        return True
    if state and state.get("packed_sha256") == packed_sha:
        return False  # the store is this packed file's, with or without runs added since
    store_sha = _store_sha256(store, state)
    if state and state.get("store_sha256") == store_sha:  # unchanged since an older packed file: take the new one
        _write_state(store, packed_sha, _expand(packed, store))
        return True
    if _packed_content_sha256(packed) == store_sha:  # the same content, expanded with no state recorded
        _write_state(store, packed_sha, store_sha)
        return False
    since = ("holds runs written since it was expanded, and the packed file changed since too (a pull?)" if state
             else "differs from the packed file and no record says which came from which")
    raise ValueError(f"{store}: {since}; neither is overwritten. Keep the store's runs: `{PACK_COMMAND}` packs it "
                     f"into {packed} (the runs only {packed} holds are then not in it); take the packed file's: "
                     f"move {store} away, and the next command expands {packed}")


def pack(store: Path) -> bool:
    """Write ``store`` into its packed file where the two differ; True when it did (the packed file to commit).

    It is the user's word on which store to keep, so it packs whatever the store holds.
    """
    if not store.is_file():
        raise ValueError(f"{store}: no MLflow store there to pack")
    packed = packed_path(store)
    state = _read_state(store)
    store_sha = _store_sha256(store, state)
    if packed.is_file() and state and state.get("store_sha256") == store_sha \
            and state.get("packed_sha256") == file_sha256(packed):
        return False

    def write(out: BinaryIO) -> None:
        with store.open("rb") as src, lzma.open(out, "wb", preset=PRESET) as dst:
            shutil.copyfileobj(src, dst, CHUNK)

    _replace_with(packed, write)
    _write_state(store, file_sha256(packed), store_sha)
    return True
