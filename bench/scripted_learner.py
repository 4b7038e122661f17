"""A scripted learner for benchmarks: attaches with the learner token, claims whatever batches are
ready and publishes version N+1 through the real learner calls (request_uploads → presigned
PUTs → publish_adapter, consuming the claimed batches) with a real PEFT LoRA adapter, so that no
training time hides in a benchmark's figures."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient
from protocol.storage import PresignedPut, sha256_file
from protocol.transfer import upload_presigned

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# -- adapters of a given size ----------------------------------------------------------------------


def build_templates(sizes_mb: list[int], out: Path) -> dict[int, Path]:
    """One real PEFT adapter folder per size (rank chosen for the size), via lm/adapter_io.py."""
    from peft import LoraConfig, get_peft_model

    from lm.adapter_io import save_adapter_version
    from lm.models import load_model

    base: Any = load_model(common.MODEL)
    per_rank = 4 * sum(  # fp32 bytes of one rank: A (r × in) + B (out × r) per wrapped Linear
        m.in_features + m.out_features
        for name, m in base.named_modules()
        if name.rsplit(".", 1)[-1] in ALL_LINEAR
    )
    folders = {}
    for size in sizes_mb:
        rank = max(1, round(size * common.MB / per_rank))
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                            target_modules=ALL_LINEAR, init_lora_weights="gaussian")  # fmt: skip
        model = get_peft_model(base, config)
        folders[size] = out / f"template-{size}mb"
        save_adapter_version(model, folders[size])
        base = model.unload()
    return folders


def version_folder(template: Path, version: int, out: Path) -> Path:
    """The template with new weights (scaled by the version), as a learner's publish would."""
    from safetensors.torch import load_file, save_file

    folder = out / f"v{version:06d}"
    folder.mkdir(parents=True)
    tensors = load_file(str(template / "adapter_model.safetensors"))
    scale = 1.0 + 1e-3 * version
    save_file({k: v * scale for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    shutil.copyfile(template / "adapter_config.json", folder / "adapter_config.json")
    return folder


@dataclass
class Published:
    version: int
    size_mb: int
    bytes: int
    t_start: float  # epoch seconds: uploads begin
    t_ack: float  # publish_adapter answered
    upload_s: float


class Publisher:
    """Attach as the run's learner; publish versions through the real learner calls."""

    def __init__(self, url: str, run_id: str, token: str, work: Path) -> None:
        from learner.loop import Heartbeat
        from lm.chat import tokenizer_fingerprint
        from lm.models import load_tokenizer

        self.client = AsyncGrpoClient(url, token)
        self.run_id, self.work = run_id, work
        fingerprint = tokenizer_fingerprint(load_tokenizer(common.MODEL))
        attach = self.client.learner_attach(run_id, fingerprint, name="bench-publisher")
        self.fencing, self.version = attach.fencing, attach.current_version
        self.heartbeat = Heartbeat(
            AsyncGrpoClient(url, token), run_id, self.fencing, attach.heartbeat_interval_s
        )
        self.heartbeat.start()
        self.claimed: list[Any] = []

    def claim(self) -> None:
        answer = self.client.claim_batches(self.run_id, self.fencing, 1000, wait_s=0.0)
        self.claimed += [b.batch_id for b in answer.batches]

    def publish(self, folder: Path, size_mb: int) -> Published:
        version = self.version + 1
        # the resume checkpoint a publish requires: here only the step (a real learner also
        # uploads optimizer state, about twice the adapter, before publishing)
        checkpoint = folder.parent / f"{folder.name}-checkpoint"
        checkpoint.mkdir()
        (checkpoint / "state.json").write_text(f'{{"step": {version}}}')
        paths = [(p, "adapter") for p in sorted(folder.iterdir())]
        paths.append((checkpoint / "state.json", "checkpoint"))
        files = [
            sl.UploadFile(name=p.name, size=p.stat().st_size, sha256=sha256_file(p), kind=kind)  # type: ignore[arg-type]
            for p, kind in paths
        ]
        t_start = time.time()
        answer = self.client.request_uploads(
            self.run_id, sl.UploadsRequest(fencing=self.fencing, version=version, files=files)
        )
        by_name = {(f.name, f.kind): f for f in files}
        where = {"adapter": folder, "checkpoint": checkpoint}
        published: dict[str, list[sl.PublishedFile]] = {"adapter": [], "checkpoint": []}
        for put in answer.uploads:
            path = where[put.kind] / put.name
            upload_presigned(PresignedPut(url=put.url, headers=put.headers), path)
            meta = by_name[(put.name, put.kind)]
            published[put.kind].append(
                sl.PublishedFile(name=put.name, key=put.key, sha256=meta.sha256, size=meta.size)
            )
        upload_s = time.time() - t_start
        self.claim()
        self.client.publish_adapter(
            self.run_id,
            sl.PublishRequest(
                fencing=self.fencing,
                version=version,
                files=published["adapter"],
                checkpoint_files=published["checkpoint"],
                learner_step=version,
                metrics={},
                consumed_batch_ids=self.claimed,
                final=False,
            ),
        )
        t_ack = time.time()
        self.version, self.claimed = version, []
        weights = (folder / "adapter_model.safetensors").stat().st_size
        return Published(version, size_mb, weights, t_start, t_ack, upload_s)

    def close(self) -> None:
        self.heartbeat.stopped.set()
        self.client.close()
