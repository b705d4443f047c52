"""The typed configuration of one differential run -- also the body of a repro file.

`RunConfig` holds everything that determines a run apart from its operation source (random
churn or a recorded trace): seed, model, limits, scheduler knobs, device kind and its lag
(``sim``) or injected-delay (``cuda``) policy, mutant, runner spec, tick count and whether the
runner may use CUDA graphs, and whether it runs under the CUDA stream sanitizer.  `RunConfig.to_body` / `RunConfig.from_body` are the repro file's
fields (`runnercheck.stress.run.repro`), so a recorded run rebuilds exactly.

Also here, because every front-end needs them with one meaning:

* `check_seed`: seeds are ints in ``[0, 2**63)`` (the runner packs them into int64), one message;
* `default_limits`: the small limits that make the scheduler chunk prefills and run out of blocks;
* `RandomDelay`, `TargetedDelay`, `delay_policy_from_dict`: the device-delay policies of cuda race
  runs (`runnercheck.stress.sim.races`): random delays before steps, or delays right before the last device reader
  of a targeted resource (`runnercheck.impl.lag_policies.DELAY_TARGETS`, the sim twin of which is the
  ``hold-at-target`` lag policy);
* `check_model_size`: the stated maximum a recorded model may have before anything is allocated.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Callable

from runnercheck.impl.interface import RunnerLimits
from runnercheck.impl.model.weights import ModelConfig, WeightsError
from runnercheck.stress.sim.scheduler import SchedulerConfig, SchedulerSimError

SEED_LIMIT = 2**63
DEVICE_KINDS = ("cuda", "cpu", "sim")

# The biggest model and KV cache a repro may ask for (qwen3-0.6b-sized with room to spare): a
# hand-made or corrupted file cannot make `replay` allocate more than this.
MAX_MODEL_PARAMETERS = 2_000_000_000
MAX_KV_TOKENS = 1 << 22
MAX_NUM_REQS = 4096


class RunSetupError(RuntimeError):
    """A configuration that cannot be built (bad seed, unknown mutant, bad policy, runner spec...)."""


def seed_problem(seed: Any) -> str | None:
    """None for a valid seed, else the one message every command prints."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        return f"seed {seed!r} must be an integer in [0, 2^63)"
    return None


def check_seed(seed: Any) -> int:
    problem = seed_problem(seed)
    if problem:
        raise RunSetupError(problem)
    return seed


def default_limits(config: ModelConfig, *, max_num_reqs: int = 4, block_size: int = 8, num_kv_blocks: int = 16,
                   max_num_batched_tokens: int = 32) -> RunnerLimits:
    """Small limits that make the scheduler chunk prefills and run out of KV blocks under churn."""
    return RunnerLimits(
        vocab_size=config.vocab_size,
        max_num_reqs=max_num_reqs,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
    )


def model_parameters(c: ModelConfig) -> int:
    """Weights a `ModelConfig` allocates (embedding, head unless tied, every layer's matrices)."""
    attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return embed + c.num_layers * (attn + mlp)


def check_model_size(config: ModelConfig, limits: RunnerLimits) -> None:
    """`RunSetupError` when a model or KV cache exceeds the stated maxima (checked before allocating)."""
    n = model_parameters(config)
    if n > MAX_MODEL_PARAMETERS:
        raise RunSetupError(f"model has {n:,} parameters, above the maximum {MAX_MODEL_PARAMETERS:,} a run may allocate")
    if limits.num_kv_blocks * limits.block_size > MAX_KV_TOKENS:
        raise RunSetupError(f"KV cache of {limits.num_kv_blocks} x {limits.block_size} tokens exceeds the maximum "
                            f"{MAX_KV_TOKENS} tokens a run may allocate")
    if limits.max_num_reqs > MAX_NUM_REQS:
        raise RunSetupError(f"max_num_reqs {limits.max_num_reqs} exceeds the maximum {MAX_NUM_REQS}")


class RandomDelay:
    """Injected device delays (cuda): before a step, with probability ``p``, up to ``max_us`` µs."""

    def __init__(self, seed: int, max_us: float, p: float = 0.5):
        self.seed, self.max_us, self.p = seed, max_us, p
        self.rng = random.Random(seed)

    @classmethod
    def from_dict(cls, d: dict) -> "RandomDelay":
        if d.get("name") != "random-delay":
            raise RunSetupError(f"unknown delay policy {d!r}")
        try:
            return cls(int(d["seed"]), float(d["max_us"]), float(d.get("p", 0.5)))
        except (KeyError, TypeError, ValueError) as e:
            raise RunSetupError(f"delay policy {d!r}: {e}") from None

    def describe(self) -> dict:
        return {"name": "random-delay", "seed": self.seed, "max_us": self.max_us, "p": self.p}

    def hook(self, device: Any) -> Callable:
        def before_enqueue(_sched: Any) -> None:
            if self.rng.random() < self.p:
                device.inject_delay(self.rng.uniform(0.0, self.max_us))

        return before_enqueue


class TargetedDelay:
    """Injected device delays (cuda) aimed at resources: right before the last device reader of a
    resource in ``targets`` (`runnercheck.impl.lag_policies.DELAY_TARGETS`: its ``Device.enqueue`` labels),
    with probability ``p``, up to ``max_us`` µs -- so the host reaches the resource's next reuse
    while its reader is still queued behind the delay."""

    def __init__(self, seed: int, max_us: float, p: float = 0.5, targets: Any = None):
        from runnercheck.impl.lag_policies import DELAY_TARGETS, LagPolicyError, check_delay_targets

        try:
            self.targets = check_delay_targets(DELAY_TARGETS if targets is None else targets)
        except LagPolicyError as e:
            raise RunSetupError(str(e)) from None
        self.seed, self.max_us, self.p = seed, max_us, p
        self.rng = random.Random(seed)
        self.delays: dict[str, int] = {t: 0 for t in self.targets}  # delays injected per target

    @classmethod
    def from_dict(cls, d: dict) -> "TargetedDelay":
        try:
            return cls(int(d["seed"]), float(d["max_us"]), float(d.get("p", 0.5)), d.get("targets"))
        except (KeyError, TypeError, ValueError) as e:
            raise RunSetupError(f"delay policy {d!r}: {e}") from None

    def describe(self) -> dict:
        return {"name": "targeted-delay", "seed": self.seed, "max_us": self.max_us, "p": self.p, "targets": list(self.targets)}

    def hook(self, device: Any) -> Callable:
        """Wrap ``device.enqueue`` (this device instance only) to delay before each targeted reader;
        returns the per-step hook, which has nothing left to do."""
        from runnercheck.impl.lag_policies import delay_target_of

        enqueue = device.enqueue

        def enqueue_after_delay(fn: Callable[[], None], label: str = "") -> None:
            target = delay_target_of(label, self.targets)
            if target is not None and self.rng.random() < self.p:
                self.delays[target] += 1
                device.inject_delay(self.rng.uniform(0.0, self.max_us))
            enqueue(fn, label)

        device.enqueue = enqueue_after_delay
        return lambda _sched: None


def delay_policy_from_dict(d: dict) -> RandomDelay | TargetedDelay:
    """The delay policy a ``delay_policy`` dict (a repro field) describes; `RunSetupError` if unknown."""
    name = d.get("name") if isinstance(d, dict) else None
    if name == "targeted-delay":
        return TargetedDelay.from_dict(d)
    return RandomDelay.from_dict(d)


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a differential run, apart from the operation source."""

    seed: int
    steps: int  # scheduler ticks (at most one step each)
    device: str  # resolved kind: cuda, cpu or sim
    model_preset: str | None
    model_config: ModelConfig
    limits: RunnerLimits
    scheduler: SchedulerConfig
    lag_policy: dict | None
    delay_policy: dict | None
    mutant: str | None
    runner: str
    cuda_graphs: bool = True
    logits_fault: dict | None = None  # `runnercheck.stress.sim.faults.LogitsFault.describe()`: NaN/+Inf rows planted in both
    draft_source: str = "random"  # "oracle": drafts rewritten to the oracle's continuation (`runnercheck.stress.sim.drafts`)
    csan: bool = False  # run under PyTorch's CUDA stream sanitizer (`runnercheck.checks.detectors.csan`); cuda only

    def __post_init__(self) -> None:
        check_seed(self.seed)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise RunSetupError(f"steps {self.steps!r} must be an int >= 0")
        if self.draft_source not in ("random", "oracle"):
            raise RunSetupError(f"draft_source {self.draft_source!r} must be 'random' or 'oracle'")
        if self.device not in DEVICE_KINDS:
            raise RunSetupError(f"device {self.device!r} must be a resolved kind: one of {', '.join(DEVICE_KINDS)}")
        if self.csan and self.device != "cuda":
            from runnercheck.checks.detectors.csan import NEEDS_CUDA

            raise RunSetupError(f"{NEEDS_CUDA} (this run's device is {self.device})")

    # ------------------------------------------------------------------ the repro body
    def to_body(self) -> dict:
        """The repro file's configuration fields (JSON-able)."""
        return {
            "seed": self.seed,
            "model": {"preset": self.model_preset, "config": self.model_config.to_dict()},
            "limits": asdict(self.limits),
            "scheduler": self.scheduler.to_dict(),
            "device": self.device,
            "lag_policy": self.lag_policy,
            "delay_policy": self.delay_policy,
            "mutant": self.mutant,
            "runner": self.runner,
            "steps": self.steps,
            "cuda_graphs": self.cuda_graphs,
            "logits_fault": self.logits_fault,
            "draft_source": self.draft_source,
            # optional: only a CSAN run records it, so repros recorded before it keep their checksum
            **({"csan": True} if self.csan else {}),
        }

    @classmethod
    def from_body(cls, body: dict) -> "RunConfig":
        """Inverse of `to_body` (the body was schema-checked by `runnercheck.stress.run.repro`); `RunSetupError` otherwise."""
        try:
            model_config = ModelConfig.from_dict(body["model"]["config"])
            limits = RunnerLimits(**body["limits"])
            sched = SchedulerConfig.from_dict(body["scheduler"])  # prefix caching as recorded (off in older repros)
        except (WeightsError, SchedulerSimError, KeyError, TypeError) as e:
            raise RunSetupError(f"run configuration: {e}") from None
        return cls(
            seed=body["seed"], steps=body["steps"], device=body["device"], model_preset=body["model"]["preset"],
            model_config=model_config, limits=limits, scheduler=sched, lag_policy=body["lag_policy"],
            delay_policy=body["delay_policy"], mutant=body["mutant"], runner=body["runner"],
            cuda_graphs=body.get("cuda_graphs", True), logits_fault=body.get("logits_fault"),
            draft_source=body.get("draft_source", "random"), csan=body.get("csan", False),
        )


BODY_FIELDS = ("seed", "model", "limits", "scheduler", "device", "lag_policy", "delay_policy", "mutant", "runner",
               "steps", "cuda_graphs", "logits_fault", "draft_source")
OPTIONAL_BODY_FIELDS = ("csan",)  # absent means False


def describe_policy(policy: dict) -> str:
    return " ".join([policy["name"]] + [f"{k}={v}" for k, v in policy.items() if k != "name"])


__all__ = ["RunConfig", "RunSetupError", "RandomDelay", "TargetedDelay", "delay_policy_from_dict", "SEED_LIMIT",
           "BODY_FIELDS", "OPTIONAL_BODY_FIELDS", "DEVICE_KINDS", "check_seed",
           "seed_problem", "default_limits", "check_model_size", "model_parameters", "describe_policy",
           "MAX_MODEL_PARAMETERS", "MAX_KV_TOKENS"]
