"""sinklab.inputs.prepare: the one text -> ids path, and its BOS rule (the BOS counts among
max_tokens), checked against ids built by hand and HF's tokenizer; the condition vocabulary."""
import numpy as np
import pytest

import sinklab as sl
from sinklab import inputs
from sinklab import prompts as sp

from tests.support import reference_models as rm

BOS = 1


@pytest.fixture(scope="module")
def model(smollm2_model):
    return smollm2_model


@pytest.fixture(scope="module")
def hf_tok(smollm2_reference):
    return smollm2_reference[1]


def test_text_matches_hf_tokenizer_and_bos_rule(model, hf_tok):
    text = sp.load_passages("sinks")[0]
    want = hf_tok(text, add_special_tokens=False)["input_ids"]
    assert inputs.prepare(model, text, False).tolist() == want
    assert inputs.prepare(model, text, True).tolist() == [BOS] + want
    for T in (2, 5, 64):
        # the BOS counts among the T: [BOS] + T-1 text tokens, or T text tokens
        assert inputs.prepare(model, text, True, T).tolist() == [BOS] + want[: T - 1]
        assert inputs.prepare(model, text, False, T).tolist() == want[:T]
        assert inputs.text_budget(T, True) == T - 1 and inputs.text_budget(T, "nobos") == T


def test_ids_are_text_ids_and_checked(model):
    ids = [5, 17, 300, 42]
    for given in (ids, np.asarray(ids, np.int32), tuple(ids)):
        out = inputs.prepare(model, given, "bos", 3)
        assert out.dtype == np.int64 and out.tolist() == [BOS, 5, 17]
    assert inputs.prepare(model, ids, "nobos").tolist() == ids
    V = model.config.vocab_size
    with pytest.raises(ValueError, match="outside the vocabulary"):
        inputs.prepare(model, [1, V], False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        inputs.prepare(model, [-1, 2], False)
    with pytest.raises(TypeError):
        inputs.prepare(model, [[1, 2]], False)
    with pytest.raises(TypeError):
        inputs.prepare(model, [0.5, 1.0], False)
    with pytest.raises(ValueError, match="no tokens"):
        inputs.prepare(model, "", True)
    with pytest.raises(ValueError, match="no room"):
        inputs.prepare(model, ids, True, 1)
    with pytest.raises(TypeError):
        inputs.prepare(model, ids, True, 2.0)
    ctx = model.config.context_length
    with pytest.raises(ValueError, match="context length"):
        inputs.prepare(model, np.ones(ctx, np.int64), True)
    assert len(inputs.prepare(model, np.ones(ctx, np.int64), True, ctx)) == ctx


def test_conditions_vocabulary():
    assert inputs.CONDITIONS == ("bos", "nobos")
    assert inputs.conditions(True) == ["bos"] and inputs.conditions(False) == ["nobos"]
    assert inputs.conditions("both") == ["bos", "nobos"]
    assert [inputs.condition(x) for x in (True, False, "bos", "nobos", "with_bos", "without_bos")] == \
        ["bos", "nobos", "bos", "nobos", "bos", "nobos"]
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError):
            inputs.conditions(bad)
    d = inputs.by_condition({"with_bos": 1, "without_bos": 2, "other": 3})
    assert dict(d) == {"bos": 1, "nobos": 2, "other": 3}
    assert d["with_bos"] == 1 and "without_bos" in d and d.get("with_bos") == 1
    with pytest.raises(KeyError):
        d["missing"]


def test_analyses_share_the_rule(model):
    """sink_study's sequences are exactly prepare's (BOS among the T tokens)."""
    texts = sp.load_passages("sinks")[:2]
    st = sl.sink_study(model, texts, T=16, bos=True, progress=False, capture="attn")
    want = np.stack([inputs.prepare(model, t, True, 16) for t in texts])
    assert st.meta["seq_len"] == 16 and np.array_equal(st.first_token_ids, want[:, 0])
    tr = model.run(want, capture=("attn",), progress=False)
    np.testing.assert_allclose(st.importance, tr.attn[:, :, :, :, 0].mean(axis=-1), atol=1e-6)
