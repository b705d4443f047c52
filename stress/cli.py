"""The `runnercheck` command line: a thin dispatcher.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); only the chosen one is imported.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("stress.verify", "the main job: runner vs oracle under stress, detectors armed, sampler statistics"),
    "stress": ("stress.stress_cmd", "long random churn on one seed; writes a repro file on divergence"),
    "replay": ("stress.replay", "re-run a recorded repro file"),
    "chisq": ("checks.chisq", "chi-square tests of a sampler against the exact distributions"),
    "mutants": ("stress.mutants_cmd", "run the checks against the catalogue of deliberate bugs"),
    "bench": ("bench.cli", "benchmarks (results are data, not tests)"),
    "lint": ("checks.lint", "static scan of hot-path functions for host reads of device data"),
    "env": ("stress.env_cmd", "device kind, torch/triton versions, whether Triton is interpreted"),
}


def prepare_triton_env(argv: list[str]) -> None:
    """Set TRITON_INTERPRET before triton is imported, unless a real GPU will run the kernels."""
    if "TRITON_INTERPRET" in os.environ:
        return
    wants_gpu = False
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            wants_gpu = argv[i + 1] in ("cuda", "auto")
        elif a.startswith("--device="):
            wants_gpu = a.split("=", 1)[1] in ("cuda", "auto")
        else:
            continue
        break
    else:
        wants_gpu = True  # default device is auto
    import torch

    if not (wants_gpu and torch.cuda.is_available()):
        os.environ["TRITON_INTERPRET"] = "1"


def _usage() -> str:
    lines = ["usage: runnercheck COMMAND [options]", "", "commands:"]
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name:<8} {help_text}")
    lines += ["", "`runnercheck COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"runnercheck: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    prepare_triton_env(rest)
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            print(f"runnercheck {name}: not available in this build ({module_name} is missing)", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"runnercheck {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
