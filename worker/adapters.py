"""Adapter versions on the worker's disk: download by URL, verify sha256, size-bounded LRU.

Keyed by (run id, version). Version 0 is the base model: no files, `ensure` returns None. A
version is downloaded into a temporary folder, every file checked against its sha256, the whole
version checked against the lease's version sha256 (its weights file's sha256,
protocol/adapters.py), and only then renamed into place; a folder in the cache is therefore
always complete. When the cache exceeds its byte bound, the least recently used versions are
deleted (never the one just asked for, nor one a held lease uses: `in_use`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from protocol.adapters import AdapterFile as ManifestFile
from protocol.adapters import AdapterManifest, AdapterMismatch, manifest_of
from protocol.schemas import AdapterRef
from protocol.transfer import download_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterHandle:
    """A verified adapter version on disk."""

    run_id: str
    version: int
    sha256: str
    path: Path

    @property
    def key(self) -> tuple[str, int]:
        return (self.run_id, self.version)


def names_version(manifest: AdapterManifest, sha256: str) -> bool:
    """Whether a version sha256 names these files (protocol/adapters.py: the weights file's
    sha256). Each file is verified against its own sha256 as well."""
    try:
        return manifest.version_sha256() == sha256
    except AdapterMismatch:
        return False


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


class AdapterCache:
    """Downloaded adapter versions under `root/{run_id}/v{version:06d}`, LRU by byte size."""

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        *,
        http: httpx.Client | None = None,
        in_use: Callable[[], set[tuple[str, int]]] | None = None,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.http = http
        # The versions held leases generate with: never evicted (a multi-turn rollout may
        # reload its version from its folder between two turns), even above the byte bound.
        self.in_use = in_use or set
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], tuple[Path, int]] = OrderedDict()
        self.downloads = 0
        self._scan()

    def _folder(self, run_id: str, version: int) -> Path:
        return self.root / run_id / f"v{version:06d}"

    def _scan(self) -> None:
        """Adopt folders left by an earlier process, oldest first (mtime order)."""
        if not self.root.is_dir():
            return
        found = []
        for run_dir in self.root.iterdir():
            if not run_dir.is_dir():
                continue
            for vdir in run_dir.iterdir():
                if vdir.is_dir() and vdir.name.startswith("v") and vdir.name[1:].isdigit():
                    found.append((vdir.stat().st_mtime, run_dir.name, int(vdir.name[1:]), vdir))
        for _mtime, run_id, version, vdir in sorted(found):
            self._entries[(run_id, version)] = (vdir, _folder_bytes(vdir))

    @property
    def total_bytes(self) -> int:
        return sum(size for _path, size in self._entries.values())

    def keys(self) -> list[tuple[str, int]]:
        """Cached (run, version) keys, least recently used first."""
        return list(self._entries)

    def ensure(self, run_id: str, version: int, ref: AdapterRef | None) -> AdapterHandle | None:
        """The verified local folder of this version (downloading it if needed); None for 0."""
        if version == 0:
            return None
        if ref is None or ref.version != version:
            raise AdapterMismatch("adapter", f"the lease names version {version} without files")
        key = (run_id, version)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._matches(entry[0], ref.sha256):
                self._entries.move_to_end(key)
                return AdapterHandle(run_id, version, ref.sha256, entry[0])
            if entry is not None:  # damaged or different content: fetch again
                self._drop(key)
            path = self._download(run_id, version, ref)
            self._entries[key] = (path, _folder_bytes(path))
            self._evict(keep=key)
            return AdapterHandle(run_id, version, ref.sha256, path)

    @staticmethod
    def _matches(folder: Path, sha256: str) -> bool:
        try:
            return names_version(manifest_of(folder), sha256)
        except (AdapterMismatch, OSError):
            return False

    def _download(self, run_id: str, version: int, ref: AdapterRef) -> Path:
        dest = self._folder(run_id, version)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
        started = time.monotonic()
        try:
            entries = []
            for f in ref.files:
                if "/" in f.name or f.name.startswith(".") or not f.name:
                    raise AdapterMismatch(f.name, "not a plain file name")
                size = download_url(f.url, tmp / f.name, f.sha256, http=self.http)
                entries.append(ManifestFile(f.name, f.sha256, size))
            manifest = AdapterManifest(tuple(sorted(entries, key=lambda e: e.name)))
            if not names_version(manifest, ref.sha256):
                raise AdapterMismatch(
                    "manifest",
                    f"version sha256 {ref.sha256} is not the sha256 of these weights",
                )
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.downloads += 1
        log.info(
            "adapter run=%s v%d downloaded in %.2fs", run_id, version, time.monotonic() - started
        )
        return dest

    def _drop(self, key: tuple[str, int]) -> None:
        path, _size = self._entries.pop(key)
        shutil.rmtree(path, ignore_errors=True)

    def _evict(self, keep: tuple[str, int]) -> None:
        pinned = {keep, *self.in_use()}
        while self.total_bytes > self.max_bytes:
            oldest = next((k for k in self._entries if k not in pinned), None)
            if oldest is None:
                log.warning(
                    "adapter cache above its bound (%d > %d bytes): every version is in use",
                    self.total_bytes,
                    self.max_bytes,
                )
                return
            log.info("adapter cache full: evicting run=%s v%d", *oldest)
            self._drop(oldest)
