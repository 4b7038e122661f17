"""The two ranks of tests/learner/test_data_parallel.py, run by torch.multiprocessing (spawn)
over gloo: each case builds the same tiny model, rank 1 with a different LoRA init (so rank
0's state must reach it), trains the same steps data-parallel and saves its trainable
parameters; rank 0 also saves the gathered per-rank step figures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from learner.data import Completion, Group
from protocol.run_config import RunConfig
from tests.harness import runs

CASES: dict[str, dict[str, Any]] = {
    "grpo": {"loss_type": "grpo"},
    "dapo": {"loss_type": "dapo"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "cispo": {"loss_type": "cispo"},
    "grpo_sequence": {"loss_type": "grpo", "importance_level": "sequence"},
    "dapo_sequence": {"loss_type": "dapo", "importance_level": "sequence"},
    "dapo_tis": {"loss_type": "dapo", "correction": "tis"},
    "grpo_kl": {"loss_type": "grpo", "beta": 0.05},
}
FSDP_CASES = {
    "dapo_fsdp": {"loss_type": "dapo"},
    "grpo_kl_fsdp": {"loss_type": "grpo", "beta": 0.05},
}

# (prompt, [(completion, reward)]): g2 has equal rewards (skipped when β = 0)
_GROUPS = [
    ([1, 2, 3], [([5, 6, 7, 0], 1.0), ([8, 0], 0.0)]),
    ([4, 5, 6, 7, 8], [([9, 9, 10, 11, 12, 0], 0.5), ([13, 0], 0.25)]),
    ([2, 3], [([14, 15, 0], 1.0), ([16, 17, 18, 19, 0], 1.0)]),
    ([7, 7, 7], [([20, 21, 22, 23, 24, 25, 26, 0], 0.0), ([27, 0], 1.0)]),
    ([3, 1], [([28, 0], 0.2), ([29, 30, 0], 0.9)]),
]


def steps() -> list[list[Group]]:
    """Two steps: the groups, then the groups reversed with the rewards of one pair turned."""
    gen = torch.Generator().manual_seed(7)
    first = []
    for prompt, comps in _GROUPS:
        completions = []
        for ids, _ in comps:
            behaviour = (-3.7 + 0.6 * (torch.rand(len(ids), generator=gen) - 0.5)).tolist()
            completions.append(Completion(prompt, ids, behaviour))
        first.append(Group(completions, [r for _, r in comps]))
    second = [Group(g.completions, list(g.rewards)[::-1]) for g in reversed(first)]
    return [first, second]


def run_config(grpo: dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate(
        runs.run_config(
            name="data-parallel",
            dataset=runs.jsonl([{"prompt": "p", "answer": 1}]),
            lora={"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            sampling={"max_new_tokens": 8},
            grpo={"learning_rate": 1e-2, "micro_batch_tokens": 24, **grpo},
            prompts_per_lease=1,
            prompts_per_step=5,
        )
    )


def tiny_model(lora_seed: int, config: RunConfig) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from learner.trainer import add_lora

    torch.manual_seed(0)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=40,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    ).eval()
    torch.manual_seed(lora_seed)
    model = add_lora(base, config)
    with torch.no_grad():  # LoRA B starts at 0; a non-zero start makes every gradient count
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model


def trainable(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def rank_main(rank: int, world: int, port: int, out: str, fsdp: bool) -> None:
    from learner.distributed import DataParallel, RankEnv
    from learner.trainer import Trainer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dp = DataParallel(RankEnv(rank, world, rank), device="cpu", collective_timeout_s=60.0)
    for name, grpo in (FSDP_CASES if fsdp else CASES).items():
        config = run_config(grpo)
        model = tiny_model(lora_seed=rank, config=config)
        sharded = 0.0
        if fsdp:
            dp.shard(model)
            weight = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
            sharded = weight.to_local().numel() / weight.numel()  # this rank's part
        trainer = Trainer(model, config, pad_id=0, dp=dp)
        dp.share_trainer_state(trainer)
        figures = []
        for groups in steps():
            if rank == 0:
                metrics = trainer.train_step(groups)
                runs = [
                    {"tokens": sum(p["tokens"] for p in r.parts), "micro": r.micro_batches,
                     "empty": r.empty_micro_steps} for r in trainer.last_runs
                ]  # fmt: skip
                figures.append({"metrics": metrics, "runs": runs, "sharded": sharded})
            else:
                kind, share = dp.receive()
                assert kind == "step"
                trainer.train_share(share)
        torch.save(trainable(model), Path(out) / f"{name}-rank{rank}.pt")
        if rank == 0:
            (Path(out) / f"{name}.json").write_text(json.dumps(figures))
    dp.close()
