"""`runnercheck env`: what this machine offers, plus a device self-test."""
from __future__ import annotations

import argparse
import platform


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "sim"],
                        help="auto: cuda when torch sees a GPU, else sim (the same rule in every command)")
    parser.add_argument("--no-selftest", action="store_true", help="skip the device self-test")


def run(args: argparse.Namespace) -> int:
    import torch
    import triton

    from runnercheck.checks.provenance import git_commit, source_digest
    from runnercheck.impl.device import Device, triton_interpreted

    dev = Device(args.device, seed=0)
    print(f"runnercheck sources {source_digest()} (commit {git_commit() or 'none: not a runnercheck checkout'})")
    print(f"python      {platform.python_version()}")
    print(f"torch       {torch.__version__} (cuda available: {torch.cuda.is_available()})")
    print(f"triton      {triton.__version__} (interpreted: {triton_interpreted()})")
    print(f"device      {dev.kind} {dev.torch_device}")
    if torch.cuda.is_available():
        print(f"gpu         {torch.cuda.get_device_name(0)}")
    if args.no_selftest:
        return 0
    ok = device_selftest(dev)
    print(f"self-test   {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def device_selftest(dev) -> bool:
    """Round-trip a pinned buffer through the device with one event: the value must survive."""
    import torch

    host = dev.pinned(16, torch.int64)
    host.copy_(torch.arange(16))
    buf = dev.empty(16, torch.int64)
    out = dev.pinned(16, torch.int64)
    dev.enqueue(lambda: buf.copy_(host, non_blocking=True), "h2d")
    dev.enqueue(lambda: buf.mul_(3), "mul")
    dev.enqueue(lambda: out.copy_(buf, non_blocking=True), "d2h")
    ev = dev.record_event()
    ev.synchronize()
    return bool(torch.equal(out, torch.arange(16) * 3))
