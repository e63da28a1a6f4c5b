"""The C core's one tensor schema (csrc/model.h, exported as ``_core.tensor_schema()``) and the
memory sizes the core exports (``model_grad_floats``, ``model_forward_floats``), against the
Python they replaced: the weight list and the two size formulas sinklab computed itself before
(kept here, verbatim, as the references), over architectures that switch every optional piece
on and off."""
from typing import Dict, Tuple

import numpy as np
import pytest

import sinklab as sl
from sinklab import _core
from sinklab.families import base
from sinklab.families.config import LAYER_BIASES, LAYER_NORMS, QK_NORMS, ModelConfig

GRAD_MLP_ROWS = 8192  # grad.c's SL_GRAD_MLP_ROWS


def _old_layer_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """families/base.py's layer_shapes before the schema moved to C."""
    d, hd, F = cfg.d_model, cfg.head_dim, cfg.d_ff
    qd, kvd = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out: Dict[str, Tuple[int, ...]] = {}
    for n in cfg.layer_norms:
        if n in QK_NORMS:
            out[n] = (hd,)
        else:
            out[n] = (d,)
            if cfg.norm_kind == "layernorm":
                out[n + "_b"] = (d,)
    out.update({"attn_q": (qd, d), "attn_k": (kvd, d), "attn_v": (kvd, d), "attn_output": (d, qd)})
    if cfg.gated:
        out["ffn_gate"] = (F, d)
    out.update({"ffn_up": (F, d), "ffn_down": (d, F)})
    bias = {"attn_q_b": qd, "attn_k_b": kvd, "attn_v_b": kvd, "attn_output_b": d,
            "ffn_gate_b": F, "ffn_up_b": F, "ffn_down_b": d}
    out.update({b: (bias[b],) for b in cfg.biases})
    return out


def _old_global_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """families/base.py's global_shapes before the schema moved to C."""
    d = cfg.d_model
    out: Dict[str, Tuple[int, ...]] = {"tok_embd": (cfg.vocab_size, d)}
    if cfg.positions == "learned":
        out["pos_embd"] = (cfg.n_pos, d)
    if cfg.type_embd:
        out["type_embd"] = (d,)
    for flag, name in ((cfg.embd_norm, "embd_norm"), (cfg.has_out_norm, "out_norm")):
        if flag:
            out[name] = (d,)
            if cfg.norm_kind == "layernorm":
                out[name + "_b"] = (d,)
    if cfg.has_lm_head:
        out["lm_head"] = (cfg.vocab_size, d)
    return out


def _old_max_rows_per_call(c: ModelConfig) -> int:
    """Model.max_rows_per_call before the core exported model_forward_floats."""
    per_row = 4 * (2 * c.d_model + 2 * c.n_heads * c.head_dim + 3 * c.n_kv_heads * c.head_dim
                   + 2 * c.d_ff + c.head_dim + 8 * c.n_heads)
    return max(1, min(sl.model.MAX_ROWS_PER_CALL, sl.model.WORKSPACE_BYTES // per_row))


def _old_grad_bytes(model, T: int, B: int = 1, n_tape=None) -> int:
    """Model.grad_bytes before the core exported model_grad_floats."""
    c = model.config
    qd, kvd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    L = c.n_layers if n_tape is None else n_tape
    tape = L * _core.model_tape_floats(model._handle, max(int(T), 1))
    rows = B * T
    norms = set(c.layer_norms)
    per_row = (2 * c.d_model + 2 * qd + 2 * kvd + (2 * qd if c.n_heads != c.n_kv_heads else 0)
               + (qd if norms & {"attn_q_norm", "attn_k_norm"} else 0)
               + (c.d_model if norms - {"attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"} else 0))
    return 4 * (tape + c.n_heads * T * T + 2 * T * c.d_ff + rows * per_row
                + 3 * min(rows, max(GRAD_MLP_ROWS // T, 1) * T) * c.d_ff)


def _config(**kw) -> ModelConfig:
    base_kw = dict(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, d_ff=48,
                   vocab_size=61, context_length=256, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False)
    base_kw.update(kw)
    return ModelConfig(**base_kw)


# Every optional piece on and off: grouped / full heads, QK-norms, post-norms, post-LN, LayerNorm
# with biases, learned positions, ungated MLPs, tied heads, encoders without a head.
CONFIGS = {
    "llama-gqa": _config(),
    "mha-tied": _config(n_kv_heads=4, tied_embeddings=True),
    "qwen3-qknorm": _config(layer_norms=("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm")),
    "gemma2-post": _config(layer_norms=("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"),
                           act="geglu_tanh", n_kv_heads=1),
    "qwen2-bias": _config(biases=("attn_q_b", "attn_k_b", "attn_v_b")),
    "gpt2": _config(arch="gpt2", norm_kind="layernorm", act="gelu_tanh", positions="learned", n_pos=40,
                    n_kv_heads=4, tied_embeddings=True, biases=tuple(b for b in LAYER_BIASES if b != "ffn_gate_b")),
    "bert": _config(arch="bert", norm_kind="layernorm", act="gelu", positions="learned", n_pos=40, n_kv_heads=4,
                    bidirectional=True, has_lm_head=False, has_out_norm=False, embd_norm=True, type_embd=True,
                    layer_norms=("attn_res_norm", "ffn_res_norm"), biases=("attn_q_b", "ffn_up_b", "ffn_down_b")),
    "wide": _config(n_heads=16, n_kv_heads=8, head_dim=64, d_model=1024, d_ff=4096, vocab_size=97),
    # norms in an order of the config's own (the canonical layout follows it)
    "reordered": _config(layer_norms=("ffn_norm", "attn_k_norm", "attn_norm", "attn_q_norm"),
                         biases=("ffn_down_b", "attn_q_b")),
}


def _model(cfg: ModelConfig) -> "sl.Model":
    rng = np.random.default_rng(0)
    weights = {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in base.canonical_shapes(cfg).items()}
    if cfg.tied_embeddings:
        weights["lm_head"] = weights["tok_embd"]
    return sl.Model(cfg, weights, None, "test", sl.model.ROPE_HALF_SPLIT)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_canonical_shapes_from_the_core_schema_equal_the_old_python_list(name):
    cfg = CONFIGS[name]
    assert base.layer_shapes(cfg) == _old_layer_shapes(cfg)
    assert list(base.layer_shapes(cfg)) == list(_old_layer_shapes(cfg))      # the order is the flat layout
    assert list(base.global_shapes(cfg).items()) == list(_old_global_shapes(cfg).items())


def test_schema_rows_name_every_tensor_once():
    keys = [(scope, key) for scope, key, *_ in _core.tensor_schema()]
    assert len(keys) == len(set(keys))
    layer = {key for scope, key, *_ in _core.tensor_schema() if scope == "layer"}
    norms = set(LAYER_NORMS)
    assert norms <= layer and set(LAYER_BIASES) <= layer
    assert {n + "_b" for n in norms - set(QK_NORMS)} <= layer and not {n + "_b" for n in QK_NORMS} & layer
    assert base.MATRICES == ("tok_embd", "lm_head", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                             "ffn_up", "ffn_down", "attn_gate")  # attn_gate: gated attention (attn_variant)
    for scope, key, kind, shape, required, role in _core.tensor_schema():
        assert kind in ("matrix", "vector", "table") and len(shape) == (1 if kind == "vector" else 2), key
        assert role in ("embedding", "head", "norm", "norm_bias", "matrix", "bias", "sink"), key
    assert {key for _, key, _, _, required, _ in _core.tensor_schema() if required} == {
        "tok_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_core_takes_exactly_the_schema(name):
    """model_new reads every tensor the schema gives for the config (an extra one is refused),
    and loss_and_grad returns one gradient per canonical tensor."""
    cfg = CONFIGS[name]
    model = _model(cfg)
    with pytest.raises(ValueError, match="canonical schema"):
        sl.Model(cfg, dict(model.weights, **{"blk.0.not_a_tensor": np.zeros(3, np.float32)}), None, "test", 0)
    if cfg.has_lm_head:
        _, grads = model.loss_and_grad(np.arange(6) % cfg.vocab_size)
        want = {k for k in base.canonical_shapes(cfg) if not (cfg.tied_embeddings and k == "lm_head")}
        assert set(grads) == want


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sizes_from_the_core_equal_the_old_python_formulas(name):
    model = _model(CONFIGS[name])
    assert model.max_rows_per_call == _old_max_rows_per_call(model.config)
    L = model.config.n_layers
    for T in (1, 2, 7, 64, 100, 4096, 8192, 9000):
        for B in (0, 1, 2, 5, 64):
            for n_tape in (None, 0, 1, L):
                assert model.grad_bytes(T, B, n_tape) == _old_grad_bytes(model, T, B, n_tape), (T, B, n_tape)
    assert model.grad_bytes(10) == _old_grad_bytes(model, 10)


def test_size_exports_check_their_arguments():
    model = _model(CONFIGS["llama-gqa"])
    h = model._handle
    assert _core.model_forward_floats(h, 0) == 0
    assert _core.model_forward_floats(h, 3) == 3 * _core.model_forward_floats(h, 1)
    for bad in ((0, 1, None), (1, -1, None), (1, 1, -1), (1, 1, model.config.n_layers + 1)):
        with pytest.raises(ValueError):
            _core.model_grad_floats(h, *bad)
    with pytest.raises(ValueError):
        _core.model_forward_floats(h, -1)
    with pytest.raises(OverflowError):
        _core.model_grad_floats(h, 1 << 40, 1 << 20)
    with pytest.raises(OverflowError):
        _core.model_forward_floats(h, 1 << 62)
