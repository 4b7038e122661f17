"""Adapter version files: the list of files with sha256 and size, and verification of a folder.

Pure (no torch). An adapter version is a PEFT folder: `adapter_model.safetensors` and
`adapter_config.json` (loadable by `PeftModel.from_pretrained` and vLLM's `LoRARequest`). Its
manifest lists each file's sha256 and byte count. The version's own sha256 is the sha256 of its
weights file (the content address of the adapter): one hex string stored on AdapterVersion and
carried by leases and batch metadata. Readers check every file against its own sha256 too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.storage import sha256_file

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
REQUIRED_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)


class AdapterMismatch(Exception):
    """A folder does not match its adapter manifest."""

    def __init__(self, file: str, detail: str) -> None:
        super().__init__(f"{file}: {detail}")
        self.file = file
        self.detail = detail


@dataclass(frozen=True)
class AdapterFile:
    name: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class AdapterManifest:
    """The files of one adapter version, sorted by name."""

    files: tuple[AdapterFile, ...]

    def version_sha256(self) -> str:
        """The version's sha256: that of its weights file."""
        for f in self.files:
            if f.name == ADAPTER_WEIGHTS:
                return f.sha256
        raise AdapterMismatch(ADAPTER_WEIGHTS, "missing from the manifest")

    def to_json(self) -> dict[str, dict[str, str | int]]:
        """{file name: {"sha256": ..., "bytes": ...}} (the shape stored on AdapterVersion)."""
        return {f.name: {"sha256": f.sha256, "bytes": f.bytes} for f in self.files}

    @classmethod
    def from_json(cls, data: dict[str, dict[str, str | int]]) -> AdapterManifest:
        files = tuple(
            AdapterFile(name, str(meta["sha256"]), int(meta["bytes"]))
            for name, meta in sorted(data.items())
        )
        return cls(files)


def _check_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        raise AdapterMismatch(name, "not a plain file name")


def manifest_of(folder: Path) -> AdapterManifest:
    """Hash every regular file directly in `folder` (an adapter version needs both PEFT files)."""
    files = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            files.append(AdapterFile(path.name, sha256_file(path), path.stat().st_size))
    names = {f.name for f in files}
    for required in REQUIRED_FILES:
        if required not in names:
            raise AdapterMismatch(required, "missing from the adapter folder")
    return AdapterManifest(tuple(files))


def verify_folder(folder: Path, manifest: AdapterManifest) -> None:
    """Raise AdapterMismatch unless every listed file exists with its size and sha256."""
    names = {f.name for f in manifest.files}
    for required in REQUIRED_FILES:
        if required not in names:
            raise AdapterMismatch(required, "not listed in the manifest")
    for entry in manifest.files:
        _check_name(entry.name)
        path = folder / entry.name
        if not path.is_file():
            raise AdapterMismatch(entry.name, "missing")
        size = path.stat().st_size
        if size != entry.bytes:
            raise AdapterMismatch(entry.name, f"size {size} != {entry.bytes}")
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise AdapterMismatch(entry.name, f"sha256 {actual} != {entry.sha256}")
