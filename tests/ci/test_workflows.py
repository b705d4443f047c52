"""The CI workflows (.github/workflows/*.yml): valid YAML, the jobs the README and DESIGN promise,
and every `runnercheck` invocation names a real command with flags that command declares."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # a dependency of the package; absent from bare GPU images

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(doc, dict) and doc.get("jobs"), name
    return doc


def _triggers(doc: dict) -> dict:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    return doc.get("on", doc.get(True)) or {}


def _runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def _readme_test_command() -> str:
    """The indented command under the README's "Run the tests" line."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"Run the tests[^\n]*\n\n((?:    [^\n]+\n)+)", text)
    assert match, "README names no test command"
    return match.group(1).strip()


def test_every_workflow_parses_with_jobs_and_steps() -> None:
    files = sorted(p.name for p in WORKFLOWS.glob("*.yml"))
    assert files == ["cpu.yml", "gpu.yml", "nightly.yml"]
    for name in files:
        doc = _load(name)
        assert _triggers(doc), name
        for job_name, job in doc["jobs"].items():
            assert job.get("runs-on") and job.get("steps"), (name, job_name)
            assert all(("run" in s) != ("uses" in s) for s in job["steps"]), (name, job_name)


def test_cpu_job_runs_the_readmes_test_command() -> None:
    command = _readme_test_command()
    assert command == "bash ci/test.sh"
    doc = _load("cpu.yml")
    assert {"push", "pull_request"} <= set(_triggers(doc))
    [job] = doc["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert any(run.split("\n")[0].startswith(command) for run in _runs(job))


def test_gpu_job_runs_on_self_hosted_gpu_runners() -> None:
    [job] = _load("gpu.yml")["jobs"].values()
    assert set(job["runs-on"]) == {"self-hosted", "gpu"}
    runs = "\n".join(_runs(job))
    assert "pytest -m gpu" in runs and "runnercheck verify --device cuda --quick" in runs


def test_nightly_runs_stress_seeds_chisq_mutants_and_uploads_reports() -> None:
    doc = _load("nightly.yml")
    assert "schedule" in _triggers(doc)
    gpu = doc["jobs"]["gpu"]
    assert set(gpu["runs-on"]) == {"self-hosted", "gpu"}
    runs = "\n".join(_runs(gpu))
    assert re.search(r"for seed in .*\n.*runnercheck stress --device cuda --seed \"\$seed\"", runs)
    assert "runnercheck chisq --device cuda --deep-tail" in runs and "--quick" not in runs.split("chisq")[1].split("\n")[0]
    assert "runnercheck mutants --device cuda" in runs
    for job in doc["jobs"].values():
        [upload] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
        assert upload["if"] == "always()"
        paths = upload["with"]["path"]
        assert "junit.xml" in paths and "repro" in paths
    assert "report.html" in gpu["steps"][-1]["with"]["path"]


def _invocations() -> list[tuple[str, list[str]]]:
    found = []
    for path in WORKFLOWS.glob("*.yml"):
        for job in _load(path.name)["jobs"].values():
            for run in _runs(job):
                text = re.sub(r"\\\n\s*", " ", run)
                for match in re.finditer(r"runnercheck (\w+)([^\n|;]*)", text):
                    found.append((match.group(1), shlex.split(match.group(2))))
    return found


@pytest.mark.parametrize("command", ["verify", "stress", "chisq", "mutants"])
def test_workflow_invocations_use_declared_flags(command: str) -> None:
    from runnercheck.stress.cli.main import main

    calls = [args for name, args in _invocations() if name == command]
    assert calls, f"no workflow runs runnercheck {command}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):  # argparse's --help may exit
        main([command, "--help"])
    declared = set(re.findall(r"--[a-z][a-z0-9-]*", out.getvalue()))
    for args in calls:
        flags = {a.split("=")[0] for a in args if a.startswith("--")}
        assert flags <= declared, f"runnercheck {command}: undeclared {sorted(flags - declared)}"
