"""What every benchmark case shares: its context and its result rows."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from runnercheck.impl.device import Device


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


def print_and_write_json(result: dict, out: str | None) -> None:
    """A measuring script's figures: printed as JSON, and written to ``out`` too when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
