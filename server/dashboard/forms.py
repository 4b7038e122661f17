"""The new-run form: HTML fields named by their RunConfig path, turned into the config dict that
RunConfig validates, and RunConfig's errors mapped back to the fields they belong to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from protocol import datasets, rewards
from protocol.run_config import RunConfig

# Plain fields: form name = dotted RunConfig path. Values go to pydantic as strings (lax mode
# parses numbers and booleans); an empty value leaves the field at its default.
PLAIN_FIELDS = (
    "name",
    "base_model",
    "priority",
    "lora.rank",
    "lora.alpha",
    "lora.dropout",
    "grpo.learning_rate",
    "grpo.loss_type",
    "grpo.importance_level",
    "grpo.scale_rewards",
    "grpo.epsilon_low",
    "grpo.epsilon_high",
    "grpo.beta",
    "grpo.correction",
    "sampling.temperature",
    "sampling.max_new_tokens",
    "group_size",
    "prompts_per_lease",
    "prompts_per_step",
    "weight_sync_steps",
    "max_staleness",
    "max_attempts",
    "epochs",
    "max_versions",
    "lease_ttl_s",
    "heartbeat_interval_s",
    "budget_usd",
    "learner_price_per_hour",
    "alarms.stale_waste",
    "alarms.clip_fraction",
    "alarms.window_minutes",
    "alarms.no_version_minutes",
    "alarms.entropy_floor",
    "alarms.entropy_drop",
    "alarms.zero_advantage",
    "alarms.zero_advantage_versions",
    "alarms.webhook_url",
)
# Fields RunConfig requires but the form lets stay empty: empty takes this default, as the page
# says (the alias of the small model lm/models.py ships, the demo's model).
FORM_DEFAULTS = {"base_model": "smollm2-135m-instruct"}
DATASET_FIELDS = (
    "dataset.kind",
    "dataset.generator",
    "dataset.size",
    "dataset.seed",
    "dataset.id",
    "dataset.prompt_column",
    "dataset.system_prompt",
    "dataset.reference_columns",
)
DATASET_KINDS = ("generator", "jsonl", "uploaded")
# Stands for the id of a file uploaded with the form, until the rest of the form is valid.
UPLOAD_PENDING = "00000000-0000-0000-0000-000000000000"
OTHER_FIELDS = ("dataset.file", "rewards", "reward.custom", "lora.target_modules")
ALL_FIELDS = frozenset(PLAIN_FIELDS + DATASET_FIELDS + OTHER_FIELDS)
# the built-ins that work with no kwargs (the form has no kwargs field; llm_judge needs them)
# worker_score needs a run requiring trusted workers: not offered as a plain checkbox
BUILTIN_REWARDS = tuple(
    sorted(
        n for n in rewards.BUILTINS if rewards.works_without_kwargs(n) and n != rewards.WORKER_SCORE
    )
)
GENERATORS = tuple(sorted(datasets.GENERATORS))


@dataclass
class FormResult:
    """The parsed config (when valid), or errors by form field (`__all__`: not a field)."""

    config: RunConfig | None = None
    errors: dict[str, list[str]] = field(default_factory=dict)

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)


def _put(target: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def _stored(form: Mapping[str, Any], has_file: bool, result: FormResult) -> dict[str, Any]:
    """A stored dataset: the one chosen, or the file uploaded with the form."""
    chosen = str(form.get("dataset.id") or "").strip()
    if not chosen and not has_file:
        result.add("dataset.id", "choose a stored dataset, or a JSONL or Parquet file to upload")
    out: dict[str, Any] = {"kind": "uploaded", "id": UPLOAD_PENDING if has_file else chosen}
    for name in ("prompt_column", "system_prompt"):
        value = str(form.get(f"dataset.{name}") or "").strip()
        if value:
            out[name] = value
    columns = str(form.get("dataset.reference_columns") or "").strip()
    if columns:
        out["reference_columns"] = [c.strip() for c in columns.split(",")]
    return out


def _dataset(
    form: Mapping[str, Any], jsonl: str | None, result: FormResult, has_file: bool
) -> dict[str, Any]:
    kind = str(form.get("dataset.kind") or "generator")
    if kind == "uploaded":
        return _stored(form, has_file, result)
    if kind == "jsonl":
        if not jsonl:
            result.add("dataset.file", "choose a JSONL file (one JSON object per line)")
            return {"kind": "jsonl", "rows": [{"prompt": "placeholder"}]}
        try:
            if "\x00" in jsonl:
                raise datasets.DatasetError("the file may not contain NUL (\\u0000) characters")
            rows = datasets.parse_jsonl(jsonl)
        except datasets.DatasetError as exc:
            result.add("dataset.file", str(exc))
            rows = [{"prompt": "placeholder"}]
        return {"kind": "jsonl", "rows": rows}
    out: dict[str, Any] = {"kind": kind}
    for name in ("generator", "size", "seed"):
        value = form.get(f"dataset.{name}")
        if value not in (None, ""):
            out[name] = value
    return out


def _rewards(form: Any) -> list[dict[str, Any]]:
    names = [n for n in form.getlist("rewards") if n]
    custom = str(form.get("reward.custom") or "").strip()
    if custom:
        names.append(custom)
    return [{"name": n} for n in names]


def to_config_dict(
    form: Any, jsonl: str | None, result: FormResult, has_file: bool = False
) -> dict[str, Any]:
    """The RunConfig dict the form describes (form: a Starlette FormData or a MultiDict)."""
    config: dict[str, Any] = {}
    for name in PLAIN_FIELDS:
        value = form.get(name)
        if isinstance(value, str) and value.strip() != "":
            _put(config, name, value.strip())
        elif name in FORM_DEFAULTS:
            _put(config, name, FORM_DEFAULTS[name])
    config["dataset"] = _dataset(form, jsonl, result, has_file)
    config["rewards"] = _rewards(form)
    modules = str(form.get("lora.target_modules") or "").strip()
    if modules:
        _put(config, "lora.target_modules", [m.strip() for m in modules.split(",")])
    return config


def field_of(loc: tuple[Any, ...]) -> str:
    """The form field a pydantic error location belongs to: the dataset union's tag and list
    indexes are dropped, then the longest dotted prefix that is a form field wins."""
    parts = [str(p) for p in loc]
    if parts[:1] == ["dataset"] and len(parts) > 1 and parts[1] in DATASET_KINDS:
        if len(parts) > 2:
            parts = ["dataset", *parts[2:]]
    if parts[:2] == ["dataset", "rows"]:
        return "dataset.file"
    if parts[:1] == ["rewards"]:
        return "rewards"
    parts = [p for p in parts if not p.isdigit()]
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in ALL_FIELDS:
            return candidate
    return "__all__"


def _refuse_nul(form: Any, result: FormResult) -> None:
    """Postgres text cannot hold U+0000: a field carrying one is an error on that field."""
    for name, value in form.multi_items():
        if isinstance(value, str) and "\x00" in value:
            shown = name if name in ALL_FIELDS else "__all__"
            result.add(shown, "may not contain NUL (\\u0000) characters")


def parse(form: Any, jsonl: str | None = None, has_file: bool = False) -> FormResult:
    """Validate the form with RunConfig (the same rules as the API). `has_file`: a file for a
    stored dataset came with the form (its id is UPLOAD_PENDING until it is uploaded)."""
    result = FormResult()
    _refuse_nul(form, result)
    data = to_config_dict(form, jsonl, result, has_file)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            msg = str(err.get("msg", "invalid value"))
            result.add(field_of(tuple(err.get("loc", ()))), msg.removeprefix("Value error, "))
        return result
    if not result.errors:
        result.config = config
    return result


def with_dataset_id(config: RunConfig, dataset_id: str) -> RunConfig:
    """The config with the uploaded file's dataset id in place of UPLOAD_PENDING."""
    data = config.model_dump(mode="json")
    data["dataset"]["id"] = dataset_id
    return RunConfig.model_validate(data)
