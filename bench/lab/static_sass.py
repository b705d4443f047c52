"""The sampler's first split pass as sm_90 machine code, without a GPU: registers, stack, instruction counts, opcodes.

    python -m runnercheck.bench.lab.static_sass [--warps 2] [--maxnreg 80] [--chunk 1024] [--temperature-path]
                                                [--top 30] [--sass FILE]

Compiles `runnercheck.impl.kernels.sampling.sampler_block_kernel` ahead of time for an H100/H200 (``triton.compile`` to a cubin,
Triton's own ptxas; no driver), with the pointer, stride and vocabulary arguments marked 16-divisible as the
device's launches specialise them (without that the compile shows scalar loads the device never runs), and
disassembles it with Triton's bundled nvdisasm.  A static count covers every path the kernel has;
``--temperature-path`` (the sampler's first split pass only) compiles a copy whose general path (penalties,
non-finite rescoring, greedy and filtered rows), candidate refinement and abnormal-temperature division are cut
away, leaving the logits path: close to what a chunk of a penalty-free temperature row of finite logits executes,
the path `bench_sampler`'s temperature rows time.  What it cannot say: time.  Issue slots, latency and occupancy decide that, and only a GPU measures them (run 149's probe: 45 fewer static instructions, the
same time).  Not a product feature: the lab.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Its argument types (the ones not listed are i32 scalars).
BLOCK_POINTERS = dict(
    logits_ptr="*fp32", state_row_ptr="*i32", position_ptr="*i64", temperature_ptr="*fp32", top_k_ptr="*i32",
    top_p_ptr="*fp32", min_p_ptr="*fp32", repetition_ptr="*fp32", frequency_ptr="*fp32", presence_ptr="*fp32",
    seed_ptr="*i64", prompt_mask_ptr="*i32", counts_ptr="*i32", draft_ptr="*i32", part_best_ptr="*fp32",
    part_token_ptr="*i32", part_max_ptr="*fp32", part_flag_ptr="*i32", part_inf_ptr="*i32")

# (module, text in its source, the text's stand-in, required) for --temperature-path: each cut keeps the values the
# rest reads.
TEMPERATURE_PATH_CUTS = (
    ("sampling_select", "    if normal_divisor(temperature):\n"
                        "        if UNFUSED:\n            score = tl.fma(logit, 1.0 / temperature, 0.0)\n        else:\n"
                        "            score = logit * (1.0 / temperature)\n    else:\n        score = logit / temperature\n",
     "    if UNFUSED:\n        score = tl.fma(logit, 1.0 / temperature, 0.0)\n    else:\n"
     "        score = logit * (1.0 / temperature)\n", True),
    ("sampling", "    if noisy & normal_divisor(temperature):\n", "    if noisy:\n", True),
    ("sampling", "    if done == 0:\n", "    if False:  # static_sass: a row without penalties, a chunk of finite logits\n",
     True),
    ("sampling", "            best, best_token = _refine_candidates(score, offs, candidate, count, seed, position, best, best_token,\n"
                 "                                                  logits_row, temperature, reload)\n",
     "            best = best + 0.0\n", True),
)


def _cut_copy(folder: Path) -> object:
    """A private copy of impl/kernels' sampling and sampling_select modules with `TEMPERATURE_PATH_CUTS` applied."""
    sources = {}
    for name in ("sampling_select", "sampling"):
        sources[name] = Path(importlib.import_module(f"runnercheck.impl.kernels.{name}").__file__).read_text()
    for name, text, stand_in, required in TEMPERATURE_PATH_CUTS:
        if text not in sources[name] and not required:
            continue
        if text not in sources[name]:
            raise SystemExit(f"--temperature-path: impl/kernels/{name}.py no longer holds the text it cuts: {text.strip()!r}")
        sources[name] = sources[name].replace(text, stand_in)
    sources["sampling"] = sources["sampling"].replace("from runnercheck.impl.kernels.sampling_select import (",
                                                      "from static_sass_sampling_select import (")
    module = None
    for name in ("sampling_select", "sampling"):
        path = folder / f"static_sass_{name}.py"
        path.write_text(sources[name])  # Triton reads a kernel's source from its file
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    return module


def compile_sass(fn, pointers: dict[str, str], constexprs: dict[str, object], warps: int, maxnreg: int) -> tuple[str, str]:
    """(nvdisasm's text, cuobjdump's resource usage) of kernel ``fn`` compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = [p.name for p in fn.params]
    signature = {p: "constexpr" if p in constexprs else pointers.get(p, "i32") for p in params}
    divisible = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params)
                 if p not in constexprs and (p.endswith(("_ptr", "stride")) or p == "vocab_size")}
    source = ASTSource(fn=fn, signature=signature, constexprs={(params.index(k),): v for k, v in constexprs.items()},
                       attrs=divisible)
    options = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    finally:
        os.unlink(f.name)
    return sass, usage


def opcodes(sass: str) -> list[str]:
    """Each instruction's opcode (predicate guard dropped), NOPs left out."""
    ops = []
    for line in sass.splitlines():
        found = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z0-9_.]+)", line)
        if found and found.group(1) != "NOP":
            ops.append(found.group(1))
    return ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warps", type=int, default=2)
    parser.add_argument("--maxnreg", type=int, default=80,
                        help="register cap (0: the compiler's choice; default: the product's, `block_maxnreg`)")
    parser.add_argument("--chunk", type=int, default=1024, help="the CHUNK constexpr")
    parser.add_argument("--temperature-path", action="store_true",
                        help="the first split pass's logits path alone: its general path (penalties, non-finite "
                             "rescoring, greedy and filtered rows), refinement and abnormal-temperature paths cut away")
    parser.add_argument("--top", type=int, default=30, help="opcodes in the histogram")
    parser.add_argument("--sass", type=Path, default=None, help="also write nvdisasm's text here")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if args.temperature_path:
        module = _cut_copy(Path(tempfile.mkdtemp(prefix="runnercheck-sass-")))
    else:
        module = importlib.import_module("runnercheck.impl.kernels.sampling")
    sass, usage = compile_sass(module.sampler_block_kernel, BLOCK_POINTERS, {"CHUNK": args.chunk}, args.warps,
                               args.maxnreg)
    if args.sass is not None:
        args.sass.write_text(sass)
    ops = opcodes(sass)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    print(f"sampler_block_kernel{' (temperature path)' if args.temperature_path else ''}, {args.warps} warps, cap "
          f"{args.maxnreg or 'none'}: {regs.group(1) if regs else '?'} registers, {stack.group(1) if stack else '?'} B "
          f"stack, {len(ops)} instructions ({sum(o.startswith('BAR') for o in ops)} barriers, "
          f"{sum(o.startswith('SHFL') for o in ops)} shuffles, {sum(o.startswith('MUFU') for o in ops)} MUFU)")
    for op, n in collections.Counter(ops).most_common(args.top):
        print(f"  {n:6d}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
