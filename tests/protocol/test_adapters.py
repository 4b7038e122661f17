"""protocol.adapters: manifests of adapter version folders and their verification."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from protocol.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterFile,
    AdapterManifest,
    AdapterMismatch,
    manifest_of,
    verify_folder,
)


def _version(folder: Path) -> Path:
    folder.mkdir()
    (folder / ADAPTER_WEIGHTS).write_bytes(bytes(range(256)) * 40)
    (folder / ADAPTER_CONFIG).write_text('{"r": 4, "peft_type": "LORA"}')
    return folder


def test_manifest_lists_each_file_with_sha256_and_size(tmp_path: Path) -> None:
    folder = _version(tmp_path / "v000001")
    manifest = manifest_of(folder)
    assert [f.name for f in manifest.files] == sorted([ADAPTER_CONFIG, ADAPTER_WEIGHTS])
    for f in manifest.files:
        raw = (folder / f.name).read_bytes()
        assert f.sha256 == hashlib.sha256(raw).hexdigest()
        assert f.bytes == len(raw)
    verify_folder(folder, manifest)


def test_json_round_trip_and_version_sha256(tmp_path: Path) -> None:
    folder = _version(tmp_path / "v")
    manifest = manifest_of(folder)
    again = AdapterManifest.from_json(manifest.to_json())
    assert again == manifest
    weights_sha = hashlib.sha256((folder / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    assert again.version_sha256() == weights_sha
    no_weights = AdapterManifest(tuple(f for f in manifest.files if f.name != ADAPTER_WEIGHTS))
    with pytest.raises(AdapterMismatch):
        no_weights.version_sha256()


def test_missing_required_file(tmp_path: Path) -> None:
    folder = _version(tmp_path / "v")
    (folder / ADAPTER_CONFIG).unlink()
    with pytest.raises(AdapterMismatch) as info:
        manifest_of(folder)
    assert info.value.file == ADAPTER_CONFIG


def test_verify_detects_changed_content_size_and_absence(tmp_path: Path) -> None:
    folder = _version(tmp_path / "v")
    manifest = manifest_of(folder)
    weights = folder / ADAPTER_WEIGHTS
    raw = bytearray(weights.read_bytes())
    raw[10] ^= 0xFF  # same size, other content
    weights.write_bytes(bytes(raw))
    with pytest.raises(AdapterMismatch, match="sha256"):
        verify_folder(folder, manifest)
    weights.write_bytes(bytes(raw) + b"x")
    with pytest.raises(AdapterMismatch, match="size"):
        verify_folder(folder, manifest)
    weights.unlink()
    with pytest.raises(AdapterMismatch, match="missing"):
        verify_folder(folder, manifest)


def test_verify_refuses_path_names_in_a_manifest(tmp_path: Path) -> None:
    folder = _version(tmp_path / "v")
    manifest = manifest_of(folder)
    hostile = AdapterManifest((*manifest.files, AdapterFile("../secret", "0" * 64, 1)))
    with pytest.raises(AdapterMismatch, match="plain file name"):
        verify_folder(folder, hostile)


def test_manifest_must_list_both_peft_files(tmp_path: Path) -> None:
    folder = _version(tmp_path / "v")
    manifest = manifest_of(folder)
    partial = AdapterManifest(tuple(f for f in manifest.files if f.name == ADAPTER_WEIGHTS))
    with pytest.raises(AdapterMismatch, match="not listed"):
        verify_folder(folder, partial)
