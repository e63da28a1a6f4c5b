"""Labelled results: Trace.tokens (against the tokenizers library's own decoding),
Trace.to_xarray (every array where its named dims say, against the Trace's arrays and against
transformers' attention), and the results' to_frame (each row equal to the array cell it names)."""
import numpy as np
import pytest

import sinklab as sl
from tests.support.reference_models import SPECS, hf_forward, make_hf_model, save_hf

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

TEXTS = ["the cat sat on the mat and the dog ran away", "a river rose slowly through the night and the fields"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["gqa_tied"])
    folder = save_hf(hf, tmp_path_factory.mktemp("labels") / "tiny")
    return hf, folder, sl.load(folder)


def test_tokens_are_the_tokenizers_own_pieces(tiny, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    _, folder, m = tiny
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = m.tokenize(TEXTS[0], bos=True)
    tr = m.run(ids)
    assert tr.tokens == [ref.decode([int(i)], skip_special_tokens=False) for i in ids]
    batch = m.run(np.stack([ids, ids[::-1]]))
    assert batch.tokens[1] == tr.tokens[::-1]
    path = tr.save(tmp_path / "tr")                 # the texts are saved with the arrays
    assert sl.Trace.load(path).tokens == tr.tokens


def test_tokens_without_a_tokenizer_say_so(tiny):
    _, _, m = tiny
    tr = m.run(np.arange(1, 6))
    tr.decode = None
    with pytest.raises(ValueError, match="no token texts"):
        tr.tokens


def test_to_xarray_puts_each_array_under_its_named_dims(tiny):
    hf, _, m = tiny
    ids = m.tokenize(TEXTS[1], bos=True)
    tr = m.run(ids, capture=("attn", "resid", "logits", "stats", "k", "head_out"), layers=[1, 2])
    ds = tr.to_xarray()
    L, H, G, T = m.config.n_layers, m.config.n_heads, m.config.n_kv_heads, len(ids)
    assert ds.attn.dims == ("layer", "head", "query", "key") and list(ds.layer.values) == [1, 2]
    assert ds.resid.dims == ("stream", "position", "d_model") and ds.sizes["stream"] == L + 1
    assert ds.k.dims == ("layer", "kv_head", "position", "head_dim") and ds.sizes["kv_head"] == G
    assert ds.importance.dims == ("layer", "head", "key") and ds.to_first.dims == ("layer", "head", "query")
    assert list(ds.token.values) == tr.tokens and list(ds.key_token.values) == tr.tokens
    ref = hf_forward(hf, ids)["attn"]                                      # (L, H, T, T) from transformers
    got = ds.attn.sel(layer=2).isel(head=H - 1).transpose("query", "key").values
    assert np.abs(got - ref[2, H - 1]).max() < 1e-5
    assert np.array_equal(ds.head_out.sel(layer=1).values, tr.head_out[0])
    assert ds.attrs["model"] == m.name and ds.sizes["query"] == T
    b = m.run(np.stack([ids, ids]), capture=("resid",)).to_xarray()
    assert b.resid.dims == ("batch", "stream", "position", "d_model") and b.token.dims == ("batch", "position")


def test_sink_study_and_bos_comparison_frames(tiny):
    _, _, m = tiny
    cmp = sl.compare_bos(m, TEXTS, T=8, progress=False)
    df = cmp.to_frame()
    P, L, H = cmp.bos.importance.shape
    assert len(df) == 2 * P * L * H and list(df.columns[:4]) == ["condition", "prompt", "layer", "head"]
    for cond, study in (("bos", cmp.bos), ("nobos", cmp.nobos)):
        sub = df[df.condition == cond]
        assert np.array_equal(sub.a0.to_numpy(), study.importance.reshape(-1))
        row = sub[(sub.prompt == 1) & (sub.layer == L - 1) & (sub["head"] == 2)]
        assert row.a0.item() == study.importance[1, L - 1, 2]
        assert row.first_token_id.item() == study.first_token_ids[1]
    # a sink rate read off the table is the study's
    assert (df[df.condition == "bos"].a0 > 0.3).mean() == pytest.approx(cmp.bos.sink_rate(0.3), abs=1e-12)


def test_noop_and_perturbation_frames(tiny):
    _, _, m = tiny
    res = sl.noop_analysis(m, TEXTS, progress=False)
    df = res.to_frame()
    L, H = res.sink_mass().shape
    assert len(df) == L * H
    r = df[(df.layer == 1) & (df["head"] == 3)]
    assert r.sink_mass.item() == res.sink_mass()[1, 3] and r.rel_out_norm.item() == res.rel_out_norm()[1, 3]
    p = sl.perturb(m, TEXTS[0], position=2, token=7, progress=False)
    f = p.to_frame()
    S, T = p.abs_change[p.settings[0]].shape
    assert len(f) == len(p.settings) * S * T
    for s in p.settings:
        sub = f[f.setting == s]
        assert np.array_equal(sub.rel_change.to_numpy(), p.rel_change[s].reshape(-1))
        assert set(sub[sub.changed].position) == {int(i) for i in p.changed}
        assert list(sub[sub.stream == 0].token) == p.tokens
