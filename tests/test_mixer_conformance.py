"""Conformance suite for sequence mixers (issue 26, acceptance: "a new mixer one file ... passes the conformance
suite with no test of its own"), the mixer counterpart of ``tests/test_conformance.py``.

Every mixer in the registry (:func:`attn_zoo.mixers.mixer_names`, plugins included; ``attention`` is the
conformance suite of the kinds) is built as ``GPT`` builds it, its options from its yaml under ``conf/attention/``
when one names it (``mixer: <name>`` or ``_target_``), else its defaults, at a small width, and must:

- map ``(B, N, d_model)`` to ``(B, N, d_model)`` with a finite gradient for every parameter;
- when registered causal: leave output row ``t`` unchanged when inputs after ``t`` change;
- when it keeps a decode state (``new_cache``): give, fed a prefill, one token, a chunk of several tokens and one
  more token, the rows of one full forward (a chunk after a prefill continues the state), and ``GPT.generate``
  with the cache the tokens of ``generate`` without it;
- when registered non-causal: be refused by ``GPT`` (a causal language model), naming the reason.

The EMA mixer below is written here as a user would write a plugin mixer (one class, one registration): nothing else
in the suite knows it. What this suite does not cover: a mixer's own kernel choices (``kernel=`` of mamba2 /
deltanet) against its reference; there is no registry of them, so each mixer's tests compare its kernels.
"""

import glob
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn as nn  # noqa: E402
import yaml  # noqa: E402

import attn_zoo  # noqa: E402
import attn_zoo.mla  # noqa: E402,F401  (registers the mla mixer)
from attn_zoo.mixers import MixerSpec, build_mixer, make_layer_spec, mixer_names, register_mixer  # noqa: E402
from attn_zoo.model import GPT, GPTConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------ a plugin, as a user writes it
class EMAState:
    """The decode state of :class:`CausalEMA`: the running average ``h (B, d_model)`` and the tokens seen ``n``."""

    def __init__(self, h):
        self.h, self.n = h, 0


@register_mixer("ema_plugin", causal=True)
class CausalEMA(nn.Module):
    """``h_t = a * h_{t-1} + (1 - a) * W_in x_t``, ``y_t = W_out h_t`` with a learned per-channel decay ``a`` in
    (0, 1): ``(B, N, d_model) -> (B, N, d_model)``; decodes from ``h`` (``new_cache``, ``forward(x, cache, pos)``)."""

    def __init__(self, d_model: int, decay_init: float = 0.9):
        super().__init__()
        self.inp, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.logit = nn.Parameter(torch.full((d_model,), float(torch.logit(torch.tensor(decay_init)))))

    def new_cache(self, batch_size, capacity, dtype, device, page_size=None, shuffle_pages=False):
        return EMAState(torch.zeros(batch_size, self.inp.out_features, dtype=dtype, device=device))

    def forward(self, x, cache=None, pos=0):
        a = torch.sigmoid(self.logit)
        u = (1 - a) * self.inp(x)
        h = cache.h if cache is not None else x.new_zeros(x.shape[0], x.shape[2])
        ys = []
        for t in range(x.shape[1]):
            h = a * h + u[:, t]
            ys.append(h)
        if cache is not None:
            cache.h, cache.n = h.detach(), cache.n + x.shape[1]
        return self.out(torch.stack(ys, 1))


# ------------------------------------------------------------------------------------ the specs of every mixer
CONF = os.path.join(os.path.dirname(__file__), os.pardir, "conf", "attention")
D_MODEL, N_HEAD, N = 32, 4, 11


def _yaml_specs():
    """``{mixer name: MixerSpec}`` of the yamls under ``conf/attention/`` that build a registered mixer."""
    out = {}
    for path in sorted(glob.glob(os.path.join(CONF, "*.yaml"))):
        with open(path) as f:
            cfg = dict(yaml.safe_load(f) or {})
        if "mixer" not in cfg and cfg.get("_target_") in (None, "attn_zoo.make_spec"):
            continue
        spec = make_layer_spec(**cfg)
        name = next((n for n in mixer_names() if n != "attention" and isinstance(spec, MixerSpec) and
                     (spec.mixer == n or spec.factory() is MixerSpec(n).factory())), None)  # ("attention" has
        # no MixerSpec: it is described by an AttentionSpec)
        if name is not None:
            out.setdefault(name, spec)
    return out


def _all_specs():
    by_name = _yaml_specs()
    return [(n, by_name.get(n, MixerSpec(n))) for n in mixer_names() if n != "attention"]


SPECS = _all_specs()
IDS = [n for n, _ in SPECS]
CAUSAL = [(n, s) for n, s in SPECS if s.causal]


def _config(n_layer=1):
    return GPTConfig(vocab_size=40, n_layer=n_layer, n_head=N_HEAD, d_model=D_MODEL, max_seq_len=32)


def _mixer(spec, seed=0):
    torch.manual_seed(seed)
    return build_mixer(spec, _config())


def _x(seed=1, n=N):
    return torch.randn(2, n, D_MODEL, generator=torch.Generator().manual_seed(seed))


BUILT_IN_STATEFUL = {"ema_plugin", "mamba2", "mla", "deltanet", "gated_deltanet"}


def test_every_registered_mixer_is_covered():
    """The suite's lists are derived from the registry and the mixers themselves, so a mixer that lost its decode
    state (``new_cache``) or its yaml would drop out of the decode tests silently: the known ones are pinned here."""
    assert BUILT_IN_STATEFUL | {"linformer"} <= set(IDS)
    assert BUILT_IN_STATEFUL <= {n for n, _ in STATEFUL}  # each one runs the prefill / chunk / generate tests
    assert "linformer" in {n for n, _ in NON_CAUSAL}
    named = []  # yamls under conf/attention/ that build a mixer: each one's options reach the suite
    for path in sorted(glob.glob(os.path.join(CONF, "*.yaml"))):
        with open(path) as f:
            cfg = dict(yaml.safe_load(f) or {})
        if "mixer" in cfg or cfg.get("_target_") not in (None, "attn_zoo.make_spec"):
            named.append(os.path.basename(path))
    assert len(named) >= 5 and len(_yaml_specs()) == len(named), named


@pytest.mark.parametrize("name, spec", SPECS, ids=IDS)
def test_forward_shape_and_a_finite_gradient_for_every_parameter(name, spec):
    m = _mixer(spec).train()
    x = _x().requires_grad_(True)
    y = m(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pn, p in m.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"{name}: parameter {pn} gets no gradient"
            assert torch.isfinite(p.grad).all(), f"{name}: parameter {pn} has a non-finite gradient"


@pytest.mark.parametrize("name, spec", CAUSAL, ids=[n for n, _ in CAUSAL])
def test_causal_mixers_do_not_see_later_positions(name, spec):
    m = _mixer(spec).eval()
    x = _x()
    x2 = x.clone()
    t = 6
    x2[:, t:] = torch.randn(2, N - t, D_MODEL, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        y, y2 = m(x), m(x2)
    torch.testing.assert_close(y2[:, :t], y[:, :t], atol=1e-5, rtol=1e-5)
    assert (y2[:, t:] - y[:, t:]).abs().max() > 1e-3  # the later rows do read the changed inputs


STATEFUL = [(n, s) for n, s in CAUSAL if hasattr(_mixer(s), "new_cache")]


@pytest.mark.parametrize("name, spec", STATEFUL, ids=[n for n, _ in STATEFUL])
def test_prefill_token_chunk_token_equal_the_full_forward(name, spec):
    m = _mixer(spec).eval()
    x = _x()
    with torch.no_grad():
        full = m(x)
        cache = m.new_cache(2, N, x.dtype, x.device)
        parts, pos = [], 0
        for n in (5, 1, 4, 1):  # prefill, one token, a chunk of several (the state must continue), one token
            parts.append(m(x[:, pos: pos + n], cache, pos))
            pos += n
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name, spec", STATEFUL, ids=[n for n, _ in STATEFUL])
def test_generate_with_a_cache_equals_generate_without(name, spec):
    torch.manual_seed(0)
    model = GPT(_config(2), [spec, attn_zoo.make_spec("flash")], backend="reference").eval()
    with torch.no_grad():  # sharper weights than the init, so that the argmax depends on the context
        for pn, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    idx = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = model.generate(idx, 10, greedy=True, use_cache=True)
        b = model.generate(idx, 10, greedy=True, use_cache=False)
    assert a.shape == (2, 15) and torch.equal(a, b)
    assert len(set(a[:, 5:].flatten().tolist())) > 1  # not one repeated token


NON_CAUSAL = [(n, s) for n, s in SPECS if not s.causal]


@pytest.mark.parametrize("name, spec", NON_CAUSAL, ids=[n for n, _ in NON_CAUSAL])
def test_non_causal_mixers_are_refused_by_the_causal_lm(name, spec):
    with pytest.raises(ValueError, match="non-causal"):
        GPT(_config(), [spec], backend="reference")
