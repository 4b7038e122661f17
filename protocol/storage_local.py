"""Local-folder object store with HMAC-signed, expiring URLs served by the control plane.

Objects are files under `root`; a put writes a temp file in `root/.asyncgrpo-tmp/` and moves it
into place atomically: `os.replace` to overwrite, `os.link` (fails if the name exists) for a
no-overwrite put, so two concurrent conditional puts cannot both win.

URLs look like `{base_url}/{key}?exp=…&len=…&sha256=…&nx=1&sig=…`; the signature is
HMAC-SHA256 (key derived from the server's secret) over the method, key, expiry, length, sha256
and no-overwrite flag. `verify()` checks one in constant time; server/blobs serves them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

from protocol.storage import (
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PresignedPut,
    StoreError,
    sha256_file,
    validate_key,
    validate_prefix,
    validate_sha256_hex,
)

TMP_DIR = ".asyncgrpo-tmp"
_SIG_CONTEXT = b"asyncgrpo/blob-url/v1"


class URLRefused(StoreError):
    """A signed blob URL that does not hold: bad or missing signature, expired, other key."""


# A temp file untouched this long belongs to a PUT that will never finish (a live upload writes
# to it continuously; an upload URL lives url_ttl_s, 15 minutes by default).
STALE_TEMP_S = 3600.0


@dataclass(frozen=True)
class SignedRequest:
    """What a verified URL allows: one method on one key, until `expires_at` (unix seconds);
    for PUT exactly `size` bytes with digest `sha256_hex`, and no overwrite if asked."""

    method: str
    key: str
    expires_at: int
    size: int | None = None
    sha256_hex: str | None = None
    if_none_match: bool = False


class LocalStore(ObjectStore):
    def __init__(
        self,
        root: str | Path,
        base_url: str,
        secret_key: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root).resolve()
        self.base_url = base_url.rstrip("/")
        self._mac_key = hmac.new(secret_key.encode(), _SIG_CONTEXT, hashlib.sha256).digest()
        self._clock = clock
        self._tmp = self.root / TMP_DIR

    # -- the bucket: its root folder ----------------------------------------------------------

    def bucket_exists(self) -> bool:
        return self.root.is_dir()

    def create_bucket(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder {self.root}: {exc}") from exc

    # -- paths and atomic commit -------------------------------------------------------------

    def path_for(self, key: str) -> Path:
        validate_key(key)
        if key.split("/", 1)[0] == TMP_DIR:
            raise InvalidKey(f"object key must not start with the reserved folder {TMP_DIR!r}")
        return self.root.joinpath(*key.split("/"))

    def new_temp(self) -> Path:
        """An empty temp file on the same filesystem as the objects (for commit_temp)."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="put-")
        os.close(fd)
        return Path(name)

    def commit_temp(self, tmp: Path, key: str, *, if_none_match: bool = False) -> ObjectInfo:
        """Move a finished temp file to `key`; the temp file is gone afterwards either way."""
        dest = self.path_for(key)
        try:
            size = tmp.stat().st_size
            for _attempt in range(5):  # a concurrent delete may prune the parent folder
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if if_none_match:
                        self._link_exclusive(tmp, dest)
                    else:
                        os.replace(tmp, dest)
                    return ObjectInfo(key=key, size=size)
                except FileNotFoundError:
                    continue
            raise StoreError(f"could not create the folder for {key!r}")
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _link_exclusive(tmp: Path, dest: Path) -> None:
        try:
            os.link(tmp, dest)
        except FileExistsError:
            raise ObjectExists(str(dest.name)) from None
        except FileNotFoundError:
            raise
        except OSError:  # a filesystem without hard links: claim the name first
            try:
                fd = os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise ObjectExists(str(dest.name)) from None
            os.close(fd)
            os.replace(tmp, dest)

    # -- ObjectStore ---------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes, *, if_none_match: bool = False) -> ObjectInfo:
        self.path_for(key)
        tmp = self.new_temp()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return self.commit_temp(tmp, key, if_none_match=if_none_match)

    def put_file(self, key: str, path: Path, *, if_none_match: bool = False) -> ObjectInfo:
        self.path_for(key)
        tmp = self.new_temp()
        try:
            shutil.copyfile(path, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return self.commit_temp(tmp, key, if_none_match=if_none_match)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.path_for(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key) from None

    def download_file(self, key: str, path: Path) -> None:
        src = self.path_for(key)
        if not src.is_file():
            raise ObjectNotFound(key)
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        shutil.copyfile(src, tmp)
        os.replace(tmp, path)

    def head(self, key: str) -> ObjectInfo | None:
        path = self.path_for(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(key=key, size=st.st_size) if path.is_file() else None

    def sha256(self, key: str) -> str | None:
        path = self.path_for(key)
        try:
            return sha256_file(path) if path.is_file() else None
        except FileNotFoundError:
            return None

    def sweep_stale_temps(self, older_than_s: float) -> int:
        """Delete temp files of PUTs that never finished (a crash mid-upload); a live upload
        keeps its file's mtime fresh, so only files untouched for `older_than_s` go."""
        if not self._tmp.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for entry in self._tmp.iterdir():
            try:
                if entry.is_file() and entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # finished or swept by another process meanwhile
        return removed

    def delete(self, key: str) -> None:
        path = self.path_for(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return
        parent = path.parent
        while parent != self.root:  # prune folders left empty
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, prefix: str) -> list[str]:
        validate_prefix(prefix)
        folder, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*folder.split("/")) if folder else self.root
        return sorted(k for k in self._walk(start) if k.startswith(prefix))

    def _walk(self, start: Path) -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(start):
            if Path(dirpath) == self.root and TMP_DIR in dirnames:
                dirnames.remove(TMP_DIR)
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                yield name if rel == "." else f"{rel}/{name}"

    def presign_get(self, key: str, ttl_s: int) -> str:
        self.path_for(key)
        return self._url(SignedRequest("GET", key, self._expiry(ttl_s)))

    def presign_put(
        self, key: str, *, size: int, sha256_hex: str, ttl_s: int, if_none_match: bool = False
    ) -> PresignedPut:
        self.path_for(key)
        validate_sha256_hex(sha256_hex)
        if size < 0:
            raise ValueError("size must be >= 0")
        req = SignedRequest("PUT", key, self._expiry(ttl_s), size, sha256_hex, if_none_match)
        headers = {"Content-Length": str(size)}
        if if_none_match:
            headers["If-None-Match"] = "*"
        return PresignedPut(url=self._url(req), headers=headers, expires_in_s=ttl_s)

    # -- signing -------------------------------------------------------------------------------

    def _expiry(self, ttl_s: int) -> int:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        return int(self._clock()) + int(ttl_s)

    def _signature(self, req: SignedRequest) -> str:
        message = "\n".join(
            [
                req.method,
                req.key,
                str(req.expires_at),
                "" if req.size is None else str(req.size),
                req.sha256_hex or "",
                "1" if req.if_none_match else "0",
            ]
        )
        return hmac.new(self._mac_key, message.encode("utf-8"), hashlib.sha256).hexdigest()

    def _url(self, req: SignedRequest) -> str:
        params: dict[str, str] = {"exp": str(req.expires_at)}
        if req.method == "PUT":
            params |= {
                "len": str(req.size),
                "sha256": req.sha256_hex or "",
                "nx": "1" if req.if_none_match else "0",
            }
        params["sig"] = self._signature(req)
        return f"{self.base_url}/{quote(req.key, safe='/')}?{urlencode(params)}"

    def verify(self, method: str, key: str, params: Mapping[str, str]) -> SignedRequest:
        """The request a URL's query signs, or URLRefused (constant-time signature check)."""
        try:
            self.path_for(key)
            req = SignedRequest(
                method=method,
                key=key,
                expires_at=int(params["exp"]),
                size=int(params["len"]) if method == "PUT" else None,
                sha256_hex=validate_sha256_hex(params["sha256"]) if method == "PUT" else None,
                if_none_match=method == "PUT" and params["nx"] == "1",
            )
            sig = params["sig"]
        except (KeyError, ValueError) as exc:
            raise URLRefused(f"malformed or incomplete signed URL: {exc}") from None
        if not hmac.compare_digest(sig.encode(), self._signature(req).encode()):
            raise URLRefused("signature does not match this method, key and conditions")
        if self._clock() >= req.expires_at:
            raise URLRefused("signed URL expired")
        return req
