"""Device names: parse ``/cpu:0``, ``/device:CPU:1`` and the full
``/job:localhost/replica:0/task:0/device:CPU:0`` form, and print the full form."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DeviceSpec", "canonical_device"]

_PART = re.compile(
    r"^(?:job:(?P<job>[A-Za-z_][\w.-]*)|replica:(?P<replica>\d+)|task:(?P<task>\d+)|"
    r"device:(?P<dtype>[A-Za-z]+):(?P<dindex>\d+|\*)|(?P<short>[A-Za-z]+):(?P<sindex>\d+|\*))$"
)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A (possibly partial) device specification; ``None`` fields are unspecified."""

    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None

    @classmethod
    def from_string(cls, spec: str) -> DeviceSpec:
        """Parse a device string; ``ValueError`` naming it when malformed."""
        if not isinstance(spec, str):
            raise TypeError(f"device must be a string, got {type(spec).__name__}")
        fields: dict[str, object] = {}
        text = spec.strip()
        if not text:
            return cls()
        if not text.startswith("/"):
            text = "/" + text
        for part in text[1:].split("/"):
            m = _PART.match(part)
            if m is None:
                raise ValueError(f"malformed device specification {spec!r} (at {part!r})")
            g = m.groupdict()
            if g["job"] is not None:
                fields["job"] = g["job"]
            elif g["replica"] is not None:
                fields["replica"] = int(g["replica"])
            elif g["task"] is not None:
                fields["task"] = int(g["task"])
            else:
                dtype = (g["dtype"] or g["short"]).upper()
                index = g["dindex"] or g["sindex"]
                fields["device_type"] = dtype
                fields["device_index"] = None if index == "*" else int(index)
        return cls(**fields)  # type: ignore[arg-type]

    def to_string(self) -> str:
        """The spec in TensorFlow's form (only the specified parts)."""
        parts = []
        if self.job is not None:
            parts.append(f"/job:{self.job}")
        if self.replica is not None:
            parts.append(f"/replica:{self.replica}")
        if self.task is not None:
            parts.append(f"/task:{self.task}")
        if self.device_type is not None:
            index = "*" if self.device_index is None else self.device_index
            parts.append(f"/device:{self.device_type}:{index}")
        return "".join(parts)

    def __str__(self) -> str:
        return self.to_string()


def canonical_device(
    device_type: str, index: int, job: str = "localhost", replica: int = 0, task: int = 0
) -> str:
    """The full name of a device: ``/job:localhost/replica:0/task:0/device:CPU:0``."""
    return f"/job:{job}/replica:{replica}/task:{task}/device:{device_type}:{index}"
