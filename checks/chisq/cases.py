"""The chi-square case catalogue: every configuration `runnercheck chisq` tests, and why.

A *case* (`SamplingCase`) is one logit template (one row, or a target row plus draft rows of one
request), one `SamplingParams`, a token history and a number of draws; ``binds`` names the
filter(s) the case exists to test, and `runnercheck.checks.chisq.binding` checks, from the exact float64
distributions, that each of them binds (moving its threshold or parameter changes what the case's
draws see).  The catalogue:

* `build_cases`: the matrix (temperatures, each filter, penalties, ties, vocabularies, drafts,
  tails) plus `binding_cases`: for each filter and each pair of filters, at a temperature below
  and above 1, a case in which that filter binds (two threshold filters cannot both bind in one
  row, since both keep a prefix of the same order: such a pair gets a case for each, the other
  filter on but slack);
* `deep_tail_cases` (GPU-sized tails), `calibration_case`, `power_cases` (the case that exposes
  each planted bias of `runnercheck.checks.chisq.samplers.PLANTED_BIASES`) and `runner_sampler_cases` (the few
  cases `runnercheck verify` runs on the runner's interpreted sampler on CPU).

The numbers behind the sizes are in docs/CHISQ.md.
"""
from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import replace
from itertools import combinations
from typing import Any

import numpy as np
import torch

from runnercheck.checks.chisq.binding import FILTERS, PENALTIES, SHORT_NAMES, THRESHOLD_FILTERS
from runnercheck.checks.chisq.case import SamplingCase
from runnercheck.checks.chisq.samplers import TokenHistory
from runnercheck.impl.interface import MAX_SEED, SAMPLING_FIELDS_BY_NAME, SamplingParams

# Positions are a 32-bit Philox counter word; offsets stay below 2^31 so offset + draws never wraps.
MAX_POSITION_OFFSET = 2**31


def case_seed(run_seed: int, case_name: str, repeat: int = 0) -> tuple[int, int]:
    """(request seed, position offset) for one run of one case: independent across cases and repeats."""
    digest = hashlib.blake2b(f"{run_seed}:{case_name}:{repeat}".encode(), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little") & MAX_SEED, int.from_bytes(digest[8:], "little") % MAX_POSITION_OFFSET


def _normal(vocab: int, scale: float, seed: int) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def _top_p_between_tokens(scores: np.ndarray, target: float) -> float:
    """A top_p halfway between the cumulative masses either side of ``target``: no fragile boundary."""
    probs = np.sort(np.exp(scores - scores.max()))[::-1]
    cumulative = np.cumsum(probs / probs.sum())
    m = int(np.searchsorted(cumulative, target))
    below = cumulative[m - 1] if m > 0 else 0.0
    return round(float((below + cumulative[m]) / 2), 6)


def _row(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float32).reshape(1, -1)


def _tail_case(name: str, depth: float, tail: int, n: int, description: str) -> SamplingCase:
    logits = torch.full((1, tail + 1), -float(depth))
    logits[0, 0] = 0.0
    return SamplingCase(name, "tail", logits, SamplingParams(), n, tail_tokens=range(1, tail + 1),
                        description=description)


# --------------------------------------------------------------------------- binding cases

BIND_VOCAB = 32
BIND_TEMPERATURES = (0.6, 1.5)
BIND_KEPT = 8  # tokens the binding threshold filter keeps
SLACK_EXTRA = 6  # a slack top-k / min-p keeps this many more; a slack top-p keeps every prefix near BIND_KEPT
PENALTY_VALUES = {"repetition_penalty": 1.4, "frequency_penalty": 0.5, "presence_penalty": 0.6}
# Penalised tokens by rank of the unpenalised logits: outputs (with repeats) and prompt-only tokens,
# all near the top so that the penalties move tokens the filters keep.
OUTPUT_RANKS = (0, 0, 2, 4, 4, 4, 7)
PROMPT_RANKS = (1, 5, 9)


def binding_specs() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(binding filters, slack filters) for each filter and each pair of filters."""
    specs: list[tuple[tuple[str, ...], tuple[str, ...]]] = [((f,), ()) for f in FILTERS]
    for a, b in combinations(FILTERS, 2):
        if a in THRESHOLD_FILTERS and b in THRESHOLD_FILTERS:
            specs += [((a,), (b,)), ((b,), (a,))]
        else:
            specs.append(((a, b), ()))
    return specs


def _geometric_mid(a: float, b: float) -> float:
    return float(math.sqrt(a * b))


def _ranked_history(base: torch.Tensor) -> TokenHistory:
    order = torch.argsort(base, descending=True).tolist()
    return TokenHistory(prompt_ids=tuple(order[r] for r in PROMPT_RANKS if r < len(order)),
                        output_ids=tuple(order[r] for r in OUTPUT_RANKS if r < len(order)))


def _thresholds(scores: np.ndarray, binders: tuple[str, ...], slack: tuple[str, ...], kept: int, extra: int) -> dict[str, Any]:
    """Threshold parameters on penalised, scaled ``scores``: binders keep ``kept`` tokens, slack ones more.

    Every threshold sits halfway (geometrically for min-p) between two tokens: no fragile boundary.
    """
    ordered = np.sort(scores)[::-1]
    ratios = np.exp(ordered - ordered[0])
    cumulative = np.cumsum(ratios)
    k, wide = kept, kept + extra
    out: dict[str, Any] = {}
    for f in slack:
        if f == "top_k":
            out[f] = wide
        elif f == "min_p":
            out[f] = _geometric_mid(ratios[wide - 1], ratios[wide])
        else:  # top-p keeps all of any prefix of k - 1 .. k + 1 tokens (the binder's moves)
            worst = max(cumulative[i - 2] / cumulative[i - 1] for i in (k - 1, k, k + 1))
            out[f] = round(float((1.0 + worst) / 2), 6)
    for f in binders:
        if f == "top_k":
            out[f] = k
        elif f == "min_p":
            out[f] = _geometric_mid(ratios[k - 1], ratios[k])
        elif f == "top_p":
            pre = wide if set(slack) & {"top_k", "min_p"} else ordered.size
            mass = cumulative[:pre] / cumulative[pre - 1]
            out[f] = round(float((mass[k - 2] + mass[k - 1]) / 2), 6)
    return out


def binding_case(binders: tuple[str, ...], slack: tuple[str, ...], temperature: float, n: int,
                 vocab: int = BIND_VOCAB, scale: float = 2.0, kept: int = BIND_KEPT, extra: int = SLACK_EXTRA) -> SamplingCase:
    """A case whose ``binders`` bind and whose ``slack`` filters are on but keep more than the binder.

    Logits are N(0, scale^2) times T (the same spread after temperature at every T), penalties use
    `PENALTY_VALUES` on a history of top-ranked tokens, and thresholds come from the exact scores.
    """
    label = "+".join(SHORT_NAMES[f] for f in binders) + ("-slack-" + "+".join(SHORT_NAMES[f] for f in slack) if slack else "")
    name = f"bind-{label}-t{temperature:g}-v{vocab}"
    base = _normal(vocab, scale, zlib.crc32(name.encode()))
    logits = _row(base * temperature)
    # A penalty without a tuned value (a new one of the table's) takes the top of its table row's draw range.
    penalties = {f: PENALTY_VALUES.get(f, SAMPLING_FIELDS_BY_NAME[f].draw[1]) for f in binders if f in PENALTIES}
    history = _ranked_history(base) if penalties else TokenHistory()
    params = SamplingParams(temperature=temperature, **penalties)
    if set(binders + slack) & set(THRESHOLD_FILTERS):
        from runnercheck.reference.sampler import filtered_scores

        scores = filtered_scores(logits[0].to(torch.float64), params, history.prompt_ids, history.output_ids).numpy()
        params = replace(params, **_thresholds(scores, binders, slack, kept, extra))
    slack_note = f"; {', '.join(slack)} on but slack" if slack else ""
    return SamplingCase(name, "binding", logits, params, n, history=history, binds=binders,
                        description=f"{', '.join(binders)} binds at T={temperature:g}{slack_note}")


def binding_cases(n: int) -> list[SamplingCase]:
    """Every binding spec at both temperatures; cases with a penalty draw ``3 n`` (a 25% move of a
    penalty needs ~6e4 draws to show, one token at a threshold ~2e4: `runnercheck.checks.chisq.binding`)."""
    return [binding_case(b, s, t, 3 * n if set(b) & set(PENALTIES) else n) for b, s in binding_specs() for t in BIND_TEMPERATURES]


def build_cases(quick: bool = True) -> list[SamplingCase]:
    """The configuration matrix; ``quick`` keeps vocabularies small enough for interpreted CPU runs."""
    n = 20_000 if quick else 200_000
    cases: list[SamplingCase] = []
    base97 = _normal(97, 1.5, 97)
    for t in (0.05, 0.5, 1.0, 2.0, 10.0):
        # Logits scaled by T, so every temperature sees the same post-temperature distribution.
        cases.append(SamplingCase(f"temperature-{t:g}-v97", "temperature", _row(base97 * t), SamplingParams(temperature=t), n,
                                  description="N(0, 1.5^2) logits times T"))
    cases.append(SamplingCase("greedy-v97", "temperature", _row(base97), SamplingParams(temperature=0.0), n // 10,
                              description="temperature 0: argmax only"))
    topk_base = _normal(97, 1.0, 11)
    cases.append(SamplingCase("top-k-10-v97", "top-k", _row(topk_base), SamplingParams(top_k=10), n, binds=("top_k",)))
    topp = _top_p_between_tokens(base97.numpy(), 0.8)
    cases.append(SamplingCase("top-p-v97", "top-p", _row(base97), SamplingParams(top_p=topp), n, binds=("top_p",),
                              description=f"top_p={topp} halfway between two cumulative masses"))
    cases.append(SamplingCase("min-p-0.05-v97", "min-p", _row(_normal(97, 2.0, 5)), SamplingParams(min_p=0.05), n,
                              binds=("min_p",)))
    combo_base = _normal(97, 0.7, 17)
    s = combo_base.numpy() / 0.7
    kept = np.sort(s[s >= s.max() + math.log(0.05)])[::-1][:30]
    combo_p = _top_p_between_tokens(kept, 0.9)
    cases.append(SamplingCase("combo-t0.7-k30-p-minp-v97", "combination", _row(combo_base),
                              SamplingParams(temperature=0.7, top_k=30, top_p=combo_p, min_p=0.05), n, binds=("top_k", "top_p"),
                              description="all three filters on; min-p keeps 57 tokens, so top-k (30) and top-p bind and "
                                          "min-p is slack (the bind-minp-* cases test min-p)"))
    cases.append(binding_case(("top_k",) + PENALTIES, (), 0.8, 3 * n))
    cases += binding_cases(n)
    cases.append(SamplingCase("near-ties-v64", "near-ties", _row(_normal(64, 1e-3, 64)), SamplingParams(), n,
                              description="logits within ~1e-3 of each other"))
    cases.append(SamplingCase("exact-ties-v16-index-bins", "near-ties", torch.zeros(1, 16), SamplingParams(), n,
                              index_bins=4, description="16 equal logits; 4 contiguous index bins expose tie-breaking by index"))
    cases.append(top_p_ties_case(n))
    base1000 = _normal(1000, 2.0, 1000)
    p1000 = _top_p_between_tokens(base1000.numpy() / 1.2, 0.3)
    cases.append(SamplingCase(f"v1000-t1.2-p{p1000:g}", "vocab", _row(base1000), SamplingParams(temperature=1.2, top_p=p1000),
                              n // 4 if quick else n, binds=("top_p",),
                              description="top_p between two cumulative masses near 0.3 (23 tokens kept)"))
    drafts = torch.stack([_normal(16, 1.0, 16), _normal(16, 1.0, 16) + _normal(16, 0.3, 61)]).to(torch.float32)
    cases.append(SamplingCase("drafts-2rows-v16", "drafts", drafts, SamplingParams(), n,
                              description="a target row and a draft row of one request at consecutive positions"))
    cases.append(_tail_case("tail-d12-4096-v4097", 12.0, 4096, 5_000 if quick else 50_000,
                            "one head token, 4096 tokens 12 logits below: tail mass 2.4%"))
    if not quick:
        base50257 = _normal(50257, 3.0, 50257)
        p50257 = _top_p_between_tokens(base50257.numpy(), 0.6)
        cases.append(SamplingCase(f"v50257-t1-p{p50257:g}", "vocab", _row(base50257), SamplingParams(top_p=p50257), n,
                                  binds=("top_p",)))
        logits = _row(_normal(50257, 3.0, 7))
        ratios = np.sort(np.exp((logits[0].double().numpy() - float(logits.max())) / 0.8))[::-1]
        min_p = round(_geometric_mid(ratios[119], ratios[120]), 8)  # keeps 120 tokens; top-k 200 is slack
        cases.append(SamplingCase("v50257-t0.8-minp-k200", "vocab", logits, SamplingParams(temperature=0.8, top_k=200, min_p=min_p),
                                  n, binds=("min_p",), description=f"min_p={min_p} keeps 120 tokens, top-k 200 on but slack"))
        cases.append(_tail_case("tail-d16-65536-v65537", 16.0, 65536, 20_000,
                                "one head token, 2^16 tokens 16 logits below: ~150 expected tail hits"))
        cases += coarse_probe_cases()
    return cases


def _probe_depth(tail: int, p_token: float) -> float:
    """Logits below a head at 0 at which each of ``tail`` equal tokens has probability ``p_token``."""
    return -math.log(p_token / (1.0 - tail * p_token))


def coarse_probe_cases(n: int = 200_000) -> list[SamplingCase]:
    """Full-mode probes of coarse arithmetic (`runnercheck.checks.chisq.planted_cdf`; power: `power_table`):

    * fp16 probabilities: 2^16 tail tokens of probability 1.25 * 2^-24 each, which fp16 stores as 2^-24
      (tail mass 4.9e-3 drawn 20% too rarely: the tail test sees it in ~1e5 draws);
    * 16-bit uniforms: 4096 tokens of probability 2.5 * 2^-16 each, which a 2^16-point uniform draws
      with 2 or 3 points' probability (+-20% per token; per-token bins need >= 1.3e5 draws).
    """
    fp16_tail, u16_tail = 1 << 16, 4096
    fp16_depth = _probe_depth(fp16_tail, 1.25 * 2.0**-24)
    u16_depth = _probe_depth(u16_tail, 2.5 * 2.0**-16)
    return [_tail_case("fp16-probe-65536-v65537", fp16_depth, fp16_tail, n,
                       f"2^16 tokens {fp16_depth:.3f} logits below the head: 1.25 * 2^-24 each (fp16 keeps 2^-24)"),
            replace(_tail_case("u16-probe-4096-v4097", u16_depth, u16_tail, n,
                               f"4096 tokens {u16_depth:.3f} logits below the head: 2.5 * 2^-16 each"), tail_tokens=None)]


def top_p_ties_case(n: int) -> SamplingCase:
    """Four exactly tied tokens under the head, top-p reached halfway through them: the contract keeps all
    four, a sort-position cut (vLLM, transformers, SGLang torch) keeps two (`runnercheck.checks.chisq.conventions`)."""
    scores = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0] + [0.5 - 0.25 * i for i in range(11)], dtype=torch.float64)
    probs = torch.softmax(scores, 0)
    top_p = round(float(probs[0] + 1.5 * probs[1]), 6)
    return SamplingCase("top-p-ties-v16", "near-ties", _row(scores), SamplingParams(top_p=top_p), n, tie_filter="top_p",
                        description=f"tokens 1-4 tied; top_p={top_p} is reached after two of them")


def deep_tail_cases() -> list[SamplingCase]:
    """GPU-sized: 2^17 tail tokens 25 logits below (~51 expected hits) and 30 below (~0.05)."""
    return [
        _tail_case("tail-d25-131072-v131073", 25.0, 131072, 28_000_000,
                   "2^17 tokens 25 logits below the head: 1.83e-6 tail mass, ~51 expected hits"),
        _tail_case("tail-d30-131072-v131073", 30.0, 131072, 4_000_000,
                   "2^17 tokens 30 logits below: ~0.05 expected hits; any hit is an excess (e.g. +inf noise)"),
    ]


POWER_WHERE = ("quick", "full", "gpu")


def power_cases() -> dict[str, tuple[SamplingCase, str]]:
    """For each planted bias: the case built to expose it, and the cheapest mode that runs it.

    ``quick``: a few 1e7 token-draws, every run.  ``full``: noise that is +inf with probability
    2^-24 / 2^-25 per token, which takes ~2e8 token-draws to show (full mode).  ``gpu``: noise capped
    near 22-23, which only a deep tail shows, ~1e12 token-draws (full mode on CUDA).
    """
    by_name = {c.name: c for c in build_cases(quick=True)}
    coarse = {c.name: c for c in coarse_probe_cases()}
    probe = _tail_case("inf-noise-probe-d30-32767-v32768", 30.0, 32767, 12_000,
                       "2^15 tokens 30 logits below (correct: ~4e-5 expected hits); +inf noise picks them")
    deep = _tail_case("deep-tail-d24-65536-v65537", 24.0, 65536, 16_000_000,
                      "2^16 tokens 24 logits below: ~40 expected hits; noise capped below 23 loses ~80% of them")
    return {
        "top-k-off-by-one": (by_name["top-k-10-v97"], "quick"),
        "top-p-drop-boundary": (by_name["top-p-v97"], "quick"),
        "top-p-extra-token": (by_name["top-p-v97"], "quick"),
        "temperature-twice": (by_name["temperature-2-v97"], "quick"),
        "penalty-wrong-sign": (by_name["bind-freq+pres-t0.6-v32"], "quick"),
        "min-p-before-temperature": (by_name["bind-minp-slack-k-t0.6-v32"], "quick"),
        "draft-shared-noise": (by_name["drafts-2rows-v16"], "quick"),
        "bf16-noise": (replace(by_name["exact-ties-v16-index-bins"], n_samples=2_000_000), "quick"),
        "u24-uniform": (replace(probe, n_samples=6_000), "full"),
        "fp16-noise": (probe, "full"),
        "fp16-probabilities": (coarse["fp16-probe-65536-v65537"], "gpu"),
        "u16-uniform": (coarse["u16-probe-4096-v4097"], "full"),
        "u31-floor": (deep, "gpu"),
        "u32-uniform": (deep, "gpu"),
    }


def power_plan(quick: bool, device: torch.device) -> list[str]:
    """The planted biases a run in this mode on this device can afford."""
    allowed = {"quick"} if quick else ({"quick", "full", "gpu"} if device.type == "cuda" else {"quick", "full"})
    return [bias for bias, (_, where) in power_cases().items() if where in allowed]




def calibration_case() -> SamplingCase:
    """The small case calibration draws over many seeds (V=32, top-k 24: cheap, many bins).

    It checks that p-values are uniform, not that a filter error shows: at 2000 draws top-k 24 does
    not bind (`runnercheck.checks.chisq.binding`), and the case declares no binding filter.
    """
    return SamplingCase("calibration-v32", "calibration", _row(_normal(32, 1.0, 32)), SamplingParams(top_k=24), 2_000)


# The runner's sampler interpreted on CPU costs ~0.1 s of CPU per row with filters on (2 x 100
# rows: 21.5 s CPU, measured), so `runnercheck verify` on CPU affords a few hundred draws: few,
# heavy tokens, each filter's boundary token carrying enough mass that one token too many or too
# few shows in that many draws (checked by `runnercheck.checks.chisq.binding` at RUNNER_ALPHA).
RUNNER_VOCAB = 8
RUNNER_KEPT = 3
# The runner cases are their own family in verify (Holm at 0.01 over their few tests): a move must
# show at 0.01 / 4, not at the matrix's Bonferroni level.
RUNNER_ALPHA = 0.0025


def runner_sampler_cases(n: int = 100) -> list[SamplingCase]:
    """The fixed cases `runnercheck verify` runs on the runner's own sampler on CPU."""
    def case(binders: tuple[str, ...], slack: tuple[str, ...], temperature: float) -> SamplingCase:
        c = binding_case(binders, slack, temperature, n, vocab=RUNNER_VOCAB, scale=0.8, kept=RUNNER_KEPT, extra=2)
        return replace(c, name=c.name.replace("bind-", "runner-", 1), group="runner")

    # The frequency penalty of the second case is on but too weak to show in so few draws (only a
    # gross error such as a wrong sign would): the case declares top-p alone.
    return [case(("min_p",), ("top_k",), 0.6), replace(case(("top_p", "frequency_penalty"), (), 1.5), binds=("top_p",))]
