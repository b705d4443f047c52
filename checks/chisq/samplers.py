"""Samplers the statistics run against: the adapter contract, baselines and planted biases.

The contract (`SamplerFn`): ``sampler(logits, params, seeds, positions) -> token ids`` with

* ``logits``     float32 ``[N, V]``, one row per draw (on the device the sampler runs on);
* ``params``     ``N`` `SamplingParams`, one per row;
* ``seeds``      int64 ``[N]``: the request seed of each row;
* ``positions``  int64 ``[N]``: the noise position of each row;
* returns        int64 ``[N]`` token ids.

Two optional keywords, passed only to samplers whose signature names them:
``history`` (``N`` `TokenHistory`: the prompt/output ids penalties count) and ``request_index``
(int64 ``[N]``: rows with equal values are rows of one request, e.g. a target and its drafts).
A sampler without ``history`` is not run on configurations with penalties (reported as skipped).

Shipped samplers (`load_sampler` names):

* ``gumbel``: `GumbelSampler`, docs/SAMPLING.md in float32 with the RNG spec's 64-bit noise, in
  plain PyTorch (the correct baseline without Triton; bit-exact Philox, see `philox_bits`).
* ``torch``: `torch_multinomial_sampler`, softmax + ``torch.multinomial`` (no penalties).
* ``impl``: `runnercheck.checks.chisq.impl_sampler.ImplSampler`, the runner's Triton sampler, imported lazily.
* ``bias-*``: `PLANTED_BIASES`, each `GumbelSampler` with one knob of `GumbelVariant` turned.
* ``package.module:function`` or ``path/to/file.py:function``: any callable that fits the contract
  (third-party code: `runnercheck chisq` runs it in a child process, `runnercheck.checks.chisq.isolated`).
"""
from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from runnercheck.checks.chisq.planted_cdf import inverse_cdf_factory
from runnercheck.checks.loader import LoaderError, SpecNotCallableError, SpecNotFoundError, SpecSyntaxError, load_callable, spec_of
from runnercheck.impl.interface import SAMPLING_FIELDS, SamplingParams

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
NOISE_VARIANTS = ("u64", "u32", "floor31", "u24", "fp16", "bf16")
# On CUDA these run fused in `runnercheck.checks.chisq.gumbel_kernel` (the deep tails need ~1e12 noise draws).
FUSED_NOISE_VARIANTS = ("u64", "u32", "floor31", "u24")
TOP_P_BOUNDARY = ("spec", "drop", "extra")
# Elements per chunk of [rows, V] work.  On CPU the ~8 int64 temporaries of the Philox rounds must
# stay in cache (measured: 2^18 runs ~4e7 draws*tokens/s, 2^20 half that); a GPU wants big launches.
CPU_CHUNK_ELEMENTS = 1 << 18
CUDA_CHUNK_ELEMENTS = 1 << 27


class SamplerSpecError(ValueError):
    """A ``--sampler`` spec that names nothing loadable (bad syntax, unknown builtin)."""


class SamplerNotFoundError(SamplerSpecError):
    """``package.module:function`` whose module or attribute does not exist."""


class SamplerNotCallableError(SamplerSpecError):
    """``package.module:function`` that names something other than a callable."""


class SamplerUnavailableError(RuntimeError):
    """A known sampler that cannot run here (e.g. `runnercheck.impl.sample` not built yet)."""


class SamplerUnsupportedError(ValueError):
    """Parameters a sampler does not implement (e.g. penalties for the plain PyTorch adapter)."""


@dataclass(frozen=True)
class TokenHistory:
    """The ids penalties count for one row: the user's prompt and every output so far."""

    prompt_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()


class SamplerFn(Protocol):
    def __call__(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], seeds: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor: ...


def accepts_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes keyword ``name`` (explicitly or through ``**kwargs``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY):
            return True
    return False


def has_penalties(params: SamplingParams) -> bool:
    """Whether any penalty of the interface's table is on (away from its neutral value)."""
    return any(getattr(params, f.name) != f.neutral for f in SAMPLING_FIELDS if f.stage == "penalty")


# --------------------------------------------------------------------------- RNG (the spec's bits)


def _philox_rows(k0: torch.Tensor, k1: torch.Tensor, counters: torch.Tensor, positions: torch.Tensor,
                 stream: int) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10's four words at ``(counters, position, 0, stream)``, ``[rows, n]`` at once, in place."""
    rows, n = counters.shape
    dev = counters.device
    # Round 1 with c1 = position, c2 = 0, c3 = stream: the c2 product is 0.
    prod0 = counters * PHILOX_M0
    c2 = ((prod0 >> 32) & MASK32) ^ k1 ^ stream
    c3 = prod0 & MASK32
    c0 = ((positions & MASK32).view(rows, 1) ^ k0).expand(rows, n).clone()
    c1 = torch.zeros(rows, n, dtype=torch.int64, device=dev)
    prod1 = torch.empty_like(c1)
    spare = torch.empty_like(c1)
    for _ in range(9):
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
        torch.mul(c0, PHILOX_M0, out=prod0)
        torch.mul(c2, PHILOX_M1, out=prod1)
        torch.bitwise_right_shift(prod1, 32, out=spare)
        spare.bitwise_and_(MASK32).bitwise_xor_(c1).bitwise_xor_(k0)
        torch.bitwise_and(prod1, MASK32, out=c1)
        torch.bitwise_right_shift(prod0, 32, out=c2)
        c2.bitwise_and_(MASK32).bitwise_xor_(c3).bitwise_xor_(k1)
        torch.bitwise_and(prod0, MASK32, out=c3)
        c0, spare = spare, c0
    return c0, c1, c2, c3


def philox_bits(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's 64 bits ``(hi, lo)`` (int64 holding uint32) for every token of each row (RNG contract v2).

    Same bits as `runnercheck.reference.rng.noise_bits` (checked in the tests): hi words four tokens per
    call on stream 0, lo words one call per token on stream 4; in-place int64 ops on ``[rows, V]``
    at once: ~4x faster on CPU than the reference, which is what makes 1e8 draws feasible.
    """
    from runnercheck.reference.rng import NOISE_LO_STREAM, NOISE_STREAM

    rows = seeds.shape[0]
    dev = seeds.device
    k0 = (seeds & MASK32).view(rows, 1)
    k1 = ((seeds >> 32) & MASK32).view(rows, 1)
    quads = (vocab_size + 3) // 4
    words = _philox_rows(k0, k1, torch.arange(quads, dtype=torch.int64, device=dev).expand(rows, quads).contiguous(),
                         positions, NOISE_STREAM)
    hi = torch.stack(words, dim=2).reshape(rows, 4 * quads)[:, :vocab_size].contiguous()
    token_ids = torch.arange(vocab_size, dtype=torch.int64, device=dev).expand(rows, vocab_size).contiguous()
    lo = _philox_rows(k0, k1, token_ids, positions, NOISE_LO_STREAM)[0]
    return hi, lo


_ONE_MINUS_2_24 = 1.0 - 2.0**-24


def gumbel_noise(hi: torch.Tensor, lo: torch.Tensor, variant: str = "u64") -> torch.Tensor:
    """float32 Gumbel noise from the 64 bits, per the spec (``u64``) or a planted precision bug.

    ``u64``: ``u = hi 2^-32 + (lo + 0.5) 2^-64`` clamped to ``1 - 2^-24``, ``g = -log(-log1p(-u))``
    (max ~45).  ``u32``: ``u = (hi + 0.5) 2^-32`` (max ~22.9).  ``floor31``: the u64 uniform floored
    at 2^-31 (max ~21.5).  ``u24``: ``u = (hi >> 8) 2^-24`` like an fp32 ``torch.rand``, which can be
    exactly 0 and then gives ``+inf`` noise (probability 2^-24 per token).  ``fp16`` / ``bf16``: the
    u64 uniform and the transform evaluated in half / bfloat16 arithmetic (fp16: u < 2^-25 rounds
    to 0, ``+inf`` noise; both: noise rounded to 11 / 8 significant bits, so near-tied scores tie).
    """
    if variant not in NOISE_VARIANTS:
        raise ValueError(f"unknown noise variant {variant!r}; choose one of {NOISE_VARIANTS}")
    f32 = torch.float32
    if variant == "u32":
        u = (hi.to(f32) + 0.5) * 2.0**-32
    elif variant == "u24":
        u = (hi >> 8).to(f32) * 2.0**-24
    else:
        u = hi.to(f32) * 2.0**-32 + (lo.to(f32) + 0.5) * 2.0**-64
        if variant == "floor31":
            u = torch.clamp(u, min=2.0**-31)
    u = torch.clamp(u, max=_ONE_MINUS_2_24)
    if variant in ("fp16", "bf16"):
        low = u.to(torch.float16 if variant == "fp16" else torch.bfloat16)
        return (-torch.log(-torch.log1p(-low))).to(f32)
    return -torch.log(-torch.log1p(-u))


# --------------------------------------------------------------------------- the spec pipeline, fp32


@dataclass(frozen=True)
class GumbelVariant:
    """The knobs a planted bias turns; the defaults follow docs/SAMPLING.md exactly.

    ``top_k_offset``: keep the top ``k + offset``.  ``top_p_boundary``: ``drop`` the token that
    crosses ``top_p`` / keep one ``extra`` past it.  ``temperature_power``: divide by ``T`` this many
    times.  ``penalty_sign``: -1 rewards repeated tokens instead of penalising them.
    ``share_request_noise``: every row of a request draws the noise of the request's first row.
    ``min_p_before_temperature``: the min-p threshold taken on the unscaled logits (``p_i >= min_p
    p_max`` at T = 1, i.e. ``min_p ** (1/T)`` at the case's T).
    """

    noise: str = "u64"
    top_k_offset: int = 0
    top_p_boundary: str = "spec"
    temperature_power: int = 1
    penalty_sign: int = 1
    share_request_noise: bool = False
    min_p_before_temperature: bool = False

    def __post_init__(self) -> None:
        if self.noise not in NOISE_VARIANTS:
            raise ValueError(f"noise {self.noise!r} not in {NOISE_VARIANTS}")
        if self.top_p_boundary not in TOP_P_BOUNDARY:
            raise ValueError(f"top_p_boundary {self.top_p_boundary!r} not in {TOP_P_BOUNDARY}")


def _penalise(l: torch.Tensor, params: SamplingParams, history: TokenHistory, sign: int) -> torch.Tensor:
    vocab = l.shape[1]
    dev = l.device
    out_counts = torch.zeros(vocab, dtype=torch.float32, device=dev)
    if history.output_ids:
        out_counts.index_add_(0, torch.tensor(history.output_ids, device=dev), torch.ones(len(history.output_ids), device=dev))
    r = float(params.repetition_penalty)
    if r != 1.0:
        seen = out_counts > 0
        if history.prompt_ids:
            seen[torch.tensor(history.prompt_ids, device=dev)] = True
        shrink, grow = (l / r, l * r) if sign > 0 else (l * r, l / r)
        l = torch.where(seen, torch.where(l > 0, shrink, grow), l)
    f, p = float(params.frequency_penalty), float(params.presence_penalty)
    if f != 0.0 or p != 0.0:
        l = l - sign * (f * out_counts + p * (out_counts > 0).to(torch.float32))
    return l


def _keep_mask(s: torch.Tensor, params: SamplingParams, variant: GumbelVariant, unscaled: torch.Tensor) -> torch.Tensor:
    """Steps 4-6 (min-p, top-k, top-p) on fp32 scores ``[B, V]``; ties at each threshold kept."""
    keep = s > -math.inf
    if params.min_p > 0.0:
        m = unscaled if variant.min_p_before_temperature else s
        top = torch.where(keep, m, -math.inf).amax(dim=1, keepdim=True)
        keep &= m >= top + math.log(params.min_p)
    if params.top_k != -1 or params.top_p < 1.0:
        ordered = torch.sort(torch.where(keep, s, -math.inf), dim=1, descending=True).values
        num_kept = keep.sum(dim=1, keepdim=True)
        if params.top_k != -1:
            k = params.top_k + variant.top_k_offset
            if k >= 1:
                kth = ordered[:, min(k, ordered.shape[1]) - 1 : min(k, ordered.shape[1])]
                keep &= (s >= kth) | (num_kept <= k)
                num_kept = keep.sum(dim=1, keepdim=True)
                ordered = torch.where(torch.arange(ordered.shape[1], device=s.device) < num_kept, ordered, -math.inf)
        if params.top_p < 1.0:
            cumulative = torch.cumsum(torch.softmax(ordered, dim=1), dim=1)
            first = (cumulative < params.top_p).sum(dim=1, keepdim=True)
            if variant.top_p_boundary == "drop":
                first = first - 1
            elif variant.top_p_boundary == "extra":
                first = first + 1
            first = torch.clamp(torch.minimum(first, num_kept - 1), min=0)  # num_kept 0: an all -inf row
            keep &= s >= torch.gather(ordered, 1, first)
    return keep


class GumbelSampler:
    """docs/SAMPLING.md in float32 PyTorch with the spec's noise; any `GumbelVariant` plants a bug.

    Stateless: every call computes from its arguments only (no tensor outlives a call).  On CUDA
    the noise + argmax step runs fused (`runnercheck.checks.chisq.gumbel_kernel`, same math) for the fp32 variants.
    """

    def __init__(self, variant: GumbelVariant = GumbelVariant(), name: str = "gumbel"):
        self.variant = variant
        self.name = name

    def __repr__(self) -> str:
        return f"GumbelSampler({self.name!r}, {self.variant})"

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        seeds: torch.Tensor,
        positions: torch.Tensor,
        *,
        history: Sequence[TokenHistory] | None = None,
        request_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits, seeds, positions = _check_call(logits, params, seeds, positions)
        if self.variant.share_request_noise and request_index is not None:
            positions = _first_row_positions(positions, request_index.to(positions.device))
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        for (p, h), rows in _group_rows(params, history).items():
            rows_t = torch.tensor(rows, device=logits.device)
            out[rows_t] = self._sample_group(logits[rows_t], p, h, seeds[rows_t], positions[rows_t])
        return out

    def _sample_group(self, logits, params, history, seeds, positions) -> torch.Tensor:
        vocab = logits.shape[1]
        budget = CUDA_CHUNK_ELEMENTS if logits.is_cuda else CPU_CHUNK_ELEMENTS
        step = max(1, budget // vocab)
        return torch.cat([
            self._sample_chunk(logits[i : i + step], params, history, seeds[i : i + step], positions[i : i + step])
            for i in range(0, logits.shape[0], step)
        ])

    def _sample_chunk(self, raw, params, history, seeds, positions) -> torch.Tensor:
        v = self.variant
        l = torch.nan_to_num(raw, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        has_posinf = torch.isposinf(l).any(dim=1)
        all_neginf = (l == -math.inf).all(dim=1)
        if has_penalties(params):
            l = _penalise(l, params, history or TokenHistory(), v.penalty_sign)
        if params.temperature == 0:
            tokens = torch.argmax(l, dim=1)
        else:
            s = l
            for _ in range(v.temperature_power):
                s = s / params.temperature
            keep = _keep_mask(s, params, v, unscaled=l)
            if s.is_cuda and v.noise in FUSED_NOISE_VARIANTS:
                from runnercheck.checks.chisq.gumbel_kernel import gumbel_argmax

                tokens = gumbel_argmax(torch.where(keep, s, -math.inf), seeds, positions, v.noise)
            else:
                noise = gumbel_noise(*philox_bits(seeds, positions, l.shape[1]), variant=v.noise)
                tokens = torch.argmax(torch.where(keep, s + noise, -math.inf), dim=1)
        forced = torch.argmax(torch.isposinf(raw).to(torch.int8), dim=1)
        tokens = torch.where(has_posinf, forced, tokens)
        return torch.where(all_neginf & ~has_posinf, torch.zeros_like(tokens), tokens)


_SPEC_SAMPLER = GumbelSampler()


def sample_row(raw: torch.Tensor, params: SamplingParams, seed: int, position: int,
               prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
    """One logit row ``[V]`` -> its token, docs/SAMPLING.md in float32: the one fp32 baseline
    (`GumbelSampler` on a single row), for host-side runners such as `runnercheck.stress.run.runners.SimpleRunner`."""
    history = TokenHistory(tuple(prompt_ids), tuple(output_ids))
    token = _SPEC_SAMPLER(raw.reshape(1, -1), [params], torch.tensor([seed], dtype=torch.int64),
                          torch.tensor([position], dtype=torch.int64), history=[history])
    return int(token[0])


def _check_call(logits, params, seeds, positions):
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a 2-D tensor [N, V], got {getattr(logits, 'shape', type(logits))}")
    n = logits.shape[0]
    if len(params) != n or seeds.shape != (n,) or positions.shape != (n,):
        raise ValueError(f"{n} logit rows need {n} params, seeds and positions "
                         f"(got {len(params)}, {tuple(seeds.shape)}, {tuple(positions.shape)})")
    dev = logits.device
    return logits.to(torch.float32), seeds.to(dev, torch.int64), positions.to(dev, torch.int64)


def _group_rows(params: Sequence[SamplingParams], history: Sequence[TokenHistory] | None) -> dict:
    groups: dict[tuple[SamplingParams, TokenHistory | None], list[int]] = {}
    for i, p in enumerate(params):
        h = history[i] if history is not None and has_penalties(p) else None
        groups.setdefault((p, h), []).append(i)
    return groups


def _first_row_positions(positions: torch.Tensor, request_index: torch.Tensor) -> torch.Tensor:
    """For each row, the position of the first row of the same request (the planted draft bug)."""
    _, inverse = torch.unique(request_index, return_inverse=True)
    rows = torch.arange(positions.shape[0], device=positions.device)
    first = torch.full((int(inverse.max()) + 1,), positions.shape[0], dtype=torch.int64, device=positions.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return positions[first[inverse]]


# --------------------------------------------------------------------------- plain PyTorch adapter


def torch_multinomial_sampler(
    logits: torch.Tensor, params: Sequence[SamplingParams], seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Temperature, min-p, top-k, top-p by sorting, then ``torch.multinomial``; no penalties.

    A different construction from Gumbel-max (explicit probabilities, the framework's RNG) that
    must pass the same tests.  The generator is seeded from a hash of all (seed, position) keys,
    so a call is reproducible and calls with different keys are independent.
    """
    logits, seeds, positions = _check_call(logits, params, seeds, positions)
    for p in params:
        if has_penalties(p):
            raise SamplerUnsupportedError("torch_multinomial_sampler implements no penalties")
    key = hashlib.blake2b(seeds.cpu().numpy().tobytes() + positions.cpu().numpy().tobytes(), digest_size=8).digest()
    gen = torch.Generator(device=logits.device).manual_seed(int.from_bytes(key, "little") & (2**63 - 1))
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for (p, _), rows in _group_rows(params, None).items():
        idx = torch.tensor(rows, device=logits.device)
        l = torch.nan_to_num(logits[idx], nan=-math.inf)
        if p.temperature == 0:
            out[idx] = torch.argmax(l, dim=1)
            continue
        probs = torch.softmax(l / p.temperature, dim=1)
        if p.min_p > 0:
            probs = torch.where(probs >= p.min_p * probs.amax(dim=1, keepdim=True), probs, 0.0)
        if p.top_k != -1 and p.top_k < probs.shape[1]:
            kth = torch.topk(probs, p.top_k, dim=1).values[:, -1:]
            probs = torch.where(probs >= kth, probs, 0.0)
        if p.top_p < 1.0:
            ordered = torch.sort(probs, dim=1, descending=True).values
            cumulative = torch.cumsum(ordered / ordered.sum(dim=1, keepdim=True), dim=1)
            first = torch.clamp((cumulative < p.top_p).sum(dim=1, keepdim=True), max=probs.shape[1] - 1)
            probs = torch.where(probs >= torch.gather(ordered, 1, first), probs, 0.0)
        out[idx] = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return out


# What it implements, declared for `runnercheck.checks.chisq.sampler_contract`: a case with penalties is skipped up front.
torch_multinomial_sampler.supported_params = frozenset({"temperature", "top_k", "top_p", "min_p"})  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- planted biases and loading


@dataclass(frozen=True)
class PlantedBias:
    """One planted bias: a `GumbelVariant` of the baseline, or (``factory``) another sampler of ours."""

    name: str
    variant: GumbelVariant
    description: str
    factory: Callable[[], Callable] | None = None


PLANTED_BIASES: dict[str, PlantedBias] = {
    b.name: b
    for b in (
        PlantedBias("fp16-noise", GumbelVariant(noise="fp16"), "uniform and Gumbel transform in fp16 arithmetic"),
        PlantedBias("bf16-noise", GumbelVariant(noise="bf16"), "uniform and Gumbel transform in bf16 arithmetic"),
        PlantedBias("u24-uniform", GumbelVariant(noise="u24"), "uniform truncated to 24 bits (torch.rand-style, can be 0)"),
        PlantedBias("u31-floor", GumbelVariant(noise="floor31"), "uniform floored at 2^-31 (noise capped near 21.5)"),
        PlantedBias("u32-uniform", GumbelVariant(noise="u32"), "32-bit uniform (noise capped near 22.9)"),
        PlantedBias("top-k-off-by-one", GumbelVariant(top_k_offset=1), "top-k keeps k+1 tokens"),
        PlantedBias("top-p-drop-boundary", GumbelVariant(top_p_boundary="drop"), "top-p drops the token that crosses top_p"),
        PlantedBias("top-p-extra-token", GumbelVariant(top_p_boundary="extra"), "top-p keeps one token past the crossing one"),
        PlantedBias("temperature-twice", GumbelVariant(temperature_power=2), "logits divided by the temperature twice"),
        PlantedBias("penalty-wrong-sign", GumbelVariant(penalty_sign=-1), "penalties reward repeated tokens"),
        PlantedBias("draft-shared-noise", GumbelVariant(share_request_noise=True), "draft rows reuse the target row's noise position"),
        PlantedBias("min-p-before-temperature", GumbelVariant(min_p_before_temperature=True),
                    "min-p threshold taken on the logits before temperature scaling"),
        PlantedBias("fp16-probabilities", GumbelVariant(), "inverse-CDF sampling from probabilities stored in fp16",
                    factory=inverse_cdf_factory(probs="fp16", name="bias-fp16-probabilities")),
        PlantedBias("u16-uniform", GumbelVariant(), "inverse-CDF sampling with a 16-bit uniform",
                    factory=inverse_cdf_factory(uniform_bits=16, name="bias-u16-uniform")),
    )
}


def planted_sampler(name: str) -> Callable:
    if name not in PLANTED_BIASES:
        raise SamplerSpecError(f"unknown planted bias {name!r}; known: {', '.join(PLANTED_BIASES)}")
    if PLANTED_BIASES[name].factory is not None:
        return PLANTED_BIASES[name].factory()
    return GumbelSampler(PLANTED_BIASES[name].variant, name=f"bias-{name}")


BUILTIN_SAMPLERS: dict[str, Callable[[], Callable]] = {
    "gumbel": lambda: GumbelSampler(),
    "torch": lambda: torch_multinomial_sampler,
    "impl": lambda: _impl_sampler(),
}


def _impl_sampler() -> Callable:
    # Loaded by name: checks.impl_sampler builds on this module, so a static import would be a cycle.
    return load_callable("runnercheck.checks.chisq.impl_sampler:ImplSampler", "sampler")()


def is_builtin_sampler(spec: str) -> bool:
    """Whether ``spec`` names one of our samplers (a `BUILTIN_SAMPLERS` name or ``bias-<name>``), not third-party code."""
    spec = spec.strip()
    return spec in BUILTIN_SAMPLERS or spec.startswith("bias-")


def load_sampler(spec: str) -> Callable:
    """A builtin name (``gumbel``, ``torch``, ``impl``, ``bias-<name>``), ``package.module:function`` or
    ``path/to/file.py:function`` (`runnercheck.checks.loader`: the working folder is appended to the
    import path; a file is loaded under a private module name)."""
    if not isinstance(spec, str) or not spec.strip():
        raise SamplerSpecError(f"sampler spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec in BUILTIN_SAMPLERS:
        return BUILTIN_SAMPLERS[spec]()
    if spec.startswith("bias-"):
        return planted_sampler(spec[len("bias-"):])
    if ":" not in spec:
        known = ", ".join([*BUILTIN_SAMPLERS, *(f"bias-{b}" for b in PLANTED_BIASES)])
        raise SamplerSpecError(f"sampler {spec!r} is neither a builtin ({known}) nor 'package.module:function' "
                               "or 'path/to/file.py:function'")
    try:
        return load_callable(spec, "sampler")
    except SpecSyntaxError as e:
        raise SamplerSpecError(str(e)) from None
    except SpecNotFoundError as e:
        raise SamplerNotFoundError(str(e)) from None
    except SpecNotCallableError as e:
        raise SamplerNotCallableError(str(e)) from None
    except LoaderError as e:  # found, but raised on import
        raise SamplerSpecError(str(e)) from None


def sampler_name(fn: Callable) -> str:
    name = getattr(fn, "name", None)
    if isinstance(name, str):
        return name
    return spec_of(fn)  # a function loaded from a file is named by its file


__all__ = [
    "SamplerFn", "TokenHistory", "GumbelSampler", "GumbelVariant", "PlantedBias", "PLANTED_BIASES",
    "load_sampler", "is_builtin_sampler", "planted_sampler", "torch_multinomial_sampler", "philox_bits", "sample_row",
    "gumbel_noise", "accepts_keyword",
]
