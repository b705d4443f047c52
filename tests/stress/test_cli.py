"""The command line: shared options with one rule each, bad arguments exit 2 with one line before
any work, argparse-generated usage, --version, and no import cycle among the project's modules."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch

from runnercheck.stress.cli.main import COMMANDS, main
from runnercheck.stress.cli.options import resolve_device

ROOT = Path(__file__).resolve().parents[2]


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("command", ["verify", "stress", "mutants", "chisq", "bench"])
@pytest.mark.parametrize("seed", ["-1", str(2**63), "abc", "1.5"])
def test_bad_seed_is_one_line_in_every_command(tmp_path, capsys, command: str, seed: str) -> None:
    assert main([command, "--device", "sim", "--seed", seed, "--out", str(tmp_path / "o")]) == 2
    line = one_line_error(capsys)
    assert line.startswith(f"runnercheck {command}: ") and "must be an integer in [0, 2^63)" in line
    assert not (tmp_path / "o").exists()


def test_the_largest_seed_is_accepted_by_the_parser() -> None:
    from runnercheck.stress.cli.options import seed_type

    assert seed_type(str(2**63 - 1)) == 2**63 - 1


@pytest.mark.parametrize("command", ["verify", "stress", "mutants", "chisq", "bench"])
def test_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, command: str) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert main([command, "--device", "sim", "--out", str(target)]) == 2
    assert "exists and is not a folder" in one_line_error(capsys)
    assert target.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_out_under_an_unwritable_folder_is_refused(tmp_path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["stress", "--device", "sim", "--out", str(locked / "x")]) == 2
        assert "not writable" in one_line_error(capsys)
    finally:
        locked.chmod(0o700)


def test_out_under_a_file_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "f").write_text("")
    assert main(["verify", "--device", "sim", "--out", str(tmp_path / "f" / "sub")]) == 2
    assert "cannot be created" in one_line_error(capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["stress", "--steps", "-1"], "--steps"),
        (["stress", "--steps", "0"], "--steps"),  # a run of 0 ticks compares nothing: not a PASS
        (["mutants", "--steps", "0"], "unrecognized arguments: --steps"),  # mutants sizes its own runs
        (["stress", "--draft-prob", "2"], "--draft-prob"),
        (["stress", "--max-num-reqs", "0"], "--max-num-reqs"),
        (["stress", "--max-inflight", "x"], "--max-inflight"),
        (["stress", "--delay-us", "-3"], "--delay-us"),
        (["verify", "--steps", "0"], "--steps"),
        (["verify", "--runs", "-2"], "--runs"),
        (["mutants", "--chisq-samples", "0"], "--chisq-samples"),
        (["stress", "--device", "tpu"], "--device"),
        (["stress", "--no-such-flag"], "unrecognized arguments"),
        (["stress", "--runner", "no_colon"], "--runner"),
        (["verify", "--runner", "dir/file:factory"], "a file spec names a .py file"),
        (["stress", "--proposer", "draft", "--draft-prob", "0.3"], "--draft-prob"),
        (["stress", "--proposer", "draft", "--draft-model", "tiny-draft"], "vocabulary"),
    ],
)
def test_bad_numeric_and_unknown_flags_exit_2_with_one_line(tmp_path, capsys, argv, message: str) -> None:
    argv = [argv[0], "--out", str(tmp_path / "o"), *argv[1:]]
    assert main(argv) == 2
    line = one_line_error(capsys)
    assert line.startswith(f"runnercheck {argv[0]}: ") and message in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["stress", "verify", "replay"])
def test_a_relative_file_runner_spec_is_made_absolute_where_the_command_starts(tmp_path, monkeypatch, command) -> None:
    """A repro file (or a child process) started from another folder must find the same file."""
    import argparse

    import importlib

    from runnercheck.stress.cli.main import command_parser

    monkeypatch.chdir(tmp_path)
    parser = command_parser(command, importlib.import_module(COMMANDS[command].module))
    argv = ["repro.json"] if command == "replay" else []
    args = parser.parse_args([*argv, "--runner", "sub/my_runner.py:make"])
    assert isinstance(args, argparse.Namespace) and args.runner == f"{tmp_path / 'sub' / 'my_runner.py'}:make"
    assert parser.parse_args([*argv, "--runner", "pkg.mod:make"]).runner == "pkg.mod:make"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys) -> None:
    assert main(["stress", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    assert "torch sees no CUDA device" in one_line_error(capsys)


def test_device_auto_is_one_rule() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "sim")
    assert resolve_device("cpu") == "cpu" and resolve_device("sim") == "sim"


def test_top_level_usage_is_generated_and_lists_every_command(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: runnercheck")
    for name, cmd in COMMANDS.items():
        assert name in out and cmd.help[:30] in out
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in one_line_error(capsys)


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("runnercheck ")


def test_command_help_shows_shared_options(capsys) -> None:
    assert main(["stress", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--device", "--seed", "--out", "--no-progress", "--eager", "--verbose", "--quiet"):
        assert flag in out


def test_library_code_never_raises_systemexit() -> None:
    """Outside the CLI and ``if __name__ == "__main__":`` script entries."""
    offenders = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("impl", "reference", "checks", "stress") or rel.as_posix() == "stress/cli/main.py":
            continue
        tree = ast.parse(path.read_text())
        script_entry = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        for node in (n for top in tree.body if top not in script_entry for n in ast.walk(top)):
            if isinstance(node, ast.Raise) and "SystemExit" in ast.unparse(node):
                offenders.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "quit"):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders


# --------------------------------------------------------------------------- import graph

PACKAGES = ("impl", "reference", "checks", "stress", "bench")


def _module_name(path: Path) -> str:
    parts = ("runnercheck", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, type_checking: bool = False) -> set[str]:
    """Every module named by an import; those under ``if TYPE_CHECKING:`` (never run) only with ``type_checking``."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                names.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names.add(child.module)
                names.update(f"{child.module}.{a.name}" for a in child.names)
            visit(child)

    visit(tree)
    return names


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        deps = {owner(n) for n in _imports(ast.parse(path.read_text()), type_checking)}
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_import_cycle_among_the_projects_modules() -> None:
    assert cycles(import_graph()) == []


def test_no_import_cycle_even_through_type_checking_imports() -> None:
    """An annotation-only import back into a module that imports this one is a cycle too (a protocol of what
    is read, or the shared type in a module of its own, breaks it)."""
    assert cycles(import_graph(type_checking=True)) == []


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = import_graph()
    graph["runnercheck.checks.compare"] = graph["runnercheck.checks.compare"] | {"runnercheck.stress.run.harness"}  # harness imports compare
    assert any("runnercheck.checks.compare" in c and "runnercheck.stress.run.harness" in c for c in cycles(graph))


def test_layering_checks_never_imports_stress_and_impl_imports_neither() -> None:
    graph = import_graph()
    bad = [(m, d) for m, deps in graph.items() for d in deps
           if (m.startswith("runnercheck.checks") and d.startswith("runnercheck.stress"))
           or (m.startswith("runnercheck.impl") and d.split(".")[1] in ("checks", "stress", "reference"))]
    assert bad == []


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_a_campaign_exactly(count):
    """No item twice, none lost, campaign order kept within a shard."""
    from runnercheck.stress.cli.options import Shard

    items = list(range(23))
    shares = [Shard(i, count).select(items) for i in range(count)]
    assert sorted(x for share in shares for x in share) == items
    assert all(share == sorted(share) for share in shares)


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/3", "0/0", "1/2/3"])
def test_a_bad_shard_is_one_line_and_exit_2(text, capsys):
    from runnercheck.stress.cli.main import main

    assert main(["mutants", "--device", "sim", "--seeds", "4", f"--shard={text}", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "--shard" in err and "I/N" in err and len(err.strip().splitlines()) <= 2


def test_stress_with_the_draft_model_proposer_reports_its_acceptance(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["stress", "--device", "sim", "--seed", "1", "--steps", "8", "--proposer", "draft", "--draft-model",
                 "micro", "--no-progress", "--in-process", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "draft-model (micro) drafts" in printed and "accepted" in printed


def test_env_names_the_code_it_runs(capsys) -> None:
    """`runnercheck env` leads with the sources' digest: what a result's provenance is matched against by hand."""
    from runnercheck.checks.provenance import source_digest

    assert main(["env", "--device", "cpu", "--no-selftest"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"runnercheck sources {source_digest()} (commit ")
