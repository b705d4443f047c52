"""The README's quickstart, run as written: the commands come from the README itself.

The quickstart's code block is extracted from README.md; each of its commands runs with bash,
after the block's ``export`` lines, in a fresh folder that holds a copy of docs/examples (so
nothing is written into the checkout) and a ``.venv/bin`` whose ``runnercheck`` and ``python`` run
this checkout with the test's interpreter (what ``ci/setup.sh`` installs).  One test per command
(they run side by side under xdist): the correct sampler must pass, the buggy one must fail with
its top-p case rejected, the example runner must agree with the oracle, and the example pytest file
must pass; no command of the block goes unchecked.  Also: every example file the README names
exists, and (slow) the correct sampler passes the whole quick catalogue while the buggy one fails
only cases with a top-p.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"


def quickstart_block() -> str:
    """The bash block under the README's "Quickstart" heading."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## Quickstart[^\n]*\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README has no '## Quickstart' section"
    blocks = re.findall(r"```bash\n(.*?)```", section.group(1), re.S)
    assert len(blocks) == 1, "the quickstart shows exactly one bash block"
    return blocks[0]


def quickstart_commands() -> list[str]:
    return [line for line in quickstart_block().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _fake_venv(folder: Path) -> None:
    """``.venv/bin/{python,runnercheck}`` as ci/setup.sh makes them, running this checkout."""
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    checkout = shlex.quote(str(REPO))
    py = shlex.quote(sys.executable)
    for name, run in (("python", f"{py}"), ("runnercheck", f"{py} -m runnercheck.stress.cli.main")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}"{checkout}\nexec {run} "$@"\n')
        script.chmod(0o755)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET") and not k.startswith("PYTEST_")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # quick CPU sizes; the CLI and the plugin turn the interpreter on themselves
    return env


# What each command of the quickstart must do, by the example it names.
EXPECTED = ("good_sampler", "buggy_sampler", "my_runner", "pytest")


def setup_lines() -> list[str]:
    """The block's ``export`` lines: every command runs after them, as in one shell session."""
    return [c for c in quickstart_commands() if c.startswith("export ")]


def command_for(key: str) -> str:
    [cmd] = [c for c in quickstart_commands() if not c.startswith("export ") and key in c]
    return cmd


def test_every_quickstart_command_is_checked() -> None:
    commands = [c for c in quickstart_commands() if not c.startswith("export ")]
    assert sorted(commands) == sorted(command_for(key) for key in EXPECTED), commands


def run_step(folder: Path, key: str) -> tuple[str, int, str]:
    """The README's export lines and its command for ``key``, run with bash in ``folder``."""
    cmd = command_for(key)
    done = subprocess.run(["bash", "-c", "\n".join([*setup_lines(), cmd])], cwd=folder, env=_env(),
                          capture_output=True, text=True, timeout=900)
    return cmd, done.returncode, done.stdout + done.stderr


def _report(folder: Path, command: str) -> dict:
    words = shlex.split(command)
    return json.loads((folder / words[words.index("--out") + 1] / "chisq.json").read_text())


@pytest.fixture
def fresh_folder(tmp_path: Path) -> Path:
    """A fresh folder laid out like the checkout for the quickstart: docs/examples and .venv/bin."""
    shutil.copytree(EXAMPLES, tmp_path / "docs" / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    _fake_venv(tmp_path)
    return tmp_path


def test_quickstart_correct_sampler_passes(fresh_folder: Path) -> None:
    cmd, rc, out = run_step(fresh_folder, "good_sampler")
    assert rc == 0 and out.rstrip().endswith("PASS"), out[-3000:]
    good = _report(fresh_folder, cmd)
    assert good["passed"] and good["num_tests"] >= 1 and good["sampler"] == "good_sampler:sample"


def test_quickstart_buggy_sampler_fails_with_its_top_p_case_rejected(fresh_folder: Path) -> None:
    cmd, rc, out = run_step(fresh_folder, "buggy_sampler")
    assert rc == 1 and out.rstrip().endswith("FAIL"), out[-3000:]
    buggy = _report(fresh_folder, cmd)
    assert [t["name"] for t in buggy["tests"] if not t["passed"]] == ["top-p-v97"]
    assert "top-p-v97" in out  # the terminal summary names the rejected case, as the README says


def test_quickstart_example_runner_agrees_with_the_oracle(fresh_folder: Path) -> None:
    cmd, rc, out = run_step(fresh_folder, "my_runner")
    assert rc == 0 and "my_runner:make_runner" in out, out[-3000:]


def test_quickstart_example_pytest_file_passes(fresh_folder: Path) -> None:
    cmd, rc, out = run_step(fresh_folder, "pytest")
    assert rc == 0 and re.search(r"\b2 passed\b", out), out[-3000:]


def test_every_example_the_readme_names_exists() -> None:
    named = set(re.findall(r"(\w+)\.py\b", (REPO / "README.md").read_text()))
    named |= {m.split(":")[0] for m in re.findall(r"--(?:sampler|runner|runnercheck-runner) (\w+:\w+)", (REPO / "README.md").read_text())}
    for name in sorted(named):
        assert (EXAMPLES / f"{name}.py").is_file(), f"README names {name}.py, which docs/examples does not hold"
    for cmd in quickstart_commands():
        for word in shlex.split(cmd):
            if word.startswith("docs/"):
                assert (REPO / word).exists(), f"the quickstart names {word}, which does not exist"


@pytest.mark.slow
def test_example_samplers_on_the_whole_quick_catalogue(tmp_path: Path) -> None:
    """The correct example passes every quick case it supports; the buggy one fails every binding top-p case."""
    env = _env() | {"PYTHONPATH": os.pathsep.join([str(EXAMPLES), str(REPO)])}
    reports = {}
    for name in ("good_sampler", "buggy_sampler"):
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "runnercheck.stress.cli.main", "chisq", "--quick", "--device", "cpu",
                               "--no-calibration", "--no-power", "--sampler", f"{name}:sample", "--out", str(out)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        reports[name] = (done.returncode, json.loads((out / "chisq.json").read_text()))
    rc, good = reports["good_sampler"]
    assert rc == 0 and good["passed"] and good["num_tests"] >= 20
    rc, buggy = reports["buggy_sampler"]
    failed = {t["name"]: t["config"]["params"] for t in buggy["tests"] if not t["passed"]}
    assert rc == 1 and "top-p-v97" in failed
    assert all(params.get("top_p", 1.0) < 1.0 for params in failed.values()), failed
