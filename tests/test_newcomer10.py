"""Defects of a newcomer trial (nc10): each test failed before its fix.

* ``attention.kv_group_size`` that does not divide ``model.n_head`` is refused by ``validate_config`` naming
  ``attention.kv_group_size`` (it failed as the model was built, after the data work, as ``kv_group_size=3 ...``);
* the non-causal mixer refusal lists the causal mixers of the registry.
"""

import pytest

import train as train_mod
from test_train import make_cfg


def test_kv_group_size_not_dividing_n_head_is_refused_naming_the_attention_key(tmp_path):
    cfg = make_cfg(tmp_path, ["attention=gqa", "attention.kv_group_size=3", "model.n_head=4"])
    with pytest.raises(ValueError, match=r"^attention\.kv_group_size=3 must divide n_heads=4 \(model\.n_head=4\)"):
        train_mod.validate_config(cfg)
    cfg = make_cfg(tmp_path, ["model.n_layer=2", "model.n_head=4", "model.layers=[flash,{kind:flash,n_kv_heads:3}]"])
    with pytest.raises(ValueError, match=r"^model\.layers\[1\]\.n_kv_heads=3 must divide n_heads=4"):
        train_mod.validate_config(cfg)
    train_mod.validate_config(make_cfg(tmp_path, ["attention=gqa", "attention.kv_group_size=2", "model.n_head=4"]))


def test_non_causal_mixer_refusal_lists_the_registered_causal_mixers(tmp_path):
    from attn_zoo.mixers import _MIXERS, causal_mixer_names, register_mixer
    from attn_zoo.variants import variant_kinds

    with pytest.raises(ValueError, match="use a causal mixer") as e:
        train_mod.validate_config(make_cfg(tmp_path, ["attention=linformer"]))
    msg = str(e.value)
    causal = [n for n in causal_mixer_names() if n != "attention"]
    assert causal and "linformer" not in causal_mixer_names()
    assert f"use a causal mixer: {', '.join(causal)} (registered causal mixers)" in msg
    assert all(k in msg for k in variant_kinds())
    try:  # read from the registry: a newly registered causal mixer is listed
        register_mixer("zz_causal_probe", lambda d_model: None, causal=True)
        with pytest.raises(ValueError, match=r"zz_causal_probe \(registered causal mixers\)"):
            train_mod.validate_config(make_cfg(tmp_path, ["attention=linformer"]))
    finally:
        _MIXERS.pop("zz_causal_probe", None)
