"""What a task needs from a worker: :class:`Resources` and the named profiles."""

import functools
import re
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import (
    ByteSize,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .base import Accelerator, LabelKey, LabelValue, Name, RequestModel

#: Shorthands for common requirement sets (``profile="pytorch-cuda"``); explicit
#: fields given next to a profile win over the profile's values.
PROFILES: dict[str, dict[str, object]] = {
    "cpu": {"accelerator": "cpu", "gpus": 0},
    "pytorch-cpu": {"accelerator": "cpu", "gpus": 0},
    "pytorch-cuda": {"accelerator": "cuda", "gpus": 1},
    "pytorch-rocm": {"accelerator": "rocm", "gpus": 1},
    "pytorch-mps": {"accelerator": "mps", "gpus": 1, "gpu_memory_kind": "unified"},
}


_CC = re.compile(r"^\d+(\.\d+)?$")

GPU_MODEL_MAX_LENGTH = 200
"""Longest ``gpu_model`` pattern."""

MAX_SELECTOR_LABELS = 32
"""Most labels one ``selector`` may ask for."""

STORED = {"stored": True}
"""Validation context for specs read back from the store: a pattern stored by an
older version that the pattern engine no longer compiles still parses (it then
matches no GPU) rather than making the job unreadable."""


@functools.lru_cache(maxsize=1024)
def gpu_model_matcher(pattern: str) -> Callable[[str], bool]:
    """A case-insensitive search for ``pattern`` in a GPU name, compiled once.

    The engine is RE2 (docs/adr/0077): matching takes time linear in the name
    whatever the pattern, so no pattern can stall the placement pass. RE2 has
    no backreferences or lookarounds.

    Raises
    ------
    ValueError
        For a pattern RE2 cannot compile, with its reason.
    """
    import re2  # imported when a pattern is first used, so `import gpulayer` stays light

    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else e
        raise ValueError(f"{pattern!r} is not a supported regular expression: {why}") from None
    return lambda name: compiled.search(name) is not None


def compute_capability_tuple(value: str) -> tuple[int, int]:
    """``"8.6"`` -> ``(8, 6)``, for comparisons."""
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


class Resources(RequestModel):
    """What one task needs from a worker.

    ``gpu_memory``, ``gpu_model``, ``min_compute_capability`` and
    ``gpu_memory_kind`` apply to each of the ``gpus`` reserved GPUs.
    ``selector`` lists worker labels that must match exactly.
    """

    profile: str | None = Field(default=None, description=f"one of {', '.join(PROFILES)}")
    gpus: int = Field(default=0, ge=0, le=64, description="number of whole GPUs")
    gpu_memory: ByteSize | None = Field(
        default=None, description="memory of each GPU, e.g. '40GiB'"
    )
    gpu_model: (
        Annotated[str, StringConstraints(min_length=1, max_length=GPU_MODEL_MAX_LENGTH)] | None
    ) = Field(default=None, description="regular expression on the GPU name, e.g. 'A100|H100'")
    accelerator: Accelerator | None = None
    min_compute_capability: str | None = Field(
        default=None, description="CUDA compute capability, '8.0'"
    )
    gpu_memory_kind: Literal["dedicated", "unified"] | None = None
    cpus: float = Field(default=1.0, gt=0, le=1024, description="CPU cores (used for placement)")
    memory: ByteSize | None = Field(default=None, description="host memory, e.g. '8GiB'")
    selector: dict[LabelKey, LabelValue] = Field(default={}, max_length=MAX_SELECTOR_LABELS)
    worker: Name | None = Field(default=None, description="run only on the worker with this name")

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("profile") is not None:
            profile = data["profile"]
            if profile not in PROFILES:
                raise ValueError(f"unknown profile {profile!r}; profiles are {', '.join(PROFILES)}")
            return {**PROFILES[profile], **{k: v for k, v in data.items() if v is not None}}
        return data

    @field_validator("gpu_model")
    @classmethod
    def _regex(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not (info.context or {}).get("stored"):
            gpu_model_matcher(v)
        return v

    @field_validator("min_compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: object) -> object:
        if v is not None and not _CC.match(str(v)):
            raise ValueError(f"{v!r} is not a compute capability like '8.0'")
        return None if v is None else str(v)

    @model_validator(mode="after")
    def _consistent(self) -> "Resources":
        per_gpu = [
            name
            for name in ("gpu_memory", "gpu_model", "min_compute_capability", "gpu_memory_kind")
            if getattr(self, name) is not None
        ]
        if per_gpu and self.gpus == 0:
            raise ValueError(f"{', '.join(per_gpu)} needs gpus >= 1")
        if self.accelerator == "cpu" and self.gpus > 0:
            raise ValueError("accelerator 'cpu' contradicts gpus > 0")
        if self.min_compute_capability is not None and self.accelerator not in (None, "cuda"):
            raise ValueError("min_compute_capability applies to cuda GPUs only")
        if self.accelerator == "mps" and self.gpu_memory_kind == "dedicated":
            raise ValueError("mps GPUs have unified memory, not dedicated")
        return self
