"""Chi-square cases of speculative verification (docs/SAMPLING.md "Probabilistic speculative verification").

A `SpecCase` is a tiny Markov "model": the target's next-token table ``T[prev, next]``, the
draft's table ``D[prev, next]``, a start token ``s`` and ``k`` drafts per step.  One draw is one
request generating its first two tokens with speculation:

1. the proposer drafts ``d_0 ~ D[s], d_1 ~ D[d_0], ...`` (Gumbel-max with the draft stream);
2. the verifier gets target rows ``T[s], T[d_0], ..., T[d_{k-1}]`` and emits its tokens;
3. if it emitted only one token ``x_0``, a second step drafts from ``x_0`` at the next position
   and the second token is that step's first emitted token.

Speculation must not change the distribution of the output, so the first two tokens must follow
the non-speculative joint ``T[s, x_0] T[x_0, x_1]`` exactly (the *joint* test), and the number
of tokens step 1 emits must follow the exact acceptance law (the *length* test: ``P(a >= i)`` is
``sum m_i`` with ``m_1(t) = min(T[s,t], D[s,t])`` and ``m_{i+1}(u) = sum_t m_i(t) min(T[t,u], D[t,u])``).

Verifiers (``verifier(p [N, k+1, V], drafts [N, k], q [N, k, V], seeds [N], positions [N]) ->
(tokens [N, k+1] -1 padded, accepted [N])``): `SpecTwin`, a vectorised float64 twin of
`runnercheck.reference.spec_verify` (same RNG bits, tested equal to the oracle), whose `SpecVariant` knobs
plant the biases of `SPEC_BIASES`; and `KernelVerifier`, the Triton kernel through
`runnercheck.impl.sample.spec_verify.SpecVerifier` (the default on CUDA; on CPU it runs interpreted, slowly).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy import stats as sps

from runnercheck.checks.chisq import stats
from runnercheck.reference.rng import ACCEPT_STREAM, DRAFT_STREAM, RESAMPLE_STREAM, gumbel_from_bits, philox_64bits, uniform_from_bits

SpecVerifierFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ACCEPT_VARIANTS = ("spec", "normalised-ratio", "draft-noise")
RESIDUAL_VARIANTS = ("spec", "abs")
BONUS_VARIANTS = ("spec", "dropped")


# --------------------------------------------------------------------------- the RNG spec, vectorised


def _bits(seeds: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor, stream: int):
    """The spec's 64 bits for ``token_ids [N, W]`` at per-row ``seeds``/``positions [N]``."""
    return philox_64bits(seeds.view(-1, 1), positions.view(-1, 1), token_ids, stream)


def gumbel_max(weights: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Per row of ``weights [N, V]``: argmax of ``log w + g`` over ``w > 0`` (first index on ties)."""
    n, vocab = weights.shape
    noise = gumbel_from_bits(*_bits(seeds, positions, torch.arange(vocab).expand(n, vocab), stream))
    scores = torch.where(weights > 0, torch.log(torch.where(weights > 0, weights, 1.0)) + noise, -math.inf)
    return torch.argmax(scores, dim=1)


# --------------------------------------------------------------------------- the twin and its planted biases


@dataclass(frozen=True)
class SpecVariant:
    """One knob per planted bias; the defaults are docs/SAMPLING.md.

    ``accept``: ``spec`` (``u q(d) < p(d)``, ``u`` from the accept stream); ``normalised-ratio``
    (the ratio ``p/q`` left unclamped and "normalised" into [0, 1] by its row maximum
    ``max_t p_t/q_t``: accepts ``d`` with probability ``(p(d)/q(d)) / max ratio``, too rarely);
    ``draft-noise`` (``u`` taken from the draft stream's bits of ``d``: the very noise that made
    ``d`` win, correlated with the draft).  ``residual``: ``spec`` (``max(0, p - q)``) or ``abs``
    (``|p - q|``).  ``bonus``: ``spec`` or ``dropped`` (all ``k`` accepted: emit only the drafts).
    """

    accept: str = "spec"
    residual: str = "spec"
    bonus: str = "spec"

    def __post_init__(self) -> None:
        if self.accept not in ACCEPT_VARIANTS or self.residual not in RESIDUAL_VARIANTS or self.bonus not in BONUS_VARIANTS:
            raise ValueError(f"unknown spec variant {self}")


class SpecTwin:
    """`runnercheck.reference.spec_verify.verify_rejection` vectorised over requests, float64; holds no tensors."""

    def __init__(self, variant: SpecVariant = SpecVariant(), name: str = "spec-twin"):
        self.variant = variant
        self.name = name

    def __call__(self, p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, seeds: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = self.variant
        n, k = drafts.shape
        rows = torch.arange(n)
        offsets = torch.arange(k)
        if k:
            pd = p[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2)
            qd = q.gather(2, drafts.unsqueeze(2)).squeeze(2)
            if v.accept == "draft-noise":
                hi, lo = philox_64bits(seeds.view(-1, 1), positions.view(-1, 1) + offsets, drafts, DRAFT_STREAM)
            else:
                hi, lo = philox_64bits(seeds.view(-1, 1), positions.view(-1, 1) + offsets, torch.zeros_like(drafts), ACCEPT_STREAM)
            u = uniform_from_bits(hi, lo)
            if v.accept == "normalised-ratio":
                ratios = torch.where(q > 0, p[:, :k] / torch.where(q > 0, q, 1.0), 0.0)
                ok = u * ratios.amax(dim=2) < pd / qd
            else:
                ok = u * qd < pd
            accepted = torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1)
        else:
            accepted = torch.zeros(n, dtype=torch.int64)
        rejected = accepted < k
        p_a = p[rows, accepted]
        q_a = q[rows, accepted.clamp(max=max(k - 1, 0))] if k else torch.zeros_like(p_a)
        diff = p_a - q_a
        residual = diff.abs() if v.residual == "abs" else diff.clamp(min=0.0)
        residual = torch.where((residual > 0).any(dim=1, keepdim=True), residual, p_a)
        weights = torch.where(rejected.view(-1, 1), residual, p_a)
        token = gumbel_max(weights, seeds, positions + accepted, RESAMPLE_STREAM)
        tokens = torch.full((n, k + 1), -1, dtype=torch.int64)
        if k:
            tokens[:, :k] = torch.where(offsets < accepted.view(-1, 1), drafts, -1)
        emit = rejected | torch.tensor(v.bonus != "dropped")
        tokens[rows[emit], accepted[emit]] = token[emit]
        return tokens, accepted


class KernelVerifier:
    """The runner's Triton kernel (`runnercheck.impl.sample.spec_verify.SpecVerifier`) in the twin's call form.

    Owns one `SpecVerifier` per (vocabulary, k) and the device it runs on; every request samples in
    rejection mode (temperature 1), ``max_num_reqs`` requests per launch.
    """

    name = "spec-kernel"

    def __init__(self, device_kind: str = "auto", max_num_reqs: int = 4096):
        from runnercheck.impl.device import Device, resolve_device_kind

        kind = resolve_device_kind(device_kind)
        self.device = Device("cpu" if kind == "sim" else kind)  # no races to simulate here: sim samples on CPU tensors
        self.max_num_reqs = max_num_reqs
        self._verifiers: dict[tuple[int, int], object] = {}

    def __call__(self, p, drafts, q, seeds, positions) -> tuple[torch.Tensor, torch.Tensor]:
        from runnercheck.impl.sample.spec_verify import SpecVerifier

        n, k = drafts.shape
        vocab = p.shape[2]
        key = (vocab, k)
        if key not in self._verifiers:
            self._verifiers[key] = SpecVerifier(self.device, vocab, max_num_reqs=self.max_num_reqs, max_spec_tokens=k)
        verifier = self._verifiers[key]
        dev = self.device.torch_device
        tokens, accepted = [], []
        for start in range(0, n, self.max_num_reqs):
            m = min(self.max_num_reqs, n - start)
            sl = slice(start, start + m)
            out = verifier.verify(
                p[sl].reshape(m * (k + 1), vocab).to(dev, torch.float32).contiguous(),
                q[sl].reshape(m * k, vocab).to(dev, torch.float32).contiguous() if k else torch.zeros(0, vocab, device=dev),
                drafts[sl].reshape(-1).to(dev), (torch.arange(m + 1, dtype=torch.int32) * k).to(dev),
                torch.arange(m, dtype=torch.int32, device=dev), seeds[sl].to(dev), torch.ones(m, device=dev),
                positions[sl].to(dev), num_drafts=[k] * m)
            tokens.append(out.tokens.cpu().clone())
            accepted.append(out.accepted.cpu().to(torch.int64))
        return torch.cat(tokens), torch.cat(accepted)


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True, eq=False)
class SpecCase:
    """Target table ``target [V, V]`` and draft table ``draft [V, V]`` (float64 rows summing to 1)."""

    name: str
    target: torch.Tensor
    draft: torch.Tensor
    n_samples: int
    k: int = 2
    start: int = 0
    description: str = ""

    @property
    def vocab_size(self) -> int:
        return self.target.shape[0]

    def describe(self) -> dict:
        return {"case": self.name, "group": "speculative", "vocab_size": self.vocab_size, "k": self.k,
                "start": self.start, "n_samples": self.n_samples, "description": self.description}

    def expected_joint(self) -> np.ndarray:
        """``T[s, x0] T[x0, x1]`` flattened ``[V * V]``: non-speculative sampling."""
        t = self.target.numpy()
        return (t[self.start][:, None] * t).ravel()

    def expected_lengths(self) -> np.ndarray:
        """``P(step 1 emits j + 1 tokens)`` for ``j = 0..k`` (the acceptance law)."""
        t, d = self.target.numpy(), self.draft.numpy()
        both = np.minimum(t, d)
        mass = both[self.start]
        at_least = [1.0]
        for _ in range(self.k):
            at_least.append(float(mass.sum()))
            mass = mass @ both
        at_least.append(0.0)
        return np.array([at_least[j] - at_least[j + 1] for j in range(self.k + 1)])


def _softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    w = torch.exp(logits - logits.amax(dim=1, keepdim=True))
    return w / w.sum(dim=1, keepdim=True)


SPEC_VOCAB = 6


def _target_table() -> torch.Tensor:
    """A fixed 6x6 target: each row favours a different token and gives none to one token."""
    gen = torch.Generator().manual_seed(606)
    logits = torch.randn(SPEC_VOCAB, SPEC_VOCAB, generator=gen, dtype=torch.float64) * 1.2
    logits[torch.arange(SPEC_VOCAB), (torch.arange(SPEC_VOCAB) + 3) % SPEC_VOCAB] = -math.inf
    return _softmax_rows(logits)


def build_spec_cases(quick: bool = True) -> list[SpecCase]:
    """The (p, q) pairs: q far from p (and on p's zeros), q near p, q == p, and k = 1."""
    n = 50_000 if quick else 500_000
    t = _target_table()
    uniform = torch.full_like(t, 1.0 / SPEC_VOCAB)
    far = _softmax_rows(-torch.log(t.clamp(min=1e-3)))  # mass where the target has little or none
    near = 0.7 * t + 0.3 * uniform
    return [
        SpecCase("spec-q-far-k2-v6", t, far, n, description="q ranks tokens in reverse and puts mass on p's zeros"),
        SpecCase("spec-q-near-k2-v6", t, near, n, description="q = 0.7 p + 0.3 uniform"),
        SpecCase("spec-q-equal-k2-v6", t, t.clone(), n, description="q = p: every draft accepted, the bonus decides"),
        SpecCase("spec-q-far-k1-v6", t, far, n, k=1, description="one draft: the bonus is the second token"),
    ]


# --------------------------------------------------------------------------- drawing and testing


def propose(table: torch.Tensor, prev: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
            k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The proposer: ``k`` drafts by Gumbel-max over ``table[prev]`` with the draft stream; (drafts, q)."""
    drafts, qs = [], []
    for i in range(k):
        q = table[prev]
        prev = gumbel_max(q, seeds, positions + i, DRAFT_STREAM)
        drafts.append(prev)
        qs.append(q)
    vocab = table.shape[0]
    if not k:
        return torch.zeros(prev.shape[0], 0, dtype=torch.int64), torch.zeros(prev.shape[0], 0, vocab, dtype=torch.float64)
    return torch.stack(drafts, dim=1), torch.stack(qs, dim=1)


def _step(case: SpecCase, verifier: SpecVerifierFn, prev: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor):
    drafts, q = propose(case.draft, prev, seeds, positions, case.k)
    context = torch.cat([prev.view(-1, 1), drafts], dim=1)
    return verifier(case.target[context], drafts, q, seeds, positions)


def draw_spec(case: SpecCase, verifier: SpecVerifierFn, *, seed: int, position_offset: int,
              n_samples: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(first two tokens [n, 2], tokens step 1 emitted [n])`` for ``n`` requests of ``case``."""
    n = case.n_samples if n_samples is None else n_samples
    stride = 2 * case.k + 4  # every request's positions (both steps) are its own
    positions = position_offset + torch.arange(n, dtype=torch.int64) * stride
    seeds = torch.full((n,), seed, dtype=torch.int64)
    tokens, _ = _step(case, verifier, torch.full((n,), case.start, dtype=torch.int64), seeds, positions)
    lengths = (tokens >= 0).sum(dim=1)
    second = tokens[:, 1].clone()
    need = torch.nonzero(lengths < 2).flatten()
    if need.numel():
        again, _ = _step(case, verifier, tokens[need, 0], seeds[need], positions[need] + 1)
        second[need] = again[:, 0]
    return torch.stack([tokens[:, 0], second], dim=1).numpy(), lengths.numpy()


def evaluate_spec(case: SpecCase, pairs: np.ndarray, lengths: np.ndarray, alpha: float) -> list[stats.TestResult]:
    """The joint test of the first two tokens and the emitted-length test (uncorrected)."""
    config = case.describe()
    v = case.vocab_size
    joint_counts = stats.token_counts(pairs[:, 0] * v + pairs[:, 1], v * v)
    length_counts = stats.token_counts(lengths - 1, case.k + 1)
    return [
        stats.chisquare_test(joint_counts, case.expected_joint(), name=f"{case.name}/first-two-joint", config=config,
                             alpha=alpha, kind="spec-joint",
                             label_fn=lambda g: f"pair {divmod(int(g[0]), v)}" if g.size == 1 else f"pooled pairs ({g.size})"),
        stats.chisquare_test(length_counts, case.expected_lengths(), name=f"{case.name}/emitted-length", config=config,
                             alpha=alpha, kind="spec-length",
                             label_fn=lambda g: f"{int(g[0]) + 1} tokens" if g.size == 1 else f"pooled ({g.size} lengths)"),
    ]


# --------------------------------------------------------------------------- planted biases and power


@dataclass(frozen=True)
class SpecBias:
    name: str
    variant: SpecVariant
    case: str
    description: str


SPEC_BIASES: dict[str, SpecBias] = {
    b.name: b
    for b in (
        SpecBias("spec-ratio-normalised", SpecVariant(accept="normalised-ratio"), "spec-q-near-k2-v6",
                 "accept ratio p/q unclamped, divided by its row maximum instead of min(1, .)"),
        SpecBias("spec-residual-abs", SpecVariant(residual="abs"), "spec-q-far-k2-v6",
                 "residual |p - q| instead of max(0, p - q)"),
        SpecBias("spec-accept-shares-draft-noise", SpecVariant(accept="draft-noise"), "spec-q-far-k2-v6",
                 "accept uniform from the draft's own stream bits (correlated with the draft)"),
        SpecBias("spec-bonus-dropped", SpecVariant(bonus="dropped"), "spec-q-equal-k2-v6",
                 "all drafts accepted: the bonus token is not emitted"),
    )
}


def power_estimate(result: stats.TestResult, alpha: float) -> float:
    """Power of a test like ``result`` at its sample size: noncentral chi-square with the
    noncentrality estimated as ``statistic - dof`` (method of moments), critical value at ``alpha``."""
    if result.impossible_tokens or math.isinf(result.statistic):
        return 1.0
    dof = max(result.dof, 1)
    noncentrality = max(result.statistic - dof, 0.0)
    return float(sps.ncx2.sf(sps.chi2.isf(alpha, dof), dof, noncentrality)) if noncentrality > 0 else alpha


def spec_seed(run_seed: int, label: str, repeat: int = 0) -> tuple[int, int]:
    from runnercheck.checks.chisq.cases import case_seed

    return case_seed(run_seed, label, repeat)


def run_spec_cases(verifier: SpecVerifierFn, *, quick: bool, seed: int, alpha: float, correction: str,
                   samples: int | None = None, case_filter: str | None = None) -> list[stats.TestResult]:
    """Every spec case on ``verifier``: its own correction family."""
    results = []
    for case in build_spec_cases(quick):
        if case_filter and case_filter not in case.name:
            continue
        s, offset = spec_seed(seed, case.name)
        started = time.perf_counter()
        pairs, lengths = draw_spec(case, verifier, seed=s, position_offset=offset, n_samples=samples)
        case_results = evaluate_spec(case, pairs, lengths, alpha)
        for r in case_results:
            r.config.update(seed=s, position_offset=offset, verifier=getattr(verifier, "name", "?"))
        stats.share_wall_time(case_results, time.perf_counter() - started)
        results += case_results
    stats.apply_correction(results, correction, alpha)
    return results


def run_spec_power(*, quick: bool, seed: int, alpha: float, repeats: int,
                   biases: tuple[str, ...] | None = None) -> list[stats.PowerResult]:
    """Each planted spec bias on its exposing case; a repeat rejects when its Bonferroni min-p < alpha."""
    cases = {c.name: c for c in build_spec_cases(quick)}
    out = []
    for name, bias in SPEC_BIASES.items():
        if biases is not None and name not in biases:
            continue
        case = cases[bias.case]
        min_ps = []
        started = time.perf_counter()
        for r in range(repeats):
            s, offset = spec_seed(seed, f"power:{name}", r)
            pairs, lengths = draw_spec(case, SpecTwin(bias.variant, name=f"bias-{name}"), seed=s, position_offset=offset)
            min_ps.append(stats.family_min_p(evaluate_spec(case, pairs, lengths, alpha)))
        out.append(stats.PowerResult(bias=name, config_name=case.name, repeats=repeats,
                                     rejections=sum(p < alpha for p in min_ps), alpha=alpha,
                                     required_power=1.0 if repeats < 5 else 0.8, min_p_values=min_ps,
                                     description=bias.description, elapsed_s=time.perf_counter() - started))
    return out


def default_spec_verifier(device_type: str) -> SpecVerifierFn:
    """The kernel on CUDA; on CPU the twin (the interpreted kernel runs ~2e3 requests/s)."""
    return KernelVerifier("cuda") if device_type == "cuda" else SpecTwin()


__all__ = [
    "SpecVariant", "SpecTwin", "KernelVerifier", "SpecCase", "SpecBias", "SPEC_BIASES", "build_spec_cases",
    "gumbel_max", "propose", "draw_spec", "evaluate_spec", "power_estimate", "run_spec_cases", "run_spec_power",
    "default_spec_verifier",
]
