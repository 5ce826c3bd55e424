"""The base of every config shape: no unknown keys, frozen, no NaN or infinity, no true/false
for a number, integers within 64 bits. Public for what validates settings the same way: the
run config's blocks (kernel/config.py), each algorithm's settings (kernel/algorithms/),
apps.rewards.k12's params. Its own module, so that the algorithms' declarations, which the
config imports, can use it too."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from kernel.input_checks import MAX_INT


class StrictModel(BaseModel):
    # No NaN or infinity (jsonb cannot hold them; `1e400` parses as infinity).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        # Lax mode would take `true` for 1 in a number field.
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation in (int, float, int | None, float | None):
                raise ValueError("expected a number, not true/false")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: object, info: ValidationInfo) -> object:
        # Seeds, counts and steps end up in 64-bit columns and libraries.
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ValueError("number is too large (at most 2^63 - 1)")
        return value
