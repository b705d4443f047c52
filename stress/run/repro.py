"""Repro files: everything needed to re-run a failing run, as one checked JSON document.

Format (version 2)::

    {
      "version": 2,
      ...every field of `runnercheck.stress.run.config.RunConfig.to_body` (the run configuration):
      "seed": 7,                       # weights, device lag policy, scheduler and base seed
      "model": {"preset": "micro", "config": {...ModelConfig...}},
      "limits": {...RunnerLimits...},
      "scheduler": {"max_inflight_steps": 1, "draft_prob": 0.0},
      "device": "sim",
      "lag_policy": {...LagPolicy.describe()...} | null,   # null on cuda/cpu
      "delay_policy": {...} | null,    # injected device delays (cuda)
      "mutant": "name" | null,
      "runner": "package.module:factory",
      "steps": 120,                    # scheduler ticks run; at most len(trace); 0 only with a divergence
      "cuda_graphs": true,
      "logits_fault": {...stress.faults.LogitsFault.describe()...} | null,
      "draft_source": "random" | "oracle",   # stress.drafts
      "csan": true,                    # optional (absent: false): run under the CUDA stream sanitizer
      ...and the recording:
      "trace": [[{op}, ...], ...],     # one list of operations per tick (stress.churn)
      "first_divergence": "step 12: request 'r3' position 17: expected token 45, got 112" | null,
      "provenance": {...checks.provenance.provenance()...},
      "checksum": "sha256:..."         # over the canonical JSON of every other field
    }

`Repro.load` validates the schema and the checksum and raises `ReproError` with a message naming
the file and the field; it never lets a KeyError / TypeError / JSONDecodeError escape.  A file of
another format version is refused with the version named.  The checksum catches hand edits (a
tampered trace or seed would replay something else than what was recorded); it is not a security
measure.  Model and KV sizes are checked against `runnercheck.stress.run.config`'s stated maxima here, before
anything is allocated.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from runnercheck.impl.interface import RunnerLimits
from runnercheck.impl.model.weights import ModelConfig, WeightsError
from runnercheck.stress.sim.churn import TraceError, validate_operation
from runnercheck.stress.run.config import BODY_FIELDS, OPTIONAL_BODY_FIELDS, RunConfig, RunSetupError, check_model_size, seed_problem

REPRO_VERSION = 2
RECORDING_FIELDS = ("trace", "first_divergence", "provenance", "version")


class ReproError(ValueError):
    """A repro file that cannot be used: unreadable, malformed, wrong version, or tampered with."""


@dataclass
class Repro:
    config: RunConfig
    trace: list
    first_divergence: str | None
    provenance: dict = field(default_factory=dict)
    version: int = REPRO_VERSION

    # ---------------------------------------------------------------- (de)serialisation
    def body(self) -> dict:
        return dict(self.config.to_body(), trace=self.trace, first_divergence=self.first_divergence,
                    provenance=self.provenance, version=self.version)

    def to_json(self) -> str:
        body = self.body()
        _check_schema(body, "<in memory>")
        doc = dict(body, checksum=checksum(body))
        return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> "Repro":
        try:
            doc = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise ReproError(f"{source}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
        except ValueError as e:
            raise ReproError(f"{source}: {e}") from None
        if not isinstance(doc, dict):
            raise ReproError(f"{source}: a repro file holds a JSON object, got {type(doc).__name__}")
        if "version" in doc and doc["version"] != REPRO_VERSION:
            raise ReproError(f"{source}: unknown repro version {doc['version']!r} (this build reads version {REPRO_VERSION})")
        if "checksum" not in doc:
            raise ReproError(f"{source}: missing field 'checksum'")
        stored = doc.pop("checksum")
        _check_schema(doc, source)
        if stored != checksum(doc):
            raise ReproError(f"{source}: checksum mismatch: the file was edited after it was written (fields changed since recording)")
        try:
            config = RunConfig.from_body(doc)
        except RunSetupError as e:
            raise ReproError(f"{source}: {e}") from None
        return cls(config, doc["trace"], doc["first_divergence"], doc["provenance"], doc["version"])

    @classmethod
    def load(cls, path: str | Path) -> "Repro":
        path = Path(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ReproError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ReproError(f"{path}: cannot read ({e})") from None
        return cls.from_json(text, str(path))

    # ---------------------------------------------------------------- typed views
    def model_config(self) -> ModelConfig:
        return self.config.model_config

    def runner_limits(self) -> RunnerLimits:
        return self.config.limits


def checksum(body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name} is not allowed in a repro file")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_SCALAR_FIELDS: dict[str, tuple[str, Any]] = {
    "version": ("an int", _is_int),
    "seed": ("an integer in [0, 2^63)", lambda v: seed_problem(v) is None),
    "cuda_graphs": ("a bool", lambda v: isinstance(v, bool)),
    "provenance": ("an object", lambda v: isinstance(v, dict)),
    "logits_fault": ("a logits fault object or null", lambda v: v is None or isinstance(v, dict)),
    "draft_source": ("'random' or 'oracle'", lambda v: v in ("random", "oracle")),
    "csan": ("a bool", lambda v: isinstance(v, bool)),
    "device": ("one of cuda, cpu, sim", lambda v: v in ("cuda", "cpu", "sim")),
    "runner": ("a 'package.module:factory' string", lambda v: isinstance(v, str) and v.count(":") == 1),
    "steps": ("an int >= 0", lambda v: _is_int(v) and v >= 0),
    "mutant": ("a string or null", lambda v: v is None or (isinstance(v, str) and v != "")),
    "first_divergence": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "model": ("an object", lambda v: isinstance(v, dict)),
    "limits": ("an object", lambda v: isinstance(v, dict)),
    "scheduler": ("an object", lambda v: isinstance(v, dict)),
    "lag_policy": ("an object or null", lambda v: v is None or isinstance(v, dict)),
    "delay_policy": ("an object or null", lambda v: v is None or isinstance(v, dict)),
    "trace": ("a list of lists", lambda v: isinstance(v, list) and all(isinstance(t, list) for t in v)),
}


def _check_schema(doc: dict, source: str) -> None:
    def bad(msg: str) -> ReproError:
        return ReproError(f"{source}: {msg}")

    names = set(BODY_FIELDS) | set(RECORDING_FIELDS) | set(OPTIONAL_BODY_FIELDS)
    missing = names - set(OPTIONAL_BODY_FIELDS) - set(doc)
    if missing:
        raise bad(f"missing field(s) {sorted(missing)}")
    unknown = set(doc) - names
    if unknown:
        raise bad(f"unknown field(s) {sorted(unknown)}")
    if doc["version"] != REPRO_VERSION:
        raise bad(f"unknown repro version {doc['version']!r} (this build reads version {REPRO_VERSION})")
    for name, (what, ok) in _SCALAR_FIELDS.items():
        if name in OPTIONAL_BODY_FIELDS and name not in doc:
            continue
        if not ok(doc[name]):
            raise bad(f"field {name!r} must be {what}, got {doc[name]!r}")
    model = doc["model"]
    if set(model) != {"preset", "config"} or not (model["preset"] is None or isinstance(model["preset"], str)):
        raise bad("field 'model' must be {'preset': name or null, 'config': {...}}")
    try:
        config = ModelConfig.from_dict(model["config"]) if isinstance(model["config"], dict) else None
    except (WeightsError, TypeError) as e:
        raise bad(f"field 'model.config': {e}") from None
    if config is None:
        raise bad("field 'model.config' must be an object")
    limit_names = {f.name for f in fields(RunnerLimits)}
    lim = doc["limits"]
    if set(lim) != limit_names or not all(_is_int(v) and v > 0 for v in lim.values()):
        raise bad(f"field 'limits' must hold positive ints for exactly {sorted(limit_names)}")
    if lim["vocab_size"] != config.vocab_size:
        raise bad(f"limits.vocab_size {lim['vocab_size']} differs from the model's {config.vocab_size}")
    sched = doc["scheduler"]
    # prefix_caching is optional: repros recorded before prefix caching replay with it off.
    if not {"max_inflight_steps", "draft_prob"} <= set(sched) <= {"max_inflight_steps", "draft_prob", "prefix_caching",
                                                                  "ngram_spec_tokens", "draft_model"} \
            or not _is_int(sched["max_inflight_steps"]) \
            or sched["max_inflight_steps"] < 0 or isinstance(sched["draft_prob"], bool) \
            or not isinstance(sched["draft_prob"], (int, float)) or not 0 <= sched["draft_prob"] <= 1 \
            or not isinstance(sched.get("prefix_caching", False), bool) \
            or not _is_int(sched.get("ngram_spec_tokens", 0)) or sched.get("ngram_spec_tokens", 0) < 0 \
            or not isinstance(sched.get("draft_model", ""), str):
        raise bad("field 'scheduler' must be {'max_inflight_steps': int >= 0, 'draft_prob': number in [0, 1]"
                  "[, 'prefix_caching': bool][, 'ngram_spec_tokens': int >= 0][, 'draft_model': str]}")
    for name in ("lag_policy", "delay_policy"):
        if doc[name] is not None and not isinstance(doc[name].get("name"), str):
            raise bad(f"field {name!r} must name its policy ('name': string)")
    if doc["logits_fault"] is not None:
        from runnercheck.stress.sim.faults import FaultSpecError, LogitsFault

        try:
            LogitsFault.from_dict(doc["logits_fault"])
        except FaultSpecError as e:
            raise bad(f"field 'logits_fault': {e}") from None
    if doc["steps"] == 0 and doc["first_divergence"] is None:
        # 0 ticks record something only when the run failed before its first tick (building the runner)
        raise bad("field 'steps' is 0 and no divergence is recorded: a replay would compare nothing")
    if doc["steps"] > len(doc["trace"]):
        raise bad(f"field 'steps' is {doc['steps']} but the recorded trace holds {len(doc['trace'])} ticks")
    try:
        check_model_size(config, RunnerLimits(**lim))
    except RunSetupError as e:
        raise bad(str(e)) from None
    for t, ops in enumerate(doc["trace"]):
        for k, op in enumerate(ops):
            try:
                validate_operation(op)
            except TraceError as e:
                raise bad(f"trace[{t}][{k}]: {e}") from None
