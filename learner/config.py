"""Learner settings: one pydantic-settings root, parsed before torch is imported.

Every field can come from the command line (`asyncgrpo learner --...`) or from the environment
with the prefix `ASYNCGRPO_LEARNER_` (e.g. `ASYNCGRPO_LEARNER_TOKEN`). The training
hyper-parameters are not here: they come from the run's config, which attach returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol import credentials
from protocol.outbound import OutboundPolicy, check_networks
from protocol.rewards import MODULE_PATH
from protocol.schemas_learner import MAX_MEMORY_BUDGET_GB, MAX_POOL_RUNS
from protocol.settings_env import refuse_unknown_part_variables

DEFAULT_WORK_DIR = Path.home() / ".cache" / "asyncgrpo" / "learner"
POOL_CREDENTIALS = "pool-learner.json"  # in work_dir unless --credentials-file
POOL_ID_FIELD = "learner_id"  # the credentials file's id field (protocol/credentials.py)


class LearnerSettings(BaseSettings):
    """Everything the learner process needs to reach its run; nothing here imports torch."""

    # populate_by_name: the aliases below are whole environment names (the prefix does not
    # apply to them), and code still passes server_url=… / run_id=…
    model_config = SettingsConfigDict(
        env_prefix="ASYNCGRPO_LEARNER_", extra="forbid", populate_by_name=True
    )

    # Also under the command-line option's name (--server, --run): every option is also
    # ASYNCGRPO_LEARNER_<OPTION>.
    server_url: str = Field(
        validation_alias=AliasChoices(
            "server_url", "ASYNCGRPO_LEARNER_SERVER_URL", "ASYNCGRPO_LEARNER_SERVER"
        ),
        description="Base URL of the control plane, e.g. http://host:8000 (--server; "
        "ASYNCGRPO_LEARNER_SERVER_URL or ASYNCGRPO_LEARNER_SERVER).",
    )
    run_id: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "run_id", "ASYNCGRPO_LEARNER_RUN_ID", "ASYNCGRPO_LEARNER_RUN"
        ),
        description="The run this learner trains (UUID; --run; ASYNCGRPO_LEARNER_RUN_ID or "
        "ASYNCGRPO_LEARNER_RUN), with --token. Without it the learner is a pool learner "
        "(--registration-token, or the credential in --credentials-file): it takes runs.",
    )
    token: str | None = Field(None, description="The run's learner token (agr_lrn_…), with --run.")
    model: str = Field(
        "smollm2-135m-instruct",
        description="The run's base model (HF id, folder or alias): its tokenizer's fingerprint "
        "is reported on attach, before the run config is known. Must equal the run's.",
    )
    name: str = Field("learner", description="A name for this learner process.")

    # Pool learner (docs/guides/pool-learners.md): no --run; it registers once and takes runs.
    registration_token: str | None = Field(
        None,
        description="Pool learner: the agr_reg_… token used once to register (not needed when "
        "--credentials-file already holds this server's pool learner token). Not with --run.",
    )
    credentials_file: Path | None = Field(
        None,
        description="Pool learner: where its pool token (agr_pln_…) is kept (mode 0600) and "
        "reused on restart for the same server.",
        json_schema_extra={"shown_default": "<work_dir>/pool-learner.json"},
    )
    max_runs: int = Field(
        1,
        ge=1,
        le=MAX_POOL_RUNS,
        description="Pool learner: the most runs it holds and trains at once, each its own "
        "LoRA adapter on the one base model it loads (they take turns on it, first ready, "
        "first trained).",
    )
    memory_budget: float | None = Field(
        None,
        gt=0,
        le=MAX_MEMORY_BUDGET_GB,
        allow_inf_nan=False,
        description="Pool learner: memory (GB, 10^9 bytes) the runs it holds may take; a run "
        "that does not fit beside them is left for another learner (docs/guides/"
        'pool-learners.md, "Memory"). None: on CUDA the device\'s total memory (times '
        "--gpu-memory-fraction when set), on CPU the machine's physical memory.",
        json_schema_extra={"shown_default": "the device's memory"},
    )
    gpu_type: str | None = Field(
        None, min_length=1, max_length=100, description="Pool learner: its GPU, e.g. H100."
    )
    price_per_hour: float | None = Field(
        None,
        ge=0,
        le=10_000,
        description="Pool learner: USD/hour, split over the runs it holds (the Cost page).",
    )
    take_retry_s: float = Field(
        5.0, gt=0, description="Pool learner: wait between takes while no run is takeable."
    )
    threads: int | None = Field(None, ge=1, description="torch intra-op threads (None: default).")
    device: str = Field("cpu", description="torch device: cpu, cuda, cuda:1, …")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Dtype of the frozen base weights; the LoRA weights, their gradients and "
        "the optimizer state stay fp32 (PEFT keeps adapter weights in fp32).",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="CUDA only: the share of the GPU's memory this process's torch allocator "
        "may take (torch.cuda.set_per_process_memory_fraction), so that workers on the same GPU "
        "keep theirs; past it a step fails out of memory (None: no cap).",
    )
    work_dir: Path = Field(
        DEFAULT_WORK_DIR,
        description="Local folder for downloaded batches, adapters and checkpoints.",
        json_schema_extra={"shown_default": "~/.cache/asyncgrpo/learner"},
    )
    record_steps_dir: Path | None = Field(
        None,
        description="Write what each trained step consumed (its batches and their scored "
        "groups, one JSON line a step) to <dir>/<run id>.jsonl, to replay a run's training "
        "into a fresh learner (learner/step_record.py: debugging, tests). Off by default.",
    )
    claim_wait_s: float = Field(10.0, ge=0, description="Long-poll of one claim call.")
    standby_retry_s: float = Field(
        5.0,
        gt=0,
        description="Wait between attach attempts while another learner holds the run or the "
        "run is preparing its prompt rows.",
    )
    spot_check_fraction: float | None = Field(
        None, ge=0, le=1, description="Override of the run's spot-check fraction (None: run's)."
    )
    spot_check_reject_factor: float = Field(
        10.0,
        gt=0,
        description="Reject a spot-checked batch whose mean |Δ log-prob| exceeds this many "
        "times the run's spot_check_mismatch threshold.",
    )
    transfer_retry_cap_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait between retries of a bucket transfer (exponential backoff "
        "with jitter; transfers are retried for as long as the learner lease holds).",
    )
    max_versions: int | None = Field(
        None, ge=1, description="Stop after publishing this many versions (None: run to the end)."
    )
    overlap: bool = Field(
        True,
        description="Claim, download, validate and score the next step's batches, and upload "
        "the last version, while the current step trains (False: one thing at a time, as "
        "before; kept for comparison in bench/pipeline.py).",
    )
    checkpoint_every_versions: int = Field(
        10,
        ge=1,
        description="Upload the resume checkpoint (optimizer state, step, scheduler, RNG) with "
        "every Nth version, version 1, the final one and the first of each attachment; the "
        "adapter travels with every version. A "
        "restart resumes the current version's weights with the latest checkpoint's optimizer "
        'state (docs/architecture/learner.md, "The learner").',
    )
    collective_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Data-parallel learner only (torchrun --nproc-per-node N): how long a rank "
        "waits in the step's gradient all-reduce before it fails (the process group's "
        "timeout), and the bound of the step watchdog that withholds rank 0's heartbeat. "
        "Must be shorter than the run's learner lease TTL (rank 0 stops otherwise).",
    )
    fsdp: bool = Field(
        False,
        description="Data-parallel learner only, experimental: shard the frozen base weights "
        "over the ranks with FSDP2 (the LoRA weights stay whole on every rank); spot checks "
        "are skipped while sharded.",
    )
    reward_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest time the run's reward functions may take on one batch (all of "
        "them together, in their child process); past it the process is killed, a fresh one "
        "started and the batch rejected `reward_error`.",
    )
    reward_processes: int = Field(
        1,
        ge=1,
        description="Warm child processes that run the reward functions (forkserver; each "
        "imports the run's user rewards once).",
    )
    reward_modules: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices(
            "reward_modules", "ASYNCGRPO_LEARNER_REWARD_MODULES", "ASYNCGRPO_LEARNER_REWARD_MODULE"
        ),
        description="Modules whose functions the run may name as rewards (`module:function`); "
        "with the entry points of the group `asyncgrpo.rewards` installed here, the only user "
        "code the learner loads. Built-ins are always allowed (--reward-module, repeatable; a "
        "JSON list in ASYNCGRPO_LEARNER_REWARD_MODULES or ASYNCGRPO_LEARNER_REWARD_MODULE).",
    )

    # Experiment tracker (learner/tracking/; docs/guides/trackers.md): each
    # field set here wins over the same field of the run config's `tracking` block.
    tracking_backend: Literal["wandb", "trackio", "mlflow", "none"] | None = Field(
        None,
        description="Mirror metrics to wandb, trackio or mlflow; none: no tracker whatever the "
        "run config says (None: the run config's tracking.backend, if any).",
    )
    tracking_project: str | None = Field(
        None, description="W&B project, trackio project or MLflow experiment (None: the run's)."
    )
    tracking_run_name: str | None = Field(
        None, description="Name of the tracker's run (None: the run config's, else derived)."
    )
    tracking_entity: str | None = Field(None, description="W&B entity (None: the run's).")
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI, e.g. http://mlflow:5000 or sqlite:///mlflow.db "
        "(None: MLFLOW_TRACKING_URI or MLflow's default). Learner-only: never in the run config.",
    )
    tracking_close_s: float = Field(
        30.0,
        gt=0,
        description="How long the learner, when it stops, waits for the tracker to send what "
        "it holds (the rest is dropped).",
    )

    # The same variables as the server's (ASYNCGRPO_OUTBOUND_*), so that one deployment sets
    # the policy once; ASYNCGRPO_LEARNER_OUTBOUND_* is the learner-only spelling.
    outbound_allow_private: bool = Field(
        False,
        validation_alias=AliasChoices(
            "outbound_allow_private",
            "ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE",
            "ASYNCGRPO_LEARNER_OUTBOUND_ALLOW_PRIVATE",
        ),
        description="Let the rewards' outbound calls (llm_judge) reach loopback, link-local "
        "and private addresses (protocol/outbound.py); off, only public addresses "
        "(ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE or ASYNCGRPO_LEARNER_OUTBOUND_ALLOW_PRIVATE).",
    )
    outbound_allow_cidrs: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices(
            "outbound_allow_cidrs",
            "ASYNCGRPO_OUTBOUND_ALLOW_CIDRS",
            "ASYNCGRPO_LEARNER_OUTBOUND_ALLOW_CIDRS",
        ),
        description="Networks the rewards' outbound calls may reach although not public, "
        'e.g. ["10.20.0.0/16"] (a JSON list in ASYNCGRPO_OUTBOUND_ALLOW_CIDRS).',
    )

    @field_validator("outbound_allow_cidrs")
    @classmethod
    def _networks(cls, cidrs: list[str]) -> list[str]:
        return check_networks(cidrs)

    def outbound_policy(self) -> OutboundPolicy:
        """The policy the rewards' outbound calls go through."""
        return OutboundPolicy.from_settings(self.outbound_allow_private, self.outbound_allow_cidrs)

    @field_validator("reward_modules")
    @classmethod
    def _module_paths(cls, modules: list[str]) -> list[str]:
        for module in modules:
            if not MODULE_PATH.match(module):
                raise ValueError(f"{module!r} is not a dotted module path (e.g. my_rewards.math)")
        return modules

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: object) -> object:
        refuse_unknown_part_variables(cls, "a learner setting (learner/config.py)")
        return data

    @property
    def pool(self) -> bool:
        """A pool learner: started without --run (it registers once and takes runs)."""
        return self.run_id is None

    def pool_credentials_path(self) -> Path:
        return self.credentials_file or self.work_dir / POOL_CREDENTIALS

    @model_validator(mode="after")
    def _one_mode(self) -> LearnerSettings:
        """Exactly one of --run with --token, or a pool learner's registration token (or its
        stored credential for this server)."""
        if self.run_id is not None or self.token is not None:
            if self.run_id is None or self.token is None:
                missing = "--run" if self.run_id is None else "--token"
                raise ValueError(f"{missing} is missing: --run and --token go together")
            if self.registration_token is not None:
                raise ValueError(
                    "--registration-token is for a pool learner (no --run); give either --run "
                    "with --token, or --registration-token"
                )
            if self.max_runs > 1:
                raise ValueError(
                    f"--max-runs {self.max_runs} is for a pool learner (no --run): a learner "
                    "started with --run trains that one run"
                )
            return self
        if self.max_versions is not None:
            raise ValueError(
                "--max-versions stops one run's learner (--run); a pool learner trains each run "
                "it takes to its end"
            )
        if self.registration_token is None:
            path = self.pool_credentials_path()
            if credentials.load(path, self.server_url, POOL_ID_FIELD) is None:
                raise ValueError(
                    "give --run with --token (one run's learner), or --registration-token (a "
                    f"pool learner): no pool learner credential for {self.server_url} in {path}"
                )
        return self
