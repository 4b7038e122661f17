"""The base of the run configuration's models: strict fields and per-field rules with precise
messages (protocol/run_config.py, protocol/environments.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

# The largest LoRA rank a run may train and a worker may declare (protocol/capabilities.py).
MAX_LORA_RANK = 1024


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("config_rule", message)


Rule = tuple[Callable[[Any], bool], str]


class _Strict(BaseModel):
    """Refuses unknown fields, NaN and infinities; applies the class's RULES to each field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=True)
    RULES: ClassVar[dict[str, Rule]] = {}

    @field_validator("*")
    @classmethod
    def _apply_rule(cls, value: Any, info: ValidationInfo) -> Any:
        rule = cls.RULES.get(info.field_name or "")
        if rule is not None and value is not None and not rule[0](value):
            raise _fail(f"{info.field_name} {rule[1]} (got {value!r})")
        return value
