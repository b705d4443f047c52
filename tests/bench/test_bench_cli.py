"""`runnercheck bench --quick` is a CPU smoke test: it runs every case and writes valid JSON."""
from __future__ import annotations

import json


from runnercheck.stress.cli.main import main


def test_bench_quick_writes_valid_json(tmp_path):
    rc = main(["bench", "--quick", "--device", "sim", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "bench.json").read_text())
    assert rc == 0, data["failures"]
    cases = {row["case"] for row in data["rows"]}
    assert cases == {"host_cost", "staged_writes", "sampler", "logprobs", "e2e", "spec_ngram", "spec_draft"}
    spec = {r["name"].split(",")[0]: r for r in data["rows"] if r["case"] == "spec_ngram"}
    assert {"decode tokens/s", "acceptance rate", "speedup ngram / off"} <= set(spec)
    assert 0 <= spec["acceptance rate"]["value"] <= 1
    draft = {r["name"].split(",")[0]: r for r in data["rows"] if r["case"] == "spec_draft"}
    assert {"decode tokens/s", "acceptance rate", "speedup draft micro-draft / off", "speedup self-draft micro / off"} <= set(draft)
    # Every arm timed some decode tokens after its untimed warm-up steps.
    rates = [r for r in data["rows"] if r["case"] in ("spec_ngram", "spec_draft") and r["unit"] == "tok/s"]
    assert len(rates) == 5 and all(r["value"] > 0 for r in rates)
    assert all(isinstance(row["value"], (int, float)) for row in data["rows"])
    admitting = [r for r in data["rows"] if r["name"].startswith("runner / baseline host time, admitting steps, ")]
    assert admitting and all("admitting runner" in r["note"] and "other steps runner" in r["note"] for r in admitting)
    general = [r for r in data["rows"] if r["name"].startswith("runner / baseline host time, general steps without an ")]
    assert all("were an admission free" in r["note"] for r in general)  # quick sizes may admit every step
    syncs = [r for r in data["rows"] if r["name"].startswith("host syncs per step")]
    assert syncs and all(r["value"] == 0 for r in syncs)
    assert (tmp_path / "bench.md").read_text().startswith("# runnercheck bench")
    assert data["format_version"] == 1 and data["provenance"]["device_name"] == "sim"
    assert {"runnercheck", "git_commit", "torch", "triton", "numpy"} <= set(data["provenance"])
    assert data["meta"]["complete"] is True and data["meta"]["cases_done"] == list(cases_in_order())


def cases_in_order():
    from runnercheck.bench.cli import CASE_NAMES

    return CASE_NAMES


def test_bench_json_is_written_after_each_case(tmp_path, monkeypatch):
    """A run killed outright keeps what it finished in its temporary folder: bench.json after every case."""
    from runnercheck.bench import cli as bench_cli

    seen = []
    real = bench_cli._write

    def spy(out, meta, rows, failures, prov, *, cases_done, interrupted=None):
        real(out, meta, rows, failures, prov, cases_done=cases_done, interrupted=interrupted)
        seen.append(json.loads((out / "bench.json").read_text())["meta"])

    monkeypatch.setattr(bench_cli, "_write", spy)
    assert main(["bench", "--quick", "--device", "sim", "--only", "staged_writes", "sampler", "--out", str(tmp_path)]) == 0
    assert [(m["cases_done"], m["complete"]) for m in seen] == [(["staged_writes"], False), (["staged_writes", "sampler"], True),
                                                                (["staged_writes", "sampler"], True)]


def test_an_interrupted_bench_keeps_the_cases_that_finished(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or SIGTERM from a time limit) in the second case: exit 130, a report marked incomplete with the first."""
    from runnercheck.bench import cli as bench_cli
    from runnercheck.bench.common import Row

    def interrupted(ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "_cases", lambda: {"staged_writes": lambda ctx: [Row("staged_writes", "x", 1.0, "us")],
                                                      "sampler": interrupted})
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--device", "sim", "--only", "staged_writes", "sampler", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGINT) after 1 of 2 case(s)" in err and "Traceback" not in err
    data = json.loads((out / "bench.json").read_text())
    assert data["status"] == "incomplete" and data["meta"]["cases_done"] == ["staged_writes"]
    assert [r["name"] for r in data["rows"]] == ["x"]
    assert (out / "bench.md").read_text().startswith("> **INCOMPLETE REPORT**")
    assert [p.name for p in tmp_path.iterdir()] == ["bench"]


def test_step_kinds_split_the_runner_steps_by_what_the_runner_did():
    """Admitting steps against the baseline's admitting ones; the runner's general steps without an admission (not
    the steady ones) against the baseline's steps without one."""
    from types import SimpleNamespace

    from runnercheck.bench.case_runner import _by_step_kind

    run = SimpleNamespace(host_us=[100.0, 100.0, 60.0, 60.0, 20.0, 20.0],
                          host_admitting=[True, True, False, False, False, False],
                          host_steady=[False, False, False, False, True, True],
                          base_us=[200.0, 200.0, 150.0, 150.0], base_admitting=[True, True, False, False])
    admitting, general = _by_step_kind(run, "tag")
    assert admitting.value == 0.5 and "general 60 us (2), steady 20 us (2)" in admitting.note
    assert general.name.endswith("general steps without an admission, tag") and general.value == 0.4
    run.host_admitting = run.base_admitting = [True] * 6  # every step admits (256 requests, 1% churn): no floor row
    assert len(_by_step_kind(run, "tag")) == 1
