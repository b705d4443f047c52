"""The hot-path lint: each planted pattern is found on its line, clean code passes, suppression works."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runnercheck.checks.lint import HOT_PATH, Finding, hot_functions, lint_paths, lint_source
from runnercheck.stress.cli.main import main as cli_main

# Every line that ends in "# <- rule" must be reported with that rule, and no other line.
PLANTED = '''
import numpy as np
import torch
from runnercheck.impl.hotpath import hot_path
from runnercheck.impl import hotpath


class Runner:
    @hot_path
    def step(self, logits: torch.Tensor, n: int):
        best = torch.argmax(logits, dim=-1)
        top = best.item()  # <- host-read
        ids = self.token_ids.tolist()  # <- host-read
        host = logits.cpu()  # <- host-read
        arr = logits.numpy()  # <- host-read
        moved = logits.to("cpu")  # <- host-read
        moved2 = logits.to(device=torch.device("cpu"))  # <- host-read
        as_np = np.asarray(best)  # <- host-read
        torch.cuda.synchronize()  # <- host-sync
        self.event.synchronize()  # <- host-sync
        if best:  # <- tensor-cond
            pass
        if (best > 3).any():  # <- tensor-cond
            pass
        while logits.sum() > 0:  # <- tensor-cond
            break
        assert torch.all(best >= 0)  # <- tensor-cond
        x = 1 if best[0] == 2 else 0  # <- tensor-cond
        if n > 0 and not torch.isnan(logits).any():  # <- tensor-cond
            pass
        if self.seq_lens_t[0]:  # <- tensor-cond
            pass
        k = int(best[0])  # <- tensor-cond
        for _ in range(best.max()):  # <- tensor-cond
            pass
        kept = [i for i in range(n) if best[i] > 0]  # <- tensor-cond
        y = best + 1
        z = y * 2
        if z:  # <- tensor-cond
            pass

        def closure():
            return logits.max().item()  # <- host-read

        return closure


@hotpath.hot_path
def prepare(batch):
    return batch.positions.tolist()  # <- host-read


def execute_model(runner, sched):
    if runner.flags_gpu.all():  # <- tensor-cond
        return None


def not_hot(x: torch.Tensor):
    torch.cuda.synchronize()
    return x.item() if x else x.tolist()
'''

CLEAN = '''
import torch
from runnercheck.impl.hotpath import hot_path


@hot_path
def step(self, x: torch.Tensor, n: int, items: list, maybe):
    y = torch.zeros(n)
    if x is None or y is not None:
        pass
    if x.shape[0] > 0 and x.numel() and x.dim() == 1 and len(x) > 2:
        pass
    if x.dtype == torch.float32 and x.device.type == "cuda" and x.is_cuda:
        pass
    if torch.is_tensor(maybe) and torch.cuda.is_available() and torch.is_floating_point(x):
        pass
    if n > 3 and items and self.enabled and not self.closed:
        pass
    count = 0
    while count < n:
        count += 1
    assert n >= 0, "n"
    k = int(n) + int(x.shape[0])
    for i in range(x.size(0)):
        pass
    return [i for i in items if i] + [k]
'''


def _expected_lines(source: str) -> dict[int, str]:
    return {i: line.rsplit("# <- ", 1)[1].strip() for i, line in enumerate(source.splitlines(), 1) if "# <- " in line}


def test_every_planted_pattern_is_found_on_its_line() -> None:
    findings = lint_source(PLANTED, "planted.py")
    got = {f.line: f.rule for f in findings}
    assert got == _expected_lines(PLANTED)
    by_line = {f.line: f for f in findings}
    closure_line = next(i for i, line in enumerate(PLANTED.splitlines(), 1) if "logits.max().item()" in line)
    assert by_line[closure_line].function == "Runner.step.<locals>.closure"


def test_clean_hot_code_passes() -> None:
    assert lint_source(CLEAN, "clean.py") == []


def test_hot_function_discovery() -> None:
    import ast

    names = [name for name, _ in hot_functions(ast.parse(PLANTED))]
    assert names == ["Runner.step", "prepare", "execute_model"]
    assert "execute_model" in HOT_PATH
    extra = [name for name, _ in hot_functions(ast.parse(PLANTED), (*HOT_PATH, "not_hot"))]
    assert "not_hot" in extra


def test_suppression_needs_a_reason() -> None:
    source = textwrap.dedent('''
        from runnercheck.impl.hotpath import hot_path

        @hot_path
        def step(rows, event):
            a = rows.tolist()  # runnercheck: allow-host-read rows is a host numpy array
            b = event.synchronize(  # runnercheck: allow-host-read backpressure, rare
            )
            c = rows.tolist()  # runnercheck: allow-host-read
            d = rows.tolist()
            return a, b, c, d
    ''')
    findings = lint_source(source, "s.py")
    assert [(f.line, f.rule) for f in findings] == [(9, "host-read"), (9, "suppression"), (10, "host-read")]


def test_finding_format() -> None:
    f = Finding("impl/x.py", 12, 4, "host-read", "`.item()` ...", "Runner.step")
    assert f.format() == "impl/x.py:12: host-read: `.item()` ... (in Runner.step)"


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def test_cli_planted_file_fails_with_the_right_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "planted.py", PLANTED)
    assert cli_main(["lint", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert sorted(int(line.split(":")[1]) for line in out) == sorted(_expected_lines(PLANTED))
    assert all(line.startswith(f"{path}:") for line in out)


def test_cli_clean_directory_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, "clean.py", CLEAN)
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", "also_clean.py", "def f(x):\n    return x.item()\n")  # not hot
    assert cli_main(["lint", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "clean; 1 hot function(s) in 2 file(s)" in captured.err


def test_cli_hot_option_and_bad_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "m.py", "def step(x):\n    return x.item()\n")
    assert cli_main(["lint", str(path)]) == 0
    assert cli_main(["lint", "--hot", "step", str(path)]) == 1
    assert cli_main(["lint", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_reports_syntax_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "broken.py", "def f(:\n")
    assert cli_main(["lint", str(path)]) == 1
    assert f"{path}:1: syntax-error" in capsys.readouterr().out
    with pytest.raises(SyntaxError):
        lint_paths([path])


def test_real_impl_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["lint"])
    out = capsys.readouterr().out
    assert status == 0, f"runnercheck lint found host reads in impl/:\n{out}"
