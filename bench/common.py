"""What every benchmark case shares: its context and its result rows."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from impl.device import Device


@dataclass
class BenchContext:
    device: Device
    quick: bool
    seed: int = 0


@dataclass
class Row:
    case: str
    name: str
    value: float
    unit: str
    target: str | None = None
    met: bool | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)
