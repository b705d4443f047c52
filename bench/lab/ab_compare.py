"""Two trees' host_cost passes, paired: whether the new tree's ratios differ from the base's beyond a host's drift.

    python -m runnercheck.bench.lab.ab_compare DIR [DIR ...] [--out ab.json]

Each DIR holds ``base_<i>/bench.json`` and ``new_<i>/bench.json`` (the `ci/h200.sh` job ``bench_host_ab``:
the two trees' passes alternating on one host).  Passes ``base_i`` and ``new_i`` ran next to each other, so
they are a pair; pairs from several DIRs (several hosts) pool.  For every ``runner / baseline`` row it
prints both sides' values and medians, how many pairs moved down, and the two-sided Wilcoxon signed-rank
p-value of the paired differences (`scipy.stats.wilcoxon`; with six pairs the smallest it can be is
1/32, every pair moving the same way).  A lent host's speed drifts within a run, so one pass is no result;
a p-value this small says the change held in pair after pair.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from scipy import stats

RATIO_PREFIX = "runner / baseline host time, "


def _ratios(bench_json: Path) -> dict[str, float]:
    rows = json.loads(bench_json.read_text())["rows"]
    return {row["name"][len(RATIO_PREFIX):]: row["value"] for row in rows if row["name"].startswith(RATIO_PREFIX)}


def pairs(dirs: list[Path]) -> list[tuple[str, dict[str, float], dict[str, float]]]:
    """(label, base ratios, new ratios) of every pass pair under ``dirs``, in order."""
    found = []
    for root in dirs:
        indices = sorted(int(m.group(1)) for p in root.glob("base_*") if (m := re.fullmatch(r"base_(\d+)", p.name)))
        for i in indices:
            base, new = root / f"base_{i}" / "bench.json", root / f"new_{i}" / "bench.json"
            if not new.exists():
                raise FileNotFoundError(f"{new}: base_{i} has no new_{i} to pair with")
            found.append((f"{root.name}/{i}", _ratios(base), _ratios(new)))
    if not found:
        raise FileNotFoundError(f"no base_<i>/bench.json under {', '.join(map(str, dirs))}")
    return found


def compare(found: list[tuple[str, dict[str, float], dict[str, float]]]) -> dict[str, dict]:
    """Per ratio row: both sides' values and medians, the pairs that moved down, the paired test's p-value."""
    out = {}
    for name in found[0][1]:
        base = [b[name] for _, b, n in found if name in b and name in n]
        new = [n[name] for _, b, n in found if name in b and name in n]
        diffs = [x - y for x, y in zip(new, base)]
        p = float(stats.wilcoxon(diffs).pvalue) if any(diffs) and len(diffs) > 1 else 1.0
        out[name] = {"base": base, "new": new, "base_median": statistics.median(base), "new_median": statistics.median(new),
                     "pairs": len(diffs), "pairs_down": sum(d < 0 for d in diffs), "wilcoxon_p": p}
    return out


def render(result: dict[str, dict]) -> str:
    lines = ["| runner / baseline | base | new | base median | new median | pairs down | Wilcoxon p |", "|---|---|---|---:|---:|---:|---:|"]
    for name, r in result.items():
        lines.append(f"| {name} | {' '.join(f'{v:.3f}' for v in r['base'])} | {' '.join(f'{v:.3f}' for v in r['new'])} | "
                     f"{r['base_median']:.3f} | {r['new_median']:.3f} | {r['pairs_down']}/{r['pairs']} | {r['wilcoxon_p']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="bench_host_ab output folders (base_<i>/, new_<i>/)")
    parser.add_argument("--out", type=Path, help="also write the comparison as JSON here")
    args = parser.parse_args(argv)
    try:
        result = compare(pairs(args.dirs))
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as err:
        parser.error(str(err))
    print(render(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
