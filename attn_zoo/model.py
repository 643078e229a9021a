"""A small decoder-only GPT whose attention layers are any attn-zoo variant.

Readable in the spirit of nanoGPT (Karpathy): token embedding -> ``n_layer`` pre-norm blocks
(``x + attn(norm(x))``, ``x + mlp(norm(x))``) -> final norm -> tied output projection.

* Positions: rotary embeddings (RoPE, Su et al. 2021) applied to q and k inside every attention layer.
* Norm: ``layernorm`` or ``rmsnorm`` (Zhang & Sennrich 2019).
* MLP: ``gelu`` (GPT-2) or ``swiglu`` (Shazeer 2020, hidden width ``2/3 * 4 * d_model`` rounded to 8).
* Attention: q/k/v/o projections; K/V have ``spec.resolve_kv_heads(n_head)`` heads (GQA / MQA), and the
  core is :func:`attn_zoo.attention` with ``(B, H, N, D)`` tensors, so every variant and backend plugs in.
* Short convolution (``short_conv=K``, off at 0): a causal depthwise convolution of width ``K`` on every mixer's
  input (:class:`ShortConv`), the "shift" / short conv of H3 (Fu et al. 2023), Based (Arora et al. 2024) and Mamba
  (Gu & Dao 2023). Each position then also sees its last ``K - 1`` tokens, so a single attention layer can do
  associative recall (a value's position carries its key) and MQAR leaves its plateau within a few hundred steps.
* Hybrids: one layer spec per layer (``GPT(config, [lin, lin, flash, lin])``): an
  :class:`~attn_zoo.spec.AttentionSpec` (the ``attention`` mixer, :class:`Attention`) or a
  :class:`~attn_zoo.mixers.MixerSpec` of any registered sequence mixer (:mod:`attn_zoo.mixers`: a module
  ``(B, N, d_model) -> (B, N, d_model)``, e.g. a convolution or a state-space layer).
* FAVOR+ (Performer) random features can be redrawn: :meth:`GPT.redraw_features` sets a new seed for every
  ``favor`` layer (deterministic in ``(base seed, step // redraw_interval)``).
* Generation with a cache (:meth:`GPT.generate`, ``use_cache=True``): every layer keeps its variant's decode
  state (:meth:`GPT.init_cache`): a :class:`~attn_zoo.decode.KVCache` for exact / sparse layers (contiguous or
  paged), a window-sized one for causal sliding-window layers, a :class:`~attn_zoo.decode.LinearState` (O(1))
  for linear layers. The prompt is prefilled with :func:`attn_zoo.attention` /
  :func:`attn_zoo.decode.linear_prefill`, each new token attends through :func:`attn_zoo.decode_attention` /
  :func:`attn_zoo.decode.linear_decode`. Greedy decoding with the cache equals greedy decoding without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .decode import KVCache, LinearState, linear_decode, linear_prefill
from .functional import attention
from .registry import backend_names
from .mixers import (LayerSpec, MixerSpec, build_mixer, causality_probe, forward_takes, layer_from_dict,  # noqa: F401
                     layer_takes, layer_to_dict, probe_device_dtype, register_mixer)
from .spec import AttentionSpec
from .variants import get_variant

LayerCache = Union[KVCache, LinearState]

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")


@dataclass(frozen=True)
class GPTConfig:
    """Model hyper-parameters (the attention variant lives in the per-layer specs, incl. ``n_kv_heads``).

    Raises ``ValueError`` naming the field on bad values.
    """

    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    max_seq_len: int = 256
    dropout: float = 0.0
    mlp: str = "gelu"
    norm: str = "layernorm"
    bias: bool = False
    rope_base: float = 10000.0
    tie_embeddings: bool = True
    short_conv: int = 0  # width K of a causal depthwise conv before every mixer (ShortConv); 0 = none

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"head_dim=d_model/n_head={self.d_model // self.n_head} must be even for RoPE")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp={self.mlp!r} is not supported; allowed values: {', '.join(MLPS)}")
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} is not supported; allowed values: {', '.join(NORMS)}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        rb = self.rope_base
        if isinstance(rb, bool) or not isinstance(rb, (int, float)) or not math.isfinite(rb) or rb <= 0:
            raise ValueError(f"rope_base must be a positive number (e.g. 10000.0), got {rb!r}")
        sc = self.short_conv
        if not isinstance(sc, int) or isinstance(sc, bool) or sc < 0 or sc == 1:
            raise ValueError(f"short_conv must be 0 (none) or an integer kernel width >= 2 (e.g. 4), got {sc!r}")
        for name in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


def redraw_interval_reason(value) -> Optional[str]:
    """``None`` when ``value`` is a valid ``redraw_interval`` (FAVOR+ feature redraws every that many steps), else
    what it must be."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return "must be an integer >= 0 (0: never redraw the FAVOR+ features)"
    return None


@dataclass(frozen=True)
class ModelConfig:
    """Everything a :class:`GPT` is built from, as one object: the :class:`GPTConfig`, one layer spec per layer
    (:class:`AttentionSpec` or :class:`~attn_zoo.mixers.MixerSpec`) and the FAVOR+ ``redraw_interval``.

    ``train.py`` builds it once from its Hydra config (:func:`harness.config.model_config`), ``LitLM`` builds the model
    from it (:meth:`GPT.from_config`, which keeps it as ``GPT.model_config``). :meth:`to_dict` / :meth:`from_dict` are
    the one conversion to and from plain data (checkpoint hparams: ``model_config``, ``layer_specs``,
    ``redraw_interval``, the keys checkpoints have always had).

    Args:
        config: :class:`GPTConfig`.
        layers: one layer spec, repeated for every layer, or ``config.n_layer`` of them (kept as a tuple).
        redraw_interval: FAVOR layers redraw their random features every that many steps (0 = never).

    Raises:
        TypeError: ``config`` not a :class:`GPTConfig`, a layer not a spec.
        ValueError: a number of layers other than ``config.n_layer``; a bad ``redraw_interval``.
    """

    config: GPTConfig
    layers: Tuple[LayerSpec, ...]
    redraw_interval: int = 0

    def __post_init__(self):
        if not isinstance(self.config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "layers", tuple(resolve_layer_specs(self.layers, self.config.n_layer)))
        why = redraw_interval_reason(self.redraw_interval)
        if why is not None:
            raise ValueError(f"redraw_interval {why}, got {self.redraw_interval!r}")

    def to_dict(self) -> Dict[str, Any]:
        """Plain data (``model_config``: the :class:`GPTConfig` fields, ``layer_specs``: one dict per layer,
        ``redraw_interval``); :meth:`from_dict` inverts it."""
        return {"model_config": asdict(self.config), "layer_specs": [layer_to_dict(s) for s in self.layers],
                "redraw_interval": self.redraw_interval}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelConfig":
        """The inverse of :meth:`to_dict` (``redraw_interval`` may be missing or None: 0). Unknown
        ``model_config`` keys raise ``ValueError`` naming them."""
        redraw = d.get("redraw_interval")
        return cls(config_from_dict(dict(d["model_config"])), tuple(layer_from_dict(s) for s in d["layer_specs"]),
                   0 if redraw is None else redraw)


def resolve_layer_specs(specs: Union[LayerSpec, Sequence[LayerSpec]], n_layer: int) -> List[LayerSpec]:
    """One layer spec (:class:`AttentionSpec` or :class:`~attn_zoo.mixers.MixerSpec`) for every layer: a single
    spec is repeated; a list must have ``n_layer`` entries."""
    if isinstance(specs, (AttentionSpec, MixerSpec)):
        return [specs] * n_layer
    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Iterable):  # a str: letter by letter
        raise TypeError(f"layer specs must be an AttentionSpec or a MixerSpec, or a list of them (one per layer), got "
                        f"{type(specs).__name__}" + (f" (for {specs!r}: attn_zoo.make_spec({specs!r}))"
                                                     if isinstance(specs, str) else ""))
    specs = list(specs)
    for i, s in enumerate(specs):
        if not isinstance(s, (AttentionSpec, MixerSpec)):
            raise TypeError(f"layer specs[{i}] must be an AttentionSpec or a MixerSpec, got {type(s).__name__}")
    if len(specs) != n_layer:
        raise ValueError(f"layer specs: got a list of {len(specs)} specs for n_layer={n_layer}; give a list of "
                         f"{n_layer} (one per layer) or one spec not in a list (repeated on every layer)")
    return specs


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model)
    return nn.LayerNorm(config.d_model, bias=config.bias)


class Rotary(nn.Module):
    """RoPE tables for positions ``0 .. max_seq_len-1`` (rotate-half form), applied to ``(B, H, N, D)``."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (D/2,)
        t = torch.arange(max_seq_len, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (N, D/2)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rotate ``x (B, H, N, D)`` whose rows sit at positions ``offset .. offset + N - 1``, or at ``positions``
        (int ``(B, N)``, each in ``[0, max_seq_len)``, e.g. the position inside each packed document; checked by
        :meth:`GPT.forward`)."""
        n = x.shape[-2]
        if positions is not None:
            cos = self.cos[positions].to(x.dtype).unsqueeze(1)  # (B, 1, N, D/2)
            sin = self.sin[positions].to(x.dtype).unsqueeze(1)
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
            return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        if offset + n > self.cos.shape[0]:
            raise ValueError(f"positions up to {offset + n - 1} exceed the rotary table of {self.cos.shape[0]} (max_seq_len)")
        cos = self.cos[offset: offset + n].to(x.dtype)  # (N, D/2)
        sin = self.sin[offset: offset + n].to(x.dtype)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Multi-head attention layer with q/k/v/o projections around :func:`attn_zoo.attention`.

    ``n_kv_heads = spec.resolve_kv_heads(n_head)``: K and V get ``n_kv_heads * head_dim`` output features
    (GQA / MQA shrink ``k_proj`` and ``v_proj``); query head ``h`` reads K/V head ``h // (n_head // n_kv_heads)``.
    """

    def __init__(self, config: GPTConfig, spec: AttentionSpec, rotary: Rotary, backend: str = "auto"):
        super().__init__()
        self.spec = spec
        self.backend = backend
        self.n_head = config.n_head
        self.n_kv_heads = spec.resolve_kv_heads(config.n_head)
        self.head_dim = config.head_dim
        d, hd = config.d_model, config.head_dim
        self.q_proj = nn.Linear(d, self.n_head * hd, bias=config.bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=config.bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=config.bias)
        self.o_proj = nn.Linear(self.n_head * hd, d, bias=config.bias)
        self.o_proj.residual_proj = True  # GPT-2 scaled init
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rotary = rotary
        self.favor_seed: Optional[int] = None  # set by GPT.redraw_features for FAVOR layers

    @property
    def uses_favor(self) -> bool:
        return self.spec.family == "linear" and getattr(self.spec, "feature_map", None) == "favor"

    def current_spec(self) -> AttentionSpec:
        if self.favor_seed is not None and self.uses_favor:
            return self.spec.replace(seed=self.favor_seed)
        return self.spec

    def new_cache(self, batch_size: int, capacity: int, dtype: torch.dtype, device, page_size: Optional[int] = None,
                  shuffle_pages: bool = False) -> LayerCache:
        """This layer's decode state, as its variant's cache policy builds it
        (:meth:`attn_zoo.variants.CachePolicy.new_cache`): ``"state"`` -> :class:`LinearState`; ``"window"`` of
        ``W`` tokens -> a :class:`KVCache` keeping the last ``W`` tokens (``2 W`` slots, compacted when full);
        ``"full"`` -> a :class:`KVCache` of ``capacity`` tokens (paged when ``page_size`` is set). Raises
        ``ValueError`` for a policy this layer cannot hold (``"latent"``: a mixer of its own)."""
        spec = self.current_spec()
        return get_variant(spec.kind).cache_policy(spec).new_cache(
            spec, batch_size, self.n_kv_heads, self.head_dim, capacity, dtype, device, page_size, shuffle_pages)

    def forward(self, x: torch.Tensor, cache: Optional[LayerCache] = None, pos: int = 0,
                doc_ids: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x (B, N, d_model)`` -> ``(B, N, d_model)``. ``doc_ids`` int ``(B, N)`` (packed documents,
        :mod:`attn_zoo.documents`): every kind stays inside each document (softmax kinds: the variant's mask AND the
        document mask; linear kinds: the state restarts), through :func:`attn_zoo.attention`'s ``doc_ids``.
        ``positions`` int ``(B, N)``: RoPE positions (default ``pos .. pos + N - 1``). Decoding with a ``cache``
        takes no documents (``ValueError`` naming ``doc_ids``)."""
        B, N, C = x.shape  # (B, N, d_model); the N tokens sit at positions pos .. pos + N - 1
        if cache is not None and doc_ids is not None:
            raise ValueError("doc_ids: decoding with a cache takes no documents; pass doc_ids=None with caches")
        q = self.q_proj(x).view(B, N, self.n_head, self.head_dim).transpose(1, 2)  # (B, Hq, N, D)
        k = self.k_proj(x).view(B, N, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, N, D)
        v = self.v_proj(x).view(B, N, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, N, D)
        q, k = self.rotary(q, pos, positions), self.rotary(k, pos, positions)
        spec = self.current_spec()
        if cache is None:  # training / no-cache inference: the whole sequence at once
            y = attention(q, k, v, spec, backend=self.backend, doc_ids=doc_ids)  # (B, Hq, N, D)
        elif isinstance(cache, LinearState):  # O(1) state: chunked prefill, recurrent decode
            if N == 1 and cache.n > 0:
                y, new = linear_decode(q, k, v, cache, spec)
            else:
                y, new = linear_prefill(q, k, v, spec, cache if cache.n > 0 else None, backend=self.backend)
            cache.S, cache.z, cache.n = new.S, new.z, new.n
        elif max(cache.lengths) == 0:  # prefill: ordinary attention over the prompt, then fill the cache
            y = attention(q, k, v, spec, backend=self.backend)
            cache.append(k, v)  # (B, Hkv, N, D) after RoPE, so cached keys keep their absolute positions
        else:  # decode: write the new keys / values, attend over the cache (a window cache: in pieces it holds)
            y = cache.append_attend(k, v, q, spec, backend=self.backend)  # (B, Hq, N, D)
        y = y.transpose(1, 2).reshape(B, N, self.n_head * self.head_dim)  # (B, N, Hq*D)
        return self.resid_dropout(self.o_proj(y))  # (B, N, d_model)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        d = config.d_model
        self.gated = config.mlp == "swiglu"  # SwiGLU (Shazeer 2020) if set, else GELU
        if self.gated:
            hidden = int(2 * 4 * d / 3)
            hidden = 8 * ((hidden + 7) // 8)
            self.gate = nn.Linear(d, hidden, bias=config.bias)
            self.up = nn.Linear(d, hidden, bias=config.bias)
        else:
            hidden = 4 * d
            self.up = nn.Linear(d, hidden, bias=config.bias)
        self.down = nn.Linear(hidden, d, bias=config.bias)
        self.down.residual_proj = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):  # (B, N, d_model)
        if self.gated:
            h = F.silu(self.gate(x)) * self.up(x)
        else:
            h = F.gelu(self.up(x))
        return self.dropout(self.down(h))


class ShortConv(nn.Module):
    """Causal depthwise convolution of width ``K`` over the sequence: ``y_t = x_t + sum_{s < K} w_s * x_{t - s}``
    per channel (zeros before the first token), ``(B, N, d_model) -> (B, N, d_model)``.

    The short convolution / shift of H3 (Fu et al. 2023, "Hungry Hungry Hippos"), Based (Arora et al. 2024,
    "Simple linear attention language models balance the recall-throughput tradeoff"; Zoology, Arora et al. 2023,
    shows it is what lets one layer do associative recall) and Mamba (Gu & Dao 2023). The residual ``x_t`` keeps
    the block an identity-plus-small-change at initialization. Incremental decoding keeps the last ``K - 1`` inputs
    (``tail``, ``(B, K - 1, d_model)``) between calls.
    """

    def __init__(self, d_model: int, kernel_size: int):
        super().__init__()
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 2:
            raise ValueError(f"kernel_size must be an integer >= 2, got {kernel_size!r}")
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model, bias=False)

    def forward(self, x: torch.Tensor, tail: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None):
        """``x (B, N, d_model)`` -> ``(y (B, N, d_model), new tail (B, K - 1, d_model))``; ``tail``: the inputs of
        the ``K - 1`` positions before ``x`` (``None``: the sequence starts with ``x``). ``doc_ids`` int ``(B, N)``
        (packed documents, no ``tail``): a tap never reads a position of another document (it reads zeros, as at the
        start of a sequence), so the convolution restarts at every document start."""
        B, N, C = x.shape
        if tail is None:
            tail = x.new_zeros(B, self.kernel_size - 1, C)
        h = torch.cat([tail.to(x.dtype), x], dim=1)  # (B, K - 1 + N, C)
        if doc_ids is not None:
            K = self.kernel_size
            d = torch.cat([doc_ids[:, :1].expand(-1, K - 1), doc_ids], 1)  # (B, K - 1 + N); the zero tail: doc 0's
            w = self.conv.weight[:, 0].to(x.dtype)  # (C, K)
            y = x.new_zeros(B, N, C)
            for j in range(K):  # tap j reads position t - (K - 1 - j)
                same = (d[:, j:j + N] == d[:, K - 1:]).to(x.dtype).unsqueeze(-1)  # (B, N, 1)
                y = y + h[:, j:j + N] * w[:, j] * same
            return x + y, h[:, -(K - 1):]
        y = self.conv(h.transpose(1, 2)).transpose(1, 2)  # (B, N, C): position t sees t - K + 1 .. t
        return x + y, h[:, -(self.kernel_size - 1):]


@register_mixer("attention")
def _attention_mixer(spec: AttentionSpec, config: GPTConfig, rotary: Rotary, backend: str = "auto") -> Attention:
    """The ``attention`` sequence mixer: :class:`Attention` of an :class:`AttentionSpec`."""
    return Attention(config, spec, rotary, backend)


_attention_mixer.mixer_class = Attention  # what it builds (attn_zoo.mixers.mixer_class: asked before building)


def noncausal_layer_reason(i: int, spec: LayerSpec, key: str = "causal") -> Optional[str]:
    """``None`` when layer ``i`` (``spec``) is causal (position ``t`` sees positions ``<= t`` only, asked of the spec:
    ``spec.causal``), else why :class:`GPT`, a causal language model, refuses it: a non-causal layer sees later
    tokens, so next-token prediction leaks the answer and the loss / bits per byte come out too good. ``key``: the
    name of the setting to change, in the message (``causal`` in Python, ``attention.causal`` in a config)."""
    if spec.causal:
        return None
    if isinstance(spec, MixerSpec):
        why = getattr(spec.factory(), "causal_reason", None)
        from .mixers import causal_mixer_names
        from .variants import variant_kinds

        others = [n for n in causal_mixer_names() if n != "attention"]
        return (f"layer {i} ({spec.label}) is a non-causal mixer (causal=False{': ' + why if why else ''}); GPT is "
                f"a causal language model, so position t may not see later positions; use a causal mixer: "
                f"{', '.join(others)} (registered causal mixers) or attention (kinds: {', '.join(variant_kinds())})")
    return (f"{key}=False: layer {i} ({spec.label}) would attend to later positions; GPT is a causal language "
            f"model (next-token prediction), so position t may not see later positions (the loss would read the "
            f"answer); set {key}=true")


def doc_ids_refusal(layers: Sequence[str]) -> str:
    """The message for ``layers`` (``"layer i (label)"``) whose mixer cannot keep packed documents apart (its
    ``forward`` takes no ``doc_ids``): raised by :meth:`GPT.forward` and, before any data work, by
    :func:`harness.config.validate_config`."""
    return (f"doc_ids: {', '.join(layers)} cannot keep packed documents apart (its mixer's forward takes no "
            f"doc_ids, or its attention variant takes no documents); train it without doc_ids "
            f"(data.doc_mask=false)")


CAUSALITY_PROBE_TOL = 1e-3  # relative change of earlier outputs above which an unregistered mixer is not causal
CAUSALITY_PROBE_LENGTHS = (8, 128)  # probed at these lengths (at most max_seq_len), at max_seq_len when neither can say


def probe_causality(block: "Block", spec: "MixerSpec", config: GPTConfig) -> None:
    """Refuse ``block``'s mixer, an unregistered class without a ``causal`` option, when
    :func:`~attn_zoo.mixers.causality_probe` finds its earlier outputs moved by a later input. Probed with the
    weights the model trains from (after :meth:`GPT._init_weights`: a zero-initialised projection hid every
    dependence), changing each position in turn, at 8 tokens and at ``min(128, max_seq_len)`` (a dilated or
    chunked mixer leaks only past its reach), and at ``max_seq_len`` (the last position changed) when neither could
    say (a mixer that takes that length only). The tolerance is
    :data:`CAUSALITY_PROBE_TOL`, or 4 eps of a half-precision mixer's dtype (rounding, not a leak)."""
    L = config.max_seq_len
    tol = max(CAUSALITY_PROBE_TOL, 4 * torch.finfo(probe_device_dtype(block.attn)[1]).eps)
    lengths = list(dict.fromkeys(min(n, L) for n in CAUSALITY_PROBE_LENGTHS))
    last = [] if L in lengths else [L]  # max_seq_len itself only when the shorter probes could not say
    said = False
    for n in lengths + last:
        if said and n in last:
            break
        moved = causality_probe(block.attn, config.d_model, n, every_position=n not in last)
        said = said or moved is not None
        if moved is not None and moved > tol:
            where = "one" if n not in last else "the last"
            raise ValueError(
                f"{block.where} is not causal: {spec.mixer} is not registered and has no causal option, and "
                f"changing its input at {where} of {n} positions moved its output at earlier positions by "
                f"{moved:.3g} of its scale; GPT is a causal language model, so position t may not see later "
                f"positions. If it is causal, register it: attn_zoo.register_mixer(name, "
                f"{spec.mixer.rsplit('.', 1)[-1]}, causal=True)")


class Block(nn.Module):
    """Pre-norm block ``x + mixer(norm(x))``, ``x + mlp(norm(x))``; the mixer is built from the layer spec by the
    mixer registry (:func:`attn_zoo.mixers.build_mixer`). It is kept as ``attn`` (the checkpoints' key)."""

    def __init__(self, config: GPTConfig, spec: LayerSpec, rotary: Rotary, backend: str, layer_idx: int = 0):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = build_mixer(spec, config, layer_idx=layer_idx, backend=backend, rotary=rotary)
        self.where = f"layer {layer_idx} ({spec.label})"  # named when the mixer's output is not (B, N, d_model)
        self.stateful = hasattr(self.attn, "new_cache")  # takes (x, cache, pos): decodes from a state
        # packed documents: the mixer says what it takes by its forward's keyword arguments (never by its kind)
        self.takes_doc_ids = forward_takes(self.attn, "doc_ids") and layer_takes(spec, "doc_ids") is not False
        # (its state / attention stays inside each document; an attention variant may take none: it says so)
        self.takes_positions = forward_takes(self.attn, "positions")  # it has positions of its own (RoPE)
        self.short_conv = ShortConv(config.d_model, config.short_conv) if config.short_conv else None
        self.norm2 = make_norm(config)
        self.mlp = MLP(config)

    @property
    def mixer(self) -> nn.Module:
        return self.attn

    def forward(self, x, cache: Optional[LayerCache] = None, pos: int = 0, doc_ids: Optional[torch.Tensor] = None,
                positions: Optional[torch.Tensor] = None):
        """``x (B, N, d_model)``; ``doc_ids`` / ``positions`` int ``(B, N)`` (packed documents, no cache): given to
        the mixer when its ``forward`` takes them (:attr:`takes_doc_ids`, :attr:`takes_positions`) and to the short
        convolution (restarts at document starts). ``GPT.forward`` refuses ``doc_ids`` for a mixer without them."""
        h = self.norm1(x)  # (B, N, d_model)
        if self.short_conv is not None:  # decoding: the cache carries the conv's last K - 1 inputs (conv_tail)
            h, tail = self.short_conv(h, getattr(cache, "conv_tail", None) if cache is not None and pos > 0 else None,
                                      doc_ids)
            if cache is not None:
                cache.conv_tail = tail
        kw = {}
        if doc_ids is not None:
            kw["doc_ids"] = doc_ids
        if positions is not None and self.takes_positions:
            kw["positions"] = positions
        y = self.attn(h, cache, pos, **kw) if self.stateful else self.attn(h, **kw)
        if not isinstance(y, torch.Tensor) or y.shape != h.shape:  # a plugin's: not left to the residual add
            got = f"a tensor of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else f"a {type(y).__name__}"
            raise ValueError(f"{self.where}: the mixer returned {got} for its input {tuple(h.shape)}; a sequence mixer "
                             f"maps (B, N, d_model) to (B, N, d_model)")
        x = x + y
        x = x + self.mlp(self.norm2(x))
        return x


class GPT(nn.Module):
    """Decoder-only language model.

    Args:
        config: :class:`GPTConfig`.
        specs: one layer spec for every layer, or a list of ``n_layer`` of them (hybrids): an
            :class:`AttentionSpec` or a :class:`~attn_zoo.mixers.MixerSpec` (any registered sequence mixer).
        backend: attention backend for every layer (``"auto"``, ``"triton"``, ``"torch"``, ``"reference"``).
        redraw_interval: FAVOR layers get a new random-feature seed every ``redraw_interval`` training steps
            (0 = never; see :meth:`redraw_features`).

    Raises ``ValueError`` for a non-causal layer (an :class:`AttentionSpec` with ``causal=False`` or a non-causal
    mixer, :func:`noncausal_layer_reason`): the model predicts the next token, which such a layer could read.

    ``forward(idx, targets=None, caches=None, pos=0, sparse_targets=False)``: ``idx`` int64 ``(B, N)`` with
    ``pos + N <= max_seq_len`` (else ``ValueError``); returns logits ``(B, N, vocab_size)`` and, with ``targets``
    ``(B, N)`` (``-100`` = ignored), the mean cross-entropy in nats over the scored positions. ``sparse_targets``
    (tasks that score few positions, such as MQAR): the head runs on the scored rows only and the logits returned are
    theirs, ``(M, vocab_size)`` in ``(B, N)`` row-major order (``M`` = targets ``!= -100``); same loss and gradients,
    one host sync; ignored under ``torch.compile`` (all rows, ``(B, N, vocab_size)``). With ``caches`` (from :meth:`init_cache`) the tokens sit at
    positions ``pos ..`` and every layer reads / extends its cache (incremental decoding).

    Packed documents (issue 27, ``docs/documents.md``): ``doc_ids`` int32 / int64 ``(B, N)``, nondecreasing along each
    row, keeps every layer inside each document: attention of every masked kind (the variant's mask AND the document
    mask), the state of linear / recurrent mixers and the short convolution restart at each document start. The
    output equals running every document on its own. ``positions`` int ``(B, N)`` in ``[0, max_seq_len)``: the
    RoPE positions (default with ``doc_ids``: the position inside each document; without either: ``pos .. pos + N -
    1``). Which layers take ``doc_ids`` is asked of the mixer (its ``forward`` has a ``doc_ids`` argument); a model
    with a layer that does not raises ``ValueError`` naming it. Not with ``caches``.
    """

    def __init__(self, config: GPTConfig, specs: Union[LayerSpec, Sequence[LayerSpec]],
                 backend: str = "auto", redraw_interval: int = 0):
        super().__init__()
        self.config = config
        self.specs = resolve_layer_specs(specs, config.n_layer)
        for i, s in enumerate(self.specs):  # a causal language model: a non-causal layer would see future tokens
            why = noncausal_layer_reason(i, s)
            if why is not None:
                raise ValueError(why)
        names = backend_names()
        if not isinstance(backend, str) or (backend != "auto" and backend not in names):
            raise ValueError(f"backend={backend!r} is not supported; allowed values: auto, {', '.join(names)}")
        self.backend = backend
        why = redraw_interval_reason(redraw_interval)
        if why is not None:
            raise ValueError(f"redraw_interval {why}, got {redraw_interval!r}")
        self.redraw_interval = int(redraw_interval)
        self.model_config = ModelConfig(config, tuple(self.specs), self.redraw_interval)  # GPT.from_config: the given one
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        rotary = Rotary(config.head_dim, config.max_seq_len, config.rope_base)
        self.blocks = nn.ModuleList(Block(config, s, rotary, backend, i) for i, s in enumerate(self.specs))
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # tied input/output embeddings (Press & Wolf 2017)
        self.apply(self._init_weights)
        for blk, s in zip(self.blocks, self.specs):  # an unregistered class: asked by a probe, with these weights
            if isinstance(s, MixerSpec) and not s.causal_declared:
                probe_causality(blk, s, config)

    @classmethod
    def from_config(cls, model_config: ModelConfig, backend: str = "auto") -> "GPT":
        """The model of a :class:`ModelConfig`, which it keeps as ``model_config`` (the very object)."""
        model = cls(model_config.config, list(model_config.layers), backend=backend,
                    redraw_interval=model_config.redraw_interval)
        model.model_config = model_config
        return model

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_proj", False):
                std = 0.02 / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ------------------------------------------------------------------ helpers
    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once); ``non_embedding`` drops the token embedding."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel()
        return n

    @property
    def layer_labels(self) -> List[str]:
        return [s.label for s in self.specs]

    def redraw_features(self, step: int) -> bool:
        """Give FAVOR layers seed ``spec.seed + 1000 * layer + step // redraw_interval``; True if any changed."""
        if self.redraw_interval <= 0:
            return False
        changed = False
        epoch = int(step) // self.redraw_interval
        for i, blk in enumerate(self.blocks):
            a = blk.attn
            if getattr(a, "uses_favor", False):
                seed = a.spec.seed + 1000 * i + epoch
                changed |= seed != a.favor_seed
                a.favor_seed = seed
        return changed

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                caches: Optional[List[LayerCache]] = None, pos: int = 0, sparse_targets: bool = False,
                doc_ids: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None):
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] < 1 or idx.shape[1] < 1 \
                or idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"idx must be (B, N) integer token ids with B, N >= 1, got "
                             f"{getattr(idx, 'dtype', type(idx).__name__)} {tuple(getattr(idx, 'shape', ()))}")
        B, N = idx.shape
        if targets is not None and (not isinstance(targets, torch.Tensor) or targets.shape != idx.shape):
            got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise ValueError(f"targets must have idx's shape {tuple(idx.shape)}, got {got}")
        if pos + N > self.config.max_seq_len:
            raise ValueError(
                f"input seq_len={pos + N} exceeds the model's max_seq_len={self.config.max_seq_len}; "
                f"raise model.max_seq_len or lower data.seq_len"
            )
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"caches: got {len(caches)} layer caches for n_layer={len(self.blocks)}")
        if caches is not None:  # the chunk continues what every cache holds (host counts: no sync)
            for i, c in enumerate(caches):
                if not hasattr(c, "tokens_seen"):  # (a plugin mixer's state may not count: not checked)
                    continue
                seen = c.tokens_seen()  # one count per batch row
                if len(seen) != B:
                    raise ValueError(f"caches: layer {i}'s cache was made for batch {len(seen)}, idx has batch {B}; "
                                     f"make the caches for this batch (init_cache({B}))")
                if any(n != pos for n in seen):
                    raise ValueError(f"pos={pos}: layer {i}'s cache holds {sorted(set(seen))} tokens; pos must be the "
                                     f"number of tokens the caches already hold (a new sequence needs new caches: "
                                     f"init_cache)")
        # no host sync in a GPU training step, nor in a GPU decode step (generate checks its prompt once; the steps
        # feed back the model's own ids)
        sync_ok = idx.device.type == "cpu" or (not self.training and caches is None)
        if sync_ok:
            self._check_token_ids(idx, "idx")
            if targets is not None:
                self._check_token_ids(targets, "targets", ignore_index=-100)
        if doc_ids is not None or positions is not None:
            doc_ids, positions = self._documents(idx, caches, doc_ids, positions, sync_ok)
        x = self.drop(self.wte(idx))  # (B, N, d_model)
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if caches is None else caches[i], pos, doc_ids, positions)
        x = self.norm_f(x)  # (B, N, d_model)
        if targets is not None and sparse_targets and not torch.compiler.is_compiling():
            # few scored positions (MQAR: the queries, 1/16 of them): the head runs on those rows only. Same loss and
            # gradients (an unscored row adds nothing to either); the (B, N, vocab) logits, their gradient and most
            # of the head's FLOPs are never made, at the price of one host sync for the indexing
            tgt = targets.reshape(-1)  # (B*N,)
            scored = (tgt != -100).nonzero().squeeze(1)  # (M,)
            logits = self.lm_head(x.reshape(-1, x.size(-1)).index_select(0, scored))  # (M, vocab_size)
            return logits, F.cross_entropy(logits.float(), tgt.index_select(0, scored))
        logits = self.lm_head(x)  # (B, N, vocab_size)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    def _documents(self, idx, caches, doc_ids, positions, sync_ok: bool):
        """Check ``doc_ids`` / ``positions`` of :meth:`forward`; ``positions`` default to the position inside each
        document (0 at every document start) when ``doc_ids`` is given."""
        B, N = idx.shape
        if caches is not None:
            raise ValueError("doc_ids / positions: incremental decoding with caches takes no documents; pass "
                             "doc_ids=None, positions=None with caches")
        for name, t in (("doc_ids", doc_ids), ("positions", positions)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"{name} must be an int32 / int64 tensor of shape (B, N) = ({B}, {N}), got "
                                 f"{getattr(t, 'dtype', type(t).__name__)}")
            if tuple(t.shape) != (B, N):
                raise ValueError(f"{name} must have shape (B, N) = ({B}, {N}), got {tuple(t.shape)}")
            if t.device != idx.device:
                raise ValueError(f"{name} must be on idx's device {idx.device}, got {t.device}")
        if doc_ids is not None:
            bad = [f"layer {i} ({self.specs[i].label})" for i, blk in enumerate(self.blocks) if not blk.takes_doc_ids]
            if bad:
                raise ValueError(doc_ids_refusal(bad))
            if positions is None:
                from .documents import document_spans

                start, _ = document_spans(doc_ids)
                positions = torch.arange(N, device=idx.device).view(1, N) - start.long()  # (B, N)
        if sync_ok and positions.numel():
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= self.config.max_seq_len:
                raise ValueError(f"positions must lie in [0, max_seq_len) = [0, {self.config.max_seq_len}), got "
                                 f"{lo if lo < 0 else hi}")
        return doc_ids, positions

    def init_cache(self, batch_size: int, capacity: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                   device=None, page_size: Optional[int] = None, shuffle_pages: bool = False) -> List[LayerCache]:
        """One decode state per layer (see :meth:`Attention.new_cache`); ``capacity`` defaults to ``max_seq_len``,
        ``dtype`` / ``device`` to the parameters'. ``page_size`` makes the full caches paged."""
        p = self.wte.weight
        capacity = min(int(capacity or self.config.max_seq_len), self.config.max_seq_len)
        for i, blk in enumerate(self.blocks):
            if not blk.stateful:
                raise ValueError(f"layer {i} ({self.specs[i].label}) is a {type(blk.attn).__name__} mixer without a decode "
                                 f"state (new_cache); use generate(..., use_cache=False)")
        return [blk.attn.new_cache(batch_size, capacity, dtype or p.dtype, device or p.device, page_size, shuffle_pages)
                for blk in self.blocks]

    def _check_token_ids(self, idx: torch.Tensor, name: str, ignore_index: Optional[int] = None) -> None:
        """``ValueError`` naming ``name`` when a token id of ``idx`` (other than ``ignore_index``) is outside
        ``[0, vocab_size)`` (the embedding / cross-entropy would raise a bare ``IndexError`` on CPU, a device-side
        assert on CUDA)."""
        if idx.numel() == 0 or idx.dtype.is_floating_point or idx.dtype == torch.bool:
            return
        if ignore_index is not None:
            idx = idx[idx != ignore_index]
            if idx.numel() == 0:
                return
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = hi if hi >= self.config.vocab_size else lo
            also = f" or {ignore_index} (ignored)" if ignore_index is not None else ""
            raise ValueError(f"{name} holds token id {bad}; allowed values: 0 .. vocab_size - 1 = "
                             f"{self.config.vocab_size - 1}{also} (model.vocab_size={self.config.vocab_size})")

    @staticmethod
    def _next_token(logits: torch.Tensor, temperature: float, greedy: bool) -> torch.Tensor:
        """``(B, vocab)`` logits -> ``(B, 1)`` token ids (argmax, or a sample of ``softmax(logits / temperature)``)."""
        if greedy:
            return logits.argmax(-1, keepdim=True)
        return torch.multinomial(F.softmax(logits.float() / temperature, dim=-1), 1)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, greedy: bool = False,
                 use_cache: bool = True, page_size: Optional[int] = None) -> torch.Tensor:
        """Extend ``idx (B, T)`` by ``max_new_tokens`` tokens; returns ``(B, T + max_new_tokens)``.

        ``greedy`` takes the argmax, else samples ``softmax(logits / temperature)`` (``temperature`` a finite number
        > 0; 0 is refused: pass ``greedy=True`` for the argmax). ``use_cache=False`` re-runs the context
        (cropped to the last ``max_seq_len`` tokens) every step. ``use_cache=True`` prefills the layer caches
        (:meth:`init_cache`; ``page_size`` = paged KV caches) once and feeds one token per step; once the
        sequence is longer than ``max_seq_len`` the context slides and RoPE positions restart, so each later
        step re-prefills the cropped context (same tokens as without the cache). Needs causal layers.

        Raises:
            ValueError: naming the argument: ``idx`` not ``(B, T)`` integer ids or holding an id outside
                ``[0, vocab_size)``, ``max_new_tokens`` not an integer >= 0, ``temperature`` not a finite number > 0
                while ``greedy=False``, a non-causal layer with ``use_cache=True``.
        """
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] < 1 or idx.shape[1] < 1 \
                or idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"idx must be (B, T) integer token ids with B, T >= 1, got "
                             f"{getattr(idx, 'dtype', type(idx).__name__)} {tuple(getattr(idx, 'shape', ()))}")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if not isinstance(greedy, bool):
            raise ValueError(f"greedy must be true or false, got {greedy!r}")
        if not greedy and not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                               and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature={temperature!r} with greedy=False: sampling needs a finite number > 0 "
                             f"(e.g. temperature=1.0); for the argmax pass greedy=True")
        self._check_token_ids(idx, "idx")
        if not use_cache:
            for _ in range(max_new_tokens):
                logits = self(idx[:, -self.config.max_seq_len:])[:, -1, :]  # (B, vocab)
                idx = torch.cat([idx, self._next_token(logits, temperature, greedy)], dim=1)
            return idx
        if not all(s.causal for s in self.specs):
            raise ValueError("generate(use_cache=True) needs causal layers (a non-causal layer sees future tokens)")
        L = self.config.max_seq_len
        caches = None
        for _ in range(max_new_tokens):
            if caches is None or idx.shape[1] > L:  # (re)prefill the cropped context
                ctx = idx[:, -L:]  # (B, T)
                caches = self.init_cache(idx.shape[0], min(L, ctx.shape[1] + max_new_tokens), page_size=page_size)
                logits = self(ctx, caches=caches, pos=0)[:, -1, :]  # (B, vocab)
            else:  # one new token at position T - 1
                logits = self(idx[:, -1:], caches=caches, pos=idx.shape[1] - 1)[:, -1, :]
            idx = torch.cat([idx, self._next_token(logits, temperature, greedy)], dim=1)
        return idx


def config_from_dict(d: dict) -> GPTConfig:
    """:class:`GPTConfig` from a plain dict (unknown keys raise ``ValueError`` naming them)."""
    known = set(GPTConfig.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown model config keys {unknown}; allowed: {sorted(known)}")
    return GPTConfig(**d)


def spec_to_dict(spec: LayerSpec) -> dict:
    """Plain dict of a layer spec (for checkpoints / hparams); :func:`layer_from_dict` inverts it (and
    :func:`attn_zoo.make_spec` for an :class:`AttentionSpec`)."""
    return layer_to_dict(spec)
