"""Interventions in the C forward against the same interventions applied with hooks to the
Hugging Face reference (fp32 eager): a replaced attention function and a pre-hook on o_proj."""
import numpy as np
import pytest

import sinklab as sl
from reference_models import SPECS, make_hf_model, require, save_hf

torch = require("torch")
modeling_llama = require("transformers.models.llama.modeling_llama")


def hooked_attention(mask_first, zero_first_value):
    """eager_attention_forward with the interventions: (L, H) boolean arrays or None."""

    def forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        l = module.layer_idx
        k = modeling_llama.repeat_kv(key, module.num_key_value_groups)
        v = modeling_llama.repeat_kv(value, module.num_key_value_groups).clone()
        scores = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        for h in range(query.shape[1]):
            if mask_first is not None and mask_first[l, h]:
                scores[:, h, 1:, 0] = float("-inf")  # query 0 keeps its only key
            if zero_first_value is not None and zero_first_value[l, h]:
                v[:, h, 0, :] = 0.0
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        return torch.matmul(probs, v).transpose(1, 2).contiguous(), probs

    return forward


def reference(model, ids, monkeypatch, mask_first=None, zero_first_value=None, head_scale=None):
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", hooked_attention(mask_first, zero_first_value))
    handles = []
    if head_scale is not None:
        hd = model.config.head_dim
        for l, layer in enumerate(model.model.layers):
            def pre(mod, args, l=l):
                x = args[0].clone()
                for h, s in enumerate(head_scale[l]):
                    x[..., h * hd:(h + 1) * hd] *= float(s)
                return (x,)
            handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(ids)[None], output_attentions=True)
    finally:
        for h in handles:
            h.remove()
        monkeypatch.undo()
    return out.logits[0].numpy(), torch.stack(out.attentions)[:, 0].numpy()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    spec = SPECS["gqa_tied"]
    hf = make_hf_model(spec)
    d = tmp_path_factory.mktemp("iv")
    save_hf(hf, d)
    return hf, sl.load(d), spec


def check(ours, ref):
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err <= 1e-4, err


def random_heads(spec, seed, p=0.4):
    return np.random.default_rng(seed).random((spec.n_layers, spec.n_heads)) < p


@pytest.mark.parametrize("T", [1, 9, 70])
def test_mask_first(models, monkeypatch, T):
    hf, model, spec = models
    ids = np.random.default_rng(T).integers(3, spec.vocab_size, T)
    heads = random_heads(spec, 1)
    tr = model.run(ids, capture=("attn", "logits"), intervene=sl.Intervention(mask_first=heads))
    logits, attn = reference(hf, ids, monkeypatch, mask_first=heads)
    check(tr.logits, logits)
    check(tr.attn, attn)
    if T > 1:
        assert np.all(tr.attn[heads][:, 1:, 0] == 0) and not np.all(tr.attn[~heads][:, 1:, 0] == 0)
    plain = model.run(ids, capture=("logits",)).logits
    assert T == 1 or np.abs(plain - tr.logits).max() > 1e-3  # the intervention changes something


@pytest.mark.parametrize("T", [1, 33])
def test_zero_first_value(models, monkeypatch, T):
    hf, model, spec = models
    ids = np.random.default_rng(T).integers(3, spec.vocab_size, T)
    heads = random_heads(spec, 2)
    tr = model.run(ids, capture=("logits", "resid"), intervene=sl.Intervention(zero_first_value=heads))
    logits, _ = reference(hf, ids, monkeypatch, zero_first_value=heads)
    check(tr.logits, logits)


def test_head_scale_and_combination(models, monkeypatch):
    hf, model, spec = models
    ids = np.random.default_rng(5).integers(3, spec.vocab_size, 48)
    scale = np.random.default_rng(6).uniform(0.0, 2.0, (spec.n_layers, spec.n_heads)).astype(np.float32)
    scale[0, 0] = 0.0  # an ablated head
    mask, zero = random_heads(spec, 7), random_heads(spec, 8)
    iv = sl.Intervention(mask_first=mask, zero_first_value=zero, head_scale=scale)
    tr = model.run(ids, capture=("logits",), intervene=iv)
    logits, _ = reference(hf, ids, monkeypatch, mask_first=mask, zero_first_value=zero, head_scale=scale)
    check(tr.logits, logits)


def test_pairs_and_dict_forms(models):
    _, model, spec = models
    ids = np.arange(3, 30)
    a = model.run(ids, capture=("logits",), intervene=sl.Intervention(mask_first=[(1, 2), (3, 0)],
                                                                       head_scale={(0, 1): 0.5})).logits
    m = np.zeros((spec.n_layers, spec.n_heads), bool)
    m[1, 2] = m[3, 0] = True
    s = np.ones((spec.n_layers, spec.n_heads), np.float32)
    s[0, 1] = 0.5
    b = model.run(ids, capture=("logits",), intervene=sl.Intervention(mask_first=m, head_scale=s)).logits
    assert np.array_equal(a, b)


def test_bad_intervention(models):
    _, model, spec = models
    with pytest.raises(ValueError, match="outside a model"):
        model.run([1, 2], intervene=sl.Intervention(mask_first=[(spec.n_layers, 0)]))
    with pytest.raises(ValueError, match="shape"):
        model.run([1, 2], intervene=sl.Intervention(head_scale=np.ones((2, 2), np.float32)))
    with pytest.raises(ValueError, match="finite"):
        model.run([1, 2], intervene=sl.Intervention(head_scale={(0, 0): float("nan")}))
