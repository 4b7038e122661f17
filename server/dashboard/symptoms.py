"""The one table of what a symptom of a run means, which figures show it and which settings
change it. The drift banner (server/dashboard/service.py, the run page and the runs list) shows
an alarm's `meaning` and its settings from here, and docs/reference/symptoms.md is rendered
from here (asyncgrpo/docs_reference/symptoms_page.py), so the two cannot say different things.

A change's `setting` is a run-config field (`max_staleness`, `grpo.learning_rate`) or an option
of the worker or the learner (`worker --max-inflight-sequences`); tests/server/dashboard/
test_symptoms.py checks each names a real one."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.capabilities import NO_WORKER_CAN_SERVE as NO_WORKER_CAN_SERVE_CODE


@dataclass(frozen=True)
class Change:
    setting: str
    how: str


@dataclass(frozen=True)
class Symptom:
    key: str  # the page's anchor; for a drift alarm, also the alarm's kind
    title: str
    meaning: str
    figures: tuple[str, ...]
    changes: tuple[Change, ...]
    alarm: str | None = None  # the alarm that fires on it (RunConfig.alarms), if any

    @property
    def settings(self) -> tuple[str, ...]:
        return tuple(c.setting for c in self.changes)


STALE_WASTE = Symptom(
    key="stale_waste",
    title="Stale waste rising",
    alarm="stale_waste",
    meaning="Too much work is in flight for the staleness window: batches are generated with "
    "adapter versions that are already too old when the learner claims them. Fewer workers or "
    "smaller leases, a larger max_staleness, or faster adapter sync bring it down.",
    figures=(
        "the run page's stale waste chart against its threshold (`alarms.stale_waste`, over "
        "`alarms.window_minutes`); `GET /api/v1/runs/{id}/metrics` `proxy.stale_waste` for the "
        "whole run",
        "rejected samples by reason: the `stale` series",
        "the staleness of consumed batches chart: how many versions behind they were",
        "groups in flight against the admission bound (`stats.groups_in_flight`, "
        "`stats.admission_bound_groups` of `GET /api/v1/runs/{id}`)",
    ),
    changes=(
        Change("max_staleness", "raise it: a batch may lag more versions (the bound grows too)"),
        Change("prompts_per_lease", "lower it: smaller leases finish, and are claimed, sooner"),
        Change(
            "weight_sync_steps",
            "raise it: fewer versions per step, so a lag of N versions covers more steps",
        ),
        Change("admission_control", "keep it on: no group is handed out past the bound"),
        Change(
            "worker --max-inflight-sequences",
            "lower it, or run fewer workers: less work in flight per version",
        ),
    ),
)

CLIP_FRACTION = Symptom(
    key="clip_fraction",
    title="Clip fraction high",
    alarm="clip_fraction",
    meaning="The sampling policy and the learner's policy have drifted apart: many tokens hit "
    "the clip bounds. Usually adapter sync is too slow (workers sample with old versions) or "
    "the learning rate is too high.",
    figures=(
        "the clip fraction low/high chart against its threshold (`alarms.clip_fraction`)",
        "the importance ratio range chart (min, mean, max per step)",
        "the staleness of consumed batches chart: batches trained further behind their "
        "version clip more",
        "the run page's live leases: the version each lease samples with, against the current "
        "version",
    ),
    changes=(
        Change("grpo.learning_rate", "lower it: smaller steps keep the policies closer"),
        Change("max_staleness", "lower it: fresher samples, at the price of more stale waste"),
        Change(
            "grpo.correction",
            "`tis` weights off-policy tokens by their truncated "
            "importance ratio (capped at `grpo.tis_cap`) instead of only clipping them",
        ),
        Change("grpo.epsilon_high", "widen the clip bound only on purpose: it hides the drift"),
    ),
)

ENTROPY_COLLAPSE = Symptom(
    key="entropy",
    title="Entropy collapsing",
    alarm="entropy",
    meaning="The policy is collapsing onto a few answers: the learner's entropy fell under its "
    "floor or far below where it started. Its completions stop varying, groups stop teaching, "
    "and the eval accuracy often falls after it peaked. A lower or decaying learning rate, or "
    "keeping the best version and stopping early, limit the damage.",
    figures=(
        "the learner's `entropy` per version against `alarms.entropy_floor` and the run's first "
        "version's entropy (`alarms.entropy_drop`)",
        "the eval accuracy per version: a peak and then a fall (the run's best version)",
        "the zero-advantage share: rising as every completion of a group becomes the same",
        "the gradient norm and the importance ratio max: spikes on the steps before it",
    ),
    changes=(
        Change("grpo.learning_rate", "lower it: smaller steps collapse later, or not at all"),
        Change("grpo.lr_schedule", "`cosine` or `linear`: decay the rate as the run goes on"),
        Change("sampling.temperature", "raise it a little: more varied completions to learn from"),
        Change("early_stop.patience", "stop the run once its best figure stops improving"),
        Change("best.metric", "rank versions by eval accuracy and take `/adapters/best`"),
    ),
)

NO_SIGNAL = Symptom(
    key="zero_advantage",
    title="No signal in the groups",
    alarm="zero_advantage",
    meaning="In version after version nearly every group scored all its completions alike (all "
    "right or all wrong), so they have no advantage and train nothing. All wrong: the task is "
    "too hard for the model or the reward never matches; all right: it is learnt, or the policy "
    "has collapsed onto one answer.",
    figures=(
        "the learner's `zero_advantage_fraction` per version against `alarms.zero_advantage` "
        "(over `alarms.zero_advantage_versions` versions)",
        "the reward mean per version: near 0 (all wrong) or near 1 (all right)",
        "the learner's entropy: falling with it when the policy collapses",
    ),
    changes=(
        Change("group_size", "raise it: a larger group is less often all alike"),
        Change("sampling.temperature", "raise it: more varied completions within a group"),
        Change("dataset", "harder or easier prompts, to the model's level"),
        Change("rewards", "a reward with partial credit gives a group varied scores"),
        Change("early_stop.patience", "stop the run when it has nothing left to learn"),
    ),
)

VERSIONS_STALLED = Symptom(
    key="versions_stalled",
    title="Versions not advancing",
    alarm="no_version",
    meaning="No new adapter version for a while: the learner is absent, refused, or gets no "
    "batch it can train on.",
    figures=(
        "the current version and when it was published (`current_version`, "
        "`last_version_at`); the `no_version` alarm after `alarms.no_version_minutes`",
        "`stats.learner_attached`, and the learner's log: its attach line, or the 409 that "
        "refused it (`model_mismatch`, `fingerprint_mismatch`, `held_by_another_learner`)",
        "the run's status: `paused` and `budget_exhausted` hand out no work until resumed",
        "batches by state and rejections by reason: accepted batches piling up (the learner is "
        "slow or absent), or rejected `prompt_mismatch`, `reward_error`, `invalid`",
    ),
    changes=(
        Change("learner --model", "the run's `base_model`: another is refused at attach"),
        Change("budget_usd", "raise it, then resume the run, when it is `budget_exhausted`"),
        Change("prompts_per_step", "lower it: a step waits for this many groups"),
        Change(
            "learner --reward-timeout-s",
            "raise it when batches are rejected `reward_error` because the reward timed out",
        ),
    ),
)

WORKERS_IDLE = Symptom(
    key="workers_idle",
    title="Workers idle",
    meaning="Workers are online but hold no lease: no run hands work out to them.",
    figures=(
        "the workers page: state `online`, no current lease",
        "the run's status: only `running` runs get training leases, and a run stays `pending` "
        "until its learner attaches",
        "groups in flight against the admission bound: at the bound, new leases wait until the "
        "learner consumes groups",
        "the prompt ledger: nothing `queued` once every epoch's prompts are handed out",
        "a worker takes only leases of runs whose `base_model` it serves with a matching "
        "tokenizer, and of `environment.requires_trusted_worker` runs only when trusted",
        "the run page's `no_worker_can_serve` banner (`serving` of `GET /api/v1/runs/{id}`): "
        "the live workers cannot load its adapter or run its environment (below)",
    ),
    changes=(
        Change("worker --model", "the run's `base_model`"),
        Change(
            "max_staleness",
            "raise it (or `prompts_per_step`) for a larger admission "
            "bound, when the learner keeps up: workers run further ahead",
        ),
        Change(
            "environment.requires_trusted_worker",
            "trust the worker (`POST /api/v1/workers/{id}/trust`), or set it false",
        ),
        Change("epochs", "more passes over the dataset when the ledger has run dry"),
    ),
)

NO_WORKER_CAN_SERVE = Symptom(
    key=NO_WORKER_CAN_SERVE_CODE,
    title="No worker can serve the run",
    meaning="The run hands out leases and its base model has live workers, but none of them "
    "can serve it: their engines cannot load its LoRA adapter (a lora.rank above their "
    "largest, or target modules they cannot wrap), or none can run its environment. It gets no "
    "lease until such a worker calls; the reason names what to change.",
    figures=(
        "the run page's banner and `serving` of `GET /api/v1/runs/{id}`: the code "
        "`no_worker_can_serve`, the reason, the live workers it counted",
        "the workers page: each worker's declared capabilities (largest LoRA rank, dtype) and "
        "environments (`capabilities`, `environments` of `GET /api/v1/workers`)",
        "a worker's log: `refused here: adapter: …` when a lease of an adapter its engine "
        "cannot load reached it anyway (released `unservable`)",
    ),
    changes=(
        Change(
            "worker --vllm-max-lora-rank",
            "at least the run's `lora.rank`, as one of vLLM's ranks (its default is 16); the "
            "worker declares it with its next acquire, token file and all",
        ),
        Change("lora.rank", "a new run with a rank the workers load (a run's rank never changes)"),
        Change(
            "worker --environment-modules",
            "allow the run's environment where the workers run (or install its entry point)",
        ),
        Change(
            "environment.requires_trusted_worker",
            "trust a worker (`POST /api/v1/workers/{id}/trust`)",
        ),
    ),
)

LEARNER_WAITING = Symptom(
    key="learner_waiting",
    title="Learner waiting for batches",
    meaning="The learner spends its time waiting for batches: the workers generate less than "
    "it trains.",
    figures=(
        "the learner intake wait chart (`intake_wait_s`) high, the learner pipeline's busy "
        "fraction low",
        "groups in flight against the admission bound: below it, too few workers; at it, the "
        "bound holds them back",
        "rejections by reason: stale or invalid batches never reach the learner",
        "`asyncgrpo plan --from-run <id>`: the workers that keep one learner busy at the "
        "measured rates",
    ),
    changes=(
        Change(
            "worker --max-inflight-sequences",
            "raise it (more sequences per engine), or start more workers",
        ),
        Change("max_staleness", "raise it when groups in flight sit at the bound"),
        Change("sampling.max_new_tokens", "lower it: shorter completions arrive sooner"),
        Change("prompts_per_lease", "lower it: batches arrive in smaller, earlier pieces"),
        Change(
            "learner --overlap",
            "keep it on: the next step's batches are claimed and scored while a step trains",
        ),
    ),
)

SYMPTOMS: tuple[Symptom, ...] = (
    STALE_WASTE,
    CLIP_FRACTION,
    ENTROPY_COLLAPSE,
    NO_SIGNAL,
    VERSIONS_STALLED,
    WORKERS_IDLE,
    NO_WORKER_CAN_SERVE,
    LEARNER_WAITING,
)
BY_ALARM = {s.alarm: s for s in SYMPTOMS if s.alarm is not None}
