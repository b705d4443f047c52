"""Repro files (round trip, tampering, malformed input) and the `stress` / `replay` commands."""
from __future__ import annotations

import json
import sys
import types

import pytest

from runnercheck.stress.cli.main import main as cli_main
from runnercheck.stress.run.repro import Repro, ReproError
from runnercheck.stress.run.runners import SimpleRunner


def make_repro(**changes) -> Repro:
    from runnercheck.impl.model.weights import preset

    config = preset("micro")
    fields = dict(
        seed=7,
        model={"preset": "micro", "config": config.to_dict()},
        limits=dict(vocab_size=256, max_num_reqs=4, max_model_len=128, max_num_batched_tokens=32, num_kv_blocks=16,
                    block_size=8, max_logprobs=20, max_num_draft_tokens=4),
        scheduler={"max_inflight_steps": 1, "draft_prob": 0.25},
        device="sim",
        lag_policy={"name": "random-drain", "seed": 7, "p_stall": 0.5},
        delay_policy=None,
        mutant=None,
        runner="runnercheck.stress.run.runners:simple_runner",
        steps=3,
        trace=[
            [{"op": "add", "req_id": "r0", "prompt": [1, 2, 3], "params": {"temperature": 0.7, "seed": None, "stop_token_ids": [5]}}],
            [{"op": "preempt", "req_id": "r0"}],
            [{"op": "abort", "req_id": "r0"}],
        ],
        first_divergence="step 2: request 'r0' position 4: expected token 9, got 8",
    )
    fields.update(changes)
    from runnercheck.stress.run.config import RunConfig

    config = RunConfig.from_body(dict(fields, cuda_graphs=fields.get("cuda_graphs", True)))
    return Repro(config, fields["trace"], fields["first_divergence"], {"runnercheck": "test", "device_name": "sim"})


def test_round_trip(tmp_path) -> None:
    repro = make_repro()
    path = repro.save(tmp_path / "sub" / "repro.json")
    loaded = Repro.load(path)
    assert loaded == repro
    assert loaded.runner_limits().num_kv_blocks == 16 and loaded.model_config().vocab_size == 256


def edit(path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(seed=8),
        lambda d: d["trace"][0][0]["prompt"].append(4),
        lambda d: d.update(first_divergence=None),
        lambda d: d.update(checksum="sha256:" + "0" * 64),
    ],
)
def test_tampering_is_detected(tmp_path, tamper) -> None:
    path = make_repro().save(tmp_path / "repro.json")
    edit(path, tamper)
    with pytest.raises(ReproError, match="checksum mismatch"):
        Repro.load(path)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "holds a JSON object"),
        ('{"seed": NaN}', "non-finite"),
        ("{}", "unknown repro version|missing field"),
    ],
)
def test_malformed_text(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ReproError, match=message):
        Repro.load(path)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d.update(version=1), "unknown repro version 1"),
        (lambda d: d.update(steps=4), "recorded trace holds 3 ticks"),
        (lambda d: d.update(steps=0, first_divergence=None), "a replay would compare nothing"),
        (lambda d: d.update(seed=2**63), r"integer in \[0, 2\^63\)"),
        (lambda d: (d["model"]["config"].update(vocab_size=10**9, hidden_size=4096), d["limits"].update(vocab_size=10**9)),
         "parameters, above the maximum"),
        (lambda d: d["limits"].update(num_kv_blocks=10**7), "KV cache"),
        (lambda d: d.update(provenance=None), "field 'provenance'"),
        (lambda d: d.pop("trace"), r"missing field\(s\) \['trace'\]"),
        (lambda d: d.update(extra=1), r"unknown field\(s\) \['extra'\]"),
        (lambda d: d.update(seed="7"), "field 'seed' must be an int"),
        (lambda d: d.update(device="tpu"), "field 'device'"),
        (lambda d: d["limits"].update(block_size=0), "field 'limits'"),
        (lambda d: d["model"]["config"].update(vocab_size=-1), "model.config"),
        (lambda d: d["scheduler"].update(draft_prob=2), "field 'scheduler'"),
        (lambda d: d["trace"][1].append({"op": "explode", "req_id": "r0"}), r"trace\[1\]\[1\]"),
        (lambda d: d["trace"][0][0]["params"].update(temprature=1.0), "unknown sampling params"),
        (lambda d: d["trace"][0][0].update(prompt="abc"), "prompt must be"),
    ],
)
def test_schema_violations_with_a_valid_checksum(change, message: str) -> None:
    from runnercheck.stress.run.repro import checksum

    doc = json.loads(make_repro().to_json())
    doc.pop("checksum")
    change(doc)
    doc["checksum"] = checksum(doc)
    with pytest.raises(ReproError, match=message):
        Repro.from_json(json.dumps(doc))


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ReproError, match="no such file"):
        Repro.load(tmp_path / "nope.json")


# --------------------------------------------------------------------------- the commands


@pytest.fixture
def planted_runner_module(monkeypatch):
    """An importable runner factory whose runner emits one wrong token at step 5."""

    class Planted(SimpleRunner):
        def execute_model(self, sched):
            done = super().execute_model(sched).get()
            if sched.step_id != 5:
                return _Ready(done)
            i = next(i for i, t in enumerate(done.sampled_token_ids) if len(t) == 1)
            sampled = list(done.sampled_token_ids)
            new = (sampled[i][0] + 1) % self.limits.vocab_size
            sampled[i] = (new,)
            self.requests[done.req_ids[i]].tokens[-1] = new
            return _Ready(type(done)(done.step_id, done.req_ids, tuple(sampled), done.logprobs, done.prompt_logprobs, done.nan_flags, done.seeds))

    module = types.ModuleType("planted_runner_for_tests")
    module.factory = lambda weights, limits, device, base_seed: Planted(weights, limits, base_seed)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


class _Ready:
    def __init__(self, out):
        self.out = out

    def get(self):
        return self.out


def stress_args(out_dir, runner: str, *extra: str) -> list[str]:
    return ["stress", "--device", "sim", "--seed", "2", "--steps", "25", "--runner", runner, "--out", str(out_dir), "--no-progress", *extra]


def test_stress_passes_with_the_simple_runner(tmp_path, capsys) -> None:
    pytest.importorskip("runnercheck.reference.runner")
    assert cli_main(stress_args(tmp_path, "runnercheck.stress.run.runners:simple_runner", "--draft-prob", "0.3")) == 0
    out = capsys.readouterr().out
    assert "agree" in out and "tokens / logprobs compared" in out
    assert not (tmp_path / "repro.json").exists()


def test_stress_divergence_writes_a_repro_that_replays(tmp_path, capsys, planted_runner_module) -> None:
    pytest.importorskip("runnercheck.reference.runner")
    assert cli_main(stress_args(tmp_path, f"{planted_runner_module}:factory")) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("DIVERGENCE "))[len("DIVERGENCE "):]
    assert line.startswith("step 5: request ") and "expected token" in line
    repro = Repro.load(tmp_path / "repro.json")
    config = repro.config
    assert repro.first_divergence == line and config.device == "sim" and config.lag_policy["name"] == "random-drain"
    assert config.lag_policy["seed"] == 2 and config.steps == len(repro.trace) and config.steps <= 25
    assert repro.provenance["device_name"] == "sim" and "torch" in repro.provenance

    assert cli_main(["replay", str(tmp_path / "repro.json"), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"DIVERGENCE {line}" in out and "the recorded divergence" in out

    # replayed against a fixed runner, the recorded trace no longer diverges
    assert cli_main(["replay", str(tmp_path / "repro.json"), "--runner", "runnercheck.stress.run.runners:simple_runner", "--no-progress"]) == 0
    assert "no divergence any more" in capsys.readouterr().out


def test_replay_of_a_bad_file_is_a_message_not_a_traceback(tmp_path, capsys) -> None:
    path = make_repro().save(tmp_path / "repro.json")
    edit(path, lambda d: d.update(steps=2))
    assert cli_main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "Traceback" not in err
    assert cli_main(["replay", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_replay_of_a_file_that_compares_nothing_is_a_usage_error(tmp_path, capsys) -> None:
    from runnercheck.stress.run.repro import checksum

    doc = json.loads(make_repro().to_json())
    doc.pop("checksum")
    doc.update(steps=0, first_divergence=None)
    doc["checksum"] = checksum(doc)
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(doc))
    assert cli_main(["replay", str(path), "--no-progress"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "a replay would compare nothing" in lines[0] and not captured.out


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--mutant", "no-such-mutant"], "no-such-mutant"),
        (["--runner", "nowhere.at_all:factory"], "module 'nowhere.at_all' not found"),
        (["--lag-policy", "sometimes"], "unknown lag policy"),
        (["--delay-us", "auto"], "calibrates delays on a real GPU"),
    ],
)
def test_stress_setup_errors_exit_2(tmp_path, capsys, extra, message: str) -> None:
    pytest.importorskip("runnercheck.reference.runner")
    args = stress_args(tmp_path, "runnercheck.stress.run.runners:simple_runner")
    args += extra
    assert cli_main(args) == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- replay determinism


def sim_config(runner: str, seed: int, steps: int):
    from runnercheck.impl.model.weights import preset
    from runnercheck.stress.sim.scheduler import SchedulerConfig
    from runnercheck.stress.run.config import RunConfig, default_limits

    config = preset("micro")
    return RunConfig(seed=seed, steps=steps, device="sim", model_preset="micro", model_config=config,
                        limits=default_limits(config), scheduler=SchedulerConfig(1, 0.3),
                        lag_policy={"name": "random-drain", "seed": seed, "p_stall": 0.5}, delay_policy=None,
                        mutant=None, runner=runner)


def record_outputs(config, ops) -> tuple[list, list]:
    from runnercheck.stress.run.harness import checked_run

    seen = []
    findings = checked_run(config, ops, on_step=lambda report: seen.append(report.got))
    assert findings.result.ok, findings.first_divergence_line()
    return seen, findings.trace


@pytest.mark.parametrize("runner,steps", [("runnercheck.stress.run.runners:simple_runner", 30), ("runnercheck.impl.runner:make_runner", 8)])
def test_trace_replay_is_bit_for_bit_on_sim(runner: str, steps: int) -> None:
    """Replaying the recorded trace re-creates every step's output exactly (the async runner on a
    randomly draining sim device included): what `runnercheck replay` relies on."""
    pytest.importorskip("runnercheck.reference.runner")
    pytest.importorskip(runner.split(":")[0])
    from runnercheck.stress.sim.churn import ChurnConfig
    from runnercheck.stress.run.harness import ChurnOps, TraceOps

    config = sim_config(runner, seed=11, steps=steps)
    # greedy/temperature only: what every runner in this repository samples today
    plain = ChurnConfig(top_k_prob=0, top_p_prob=0, min_p_prob=0, penalty_prob=0, logprobs_prob=0,
                        prompt_logprobs_prob=0, add_prob=0.9)
    first, trace = record_outputs(config, ChurnOps(plain))
    assert sum(len(t) for out in first for t in out.sampled_token_ids) > steps // 2
    again, _ = record_outputs(config, TraceOps(trace))
    assert again == first
