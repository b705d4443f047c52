"""Model configuration and plain weights for the built-in Llama/Qwen2/Qwen3-style decoder.

Shared by the runner and the oracle; imports nothing else from `impl`.  `ModelWeights` is plain
data: tensors in one dtype on one device, owned by whoever built it (the runner copies them to its
device and dtype; the oracle converts them to float64 on CPU).

Layout (HuggingFace Llama convention): linear weights are ``[out_features, in_features]`` and are
applied as ``x @ W.T``.  Attention heads are laid out head-major in the projection outputs.
RoPE is the "rotate half" form over the full head dimension.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


class WeightsError(ValueError):
    """A checkpoint folder or config that cannot be loaded (missing tensor, wrong shape, bad config)."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_model_len: int = 256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "max_model_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise WeightsError(f"ModelConfig.{name}={v!r} must be a positive int")
        if self.num_heads % self.num_kv_heads:
            raise WeightsError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise WeightsError(f"head_dim {self.head_dim} must be even (RoPE rotates halves)")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise WeightsError("rope_theta and rms_norm_eps must be > 0")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise WeightsError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)


PRESETS: dict[str, ModelConfig] = {
    # CPU tests: interpreted Triton, keep program counts small.
    "tiny": ModelConfig(),
    # Even smaller, for the slowest interpreted paths (state machines).
    "micro": ModelConfig(vocab_size=256, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64, max_model_len=128),
    # Draft models (impl.draft_proposer): the vocabulary and context of "micro" / "tiny", a smaller body.
    "micro-draft": ModelConfig(vocab_size=256, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32, max_model_len=128),
    "tiny-draft": ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64),
    # A Qwen3-vocabulary draft for the qwen3-0.6b target (GPU benchmarks).
    "qwen3-0.6b-draft": ModelConfig(
        vocab_size=151936, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
        intermediate_size=512, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        qk_norm=True, max_model_len=4096,
    ),
    # Qwen3-0.6B-shaped (random weights) for GPU benchmarks.
    "qwen3-0.6b": ModelConfig(
        vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
        intermediate_size=3072, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        qk_norm=True, max_model_len=4096,
    ),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise WeightsError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    q_proj: torch.Tensor  # [heads*head_dim, hidden]
    k_proj: torch.Tensor  # [kv_heads*head_dim, hidden]
    v_proj: torch.Tensor  # [kv_heads*head_dim, hidden]
    o_proj: torch.Tensor  # [hidden, heads*head_dim]
    post_attn_norm: torch.Tensor  # [hidden]
    gate_proj: torch.Tensor  # [intermediate, hidden]
    up_proj: torch.Tensor  # [intermediate, hidden]
    down_proj: torch.Tensor  # [hidden, intermediate]
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # [head_dim]
    k_norm: torch.Tensor | None = None  # [head_dim]


@dataclass
class ModelWeights:
    config: ModelConfig
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden] (the embedding itself when tied)

    def to(self, device: torch.device | str, dtype: torch.dtype) -> "ModelWeights":
        def cv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype).contiguous()

        layers = [LayerWeights(**{k: cv(v) for k, v in vars(lw).items()}) for lw in self.layers]
        embed = cv(self.embed)
        lm_head = embed if self.config.tie_word_embeddings else cv(self.lm_head)
        return ModelWeights(self.config, embed, layers, cv(self.final_norm), lm_head)


def random_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Deterministic random weights (CPU), scaled so activations and logits stay O(1)-O(10)."""
    gen = torch.Generator().manual_seed(seed)
    c = config

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).to(dtype)

    def norm_weight(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)).to(dtype)

    h, hd = c.hidden_size, c.head_dim
    layers = []
    for _ in range(c.num_layers):
        layers.append(
            LayerWeights(
                input_norm=norm_weight(h),
                q_proj=normal(c.num_heads * hd, h, std=h**-0.5),
                k_proj=normal(c.num_kv_heads * hd, h, std=h**-0.5),
                v_proj=normal(c.num_kv_heads * hd, h, std=h**-0.5),
                o_proj=normal(h, c.num_heads * hd, std=(c.num_heads * hd) ** -0.5),
                post_attn_norm=norm_weight(h),
                gate_proj=normal(c.intermediate_size, h, std=h**-0.5),
                up_proj=normal(c.intermediate_size, h, std=h**-0.5),
                down_proj=normal(h, c.intermediate_size, std=c.intermediate_size**-0.5),
                q_bias=normal(c.num_heads * hd, std=0.1) if c.qkv_bias else None,
                k_bias=normal(c.num_kv_heads * hd, std=0.1) if c.qkv_bias else None,
                v_bias=normal(c.num_kv_heads * hd, std=0.1) if c.qkv_bias else None,
                q_norm=norm_weight(hd) if c.qk_norm else None,
                k_norm=norm_weight(hd) if c.qk_norm else None,
            )
        )
    embed = normal(c.vocab_size, h, std=1.0)
    # Logit scale ~ 3: distributions that are neither one-hot nor flat, so sampling is exercised.
    lm_head = embed if c.tie_word_embeddings else normal(c.vocab_size, h, std=3.0 * h**-0.5)
    return ModelWeights(c, embed, layers, norm_weight(h), lm_head)


# --------------------------------------------------------------------------- safetensors folders

_HF_LAYER_NAMES = {
    "input_norm": "input_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "post_attn_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
}


class DraftVocabMismatchError(WeightsError):
    """A draft model whose vocabulary differs from the target's (or whose context is shorter)."""


def draft_weights(name: str, seed: int, target: ModelConfig) -> "ModelWeights":
    """Random weights of draft preset ``name`` for a target of config ``target``.

    The draft must share the target's vocabulary (its drafts and distributions index the same
    tokens) and cover its context; otherwise `DraftVocabMismatchError`.
    """
    config = preset(name)
    if config.vocab_size != target.vocab_size:
        raise DraftVocabMismatchError(f"draft preset {name!r} has vocabulary {config.vocab_size}, the target {target.vocab_size}")
    if config.max_model_len < target.max_model_len:
        raise DraftVocabMismatchError(f"draft preset {name!r} has max_model_len {config.max_model_len} < the target's {target.max_model_len}")
    return random_weights(config, seed=seed)


def config_from_hf(hf: dict, max_model_len: int | None = None) -> ModelConfig:
    """Map a HuggingFace Llama/Qwen2/Qwen3 ``config.json`` onto `ModelConfig`."""
    try:
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        model_type = str(hf.get("model_type", "llama"))
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads", heads)),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            intermediate_size=int(hf["intermediate_size"]),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
            max_model_len=int(max_model_len or hf.get("max_position_embeddings", 4096)),
        )
    except KeyError as e:
        raise WeightsError(f"config.json lacks {e.args[0]!r}") from None


def load_safetensors_folder(folder: str | Path, dtype: torch.dtype = torch.float32, max_model_len: int | None = None) -> ModelWeights:
    """Load a local Llama/Qwen2/Qwen3-format checkpoint (``config.json`` + ``*.safetensors``)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise WeightsError(f"{folder} has no config.json")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise WeightsError(f"{cfg_path}: not JSON ({e})") from None
    config = config_from_hf(hf, max_model_len)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{folder} has no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))

    def take(name: str, shape: tuple[int, ...], required: bool = True) -> torch.Tensor | None:
        t = tensors.get(name)
        if t is None:
            if required:
                raise WeightsError(f"checkpoint lacks tensor {name!r}")
            return None
        if tuple(t.shape) != shape:
            raise WeightsError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t.to(dtype)

    c = config
    h, hd = c.hidden_size, c.head_dim
    shapes = {
        "input_norm": (h,), "q_proj": (c.num_heads * hd, h), "k_proj": (c.num_kv_heads * hd, h),
        "v_proj": (c.num_kv_heads * hd, h), "o_proj": (h, c.num_heads * hd), "post_attn_norm": (h,),
        "gate_proj": (c.intermediate_size, h), "up_proj": (c.intermediate_size, h),
        "down_proj": (h, c.intermediate_size), "q_bias": (c.num_heads * hd,), "k_bias": (c.num_kv_heads * hd,),
        "v_bias": (c.num_kv_heads * hd,), "q_norm": (hd,), "k_norm": (hd,),
    }
    optional = {"q_bias": c.qkv_bias, "k_bias": c.qkv_bias, "v_bias": c.qkv_bias, "q_norm": c.qk_norm, "k_norm": c.qk_norm}
    layers = []
    for i in range(c.num_layers):
        kw = {}
        for key, hf_name in _HF_LAYER_NAMES.items():
            if key in optional and not optional[key]:
                kw[key] = None
                continue
            kw[key] = take(f"model.layers.{i}.{hf_name}", shapes[key])
        layers.append(LayerWeights(**kw))
    embed = take("model.embed_tokens.weight", (c.vocab_size, h))
    if c.tie_word_embeddings:
        lm_head = embed
    else:
        lm_head = take("lm_head.weight", (c.vocab_size, h))
    return ModelWeights(c, embed, layers, take("model.norm.weight", (h,)), lm_head)


def save_safetensors_folder(weights: ModelWeights, folder: str | Path) -> None:
    """Write weights as a HuggingFace-style folder (used by tests to make a tiny checkpoint)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = weights.config
    hf = {
        "model_type": "qwen3" if c.qk_norm else ("qwen2" if c.qkv_bias else "llama"),
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size, "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings, "attention_bias": c.qkv_bias,
        "max_position_embeddings": c.max_model_len,
    }
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    tensors = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.final_norm}
    if not c.tie_word_embeddings:
        tensors["lm_head.weight"] = weights.lm_head
    for i, lw in enumerate(weights.layers):
        for key, hf_name in _HF_LAYER_NAMES.items():
            t = getattr(lw, key)
            if t is not None:
                tensors[f"model.layers.{i}.{hf_name}"] = t
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(folder / "model.safetensors"))


__all__ = [
    "ModelConfig", "ModelWeights", "LayerWeights", "PRESETS", "preset", "random_weights", "draft_weights", "DraftVocabMismatchError",
    "load_safetensors_folder", "save_safetensors_folder", "config_from_hf", "WeightsError",
]
