"""Precision as an option of the report and an axis of sweeps: the forward runs at the precision
asked for (its numbers are those of the API at that precision, and differ from fp32), the
derivative sections run in fp32 whatever it is, the models' own default comes back afterwards,
and an fp32 sweep task keeps the content address it had before the axis existed."""
import json

import numpy as np
import pytest

from sinklab.report import Settings, reproduce

TINY = Settings(sink_prompts=4, sink_T=16, long_T=64, noop_prompts=2, collapse_passages=2, collapse_lengths=(8,),
                ppl_texts=2, ppl_max_tokens=16, passkey_quick=True, perturb_passages=2, perturb_swaps=1,
                retrieval_lengths=(64,), retrieval_trials=2, cloze_items=4, controls_texts=2,
                controls_max_tokens=16, controls_random_draws=1, squash_T=4, mixing_passages=2,
                mixing_lengths=(8,), mixing_probes=2)


def test_using_precision_sets_the_default_and_restores_it(smollm2_model):
    m = smollm2_model
    ids = np.array(m.tokenize("The first token of a sequence draws attention.", bos=False))
    assert m.precision == "fp32"
    with m.using_precision("bf16") as same:
        assert same is m and m.precision == "bf16"
        tr = m.run(ids, capture="logits")
        assert tr.meta["precision"] == "bf16"
        with pytest.raises(ValueError, match="fp32 only"):
            m.vjp(ids, np.ones((len(ids), m.config.d_model), np.float32), at=m.config.n_layers)
    assert m.precision == "fp32"
    ref = m.run(ids, capture="logits").logits
    assert not np.array_equal(tr.logits, ref)                      # bf16 was used, not fp32
    with pytest.raises(RuntimeError):
        with m.using_precision("int8"):
            raise RuntimeError("inside")
    assert m.precision == "fp32"                                   # restored after an exception
    with pytest.raises(ValueError, match="unknown precision"):
        with m.using_precision("fp16"):
            pass
    assert m.precision == "fp32"


def test_report_forward_at_bf16_and_derivatives_in_fp32(smollm2_model, tmp_path, monkeypatch):
    """The sinks section's numbers at bf16 are those of compare_bos at bf16 (and not fp32's); a
    section in FP32_SECTIONS differentiates the model (it would raise at bf16), here a stand-in
    for the oversquashing section that records the precision it ran at."""
    import sinklab.report.run as run
    from sinklab.analysis.sinkset import compare_bos
    from sinklab.prompts import load_passages
    from sinklab.report.core import Section

    seen = []

    def differentiating_section(ctx):
        for r in ctx.models:
            ids = np.arange(4, dtype=np.int64)
            r.model.vjp(ids, np.ones((4, r.model.config.d_model), np.float32), at=r.model.config.n_layers)
            seen.append(r.model.precision)
        return Section("stand-in", "paper", "here", "body", "a reading long enough to be a reading here")

    monkeypatch.setattr(run, "section_oversquashing", differentiating_section)
    m = smollm2_model
    res = reproduce(["smollm2-135m-instruct"], out=str(tmp_path), progress=False, settings=TINY,
                    sections=["sinks", "oversquashing"], training_profile="none", loader=lambda n: m,
                    precision="bf16")
    assert seen == ["fp32"] and m.precision == "fp32"
    assert res["meta"]["precision"] == "bf16" and res["meta"]["fp32_sections"] == ["oversquashing"]
    md = (tmp_path / "report.md").read_text()
    assert "bf16 weight products" in md and "oversquashing in fp32" in md
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["precision"] == "bf16"
    got = res["sinks"]["numbers"][m.name]["summary"]["bos"]["mean_first_token_importance"]
    texts = load_passages("sinks")[: TINY.sink_prompts]
    kw = dict(T=TINY.sink_T, eps=TINY.eps, skip_short=True, keep_keys=True, progress=False)
    with m.using_precision("bf16"):
        want = compare_bos(m, texts, **kw).bos.importance.mean()
    fp32 = compare_bos(m, texts, **kw).bos.importance.mean()
    assert got == want != fp32


def test_sweep_precision_axis_keys_and_checks(smollm2_gguf):
    from sinklab.sweeps import analyses
    from sinklab.sweeps.grid import Grid, SpecError, address_all

    plain = address_all(Grid.from_spec({"analysis": ["sink_study", "sensitivity"]}).tasks(), "v")
    both = address_all(Grid.from_spec({"analysis": ["sink_study", "sensitivity"],
                                       "precision": ["fp32", "bf16"]}).tasks(), "v")
    keys = {t.key for t in plain}
    fp32 = [t for t in both if t.point.get("precision", "fp32") == "fp32"]
    bf16 = [t for t in both if t.point.get("precision") == "bf16"]
    assert {t.key for t in fp32} == keys                           # fp32 tasks keep their addresses
    assert bf16 and all(t.analysis == "sink_study" for t in bf16)  # sensitivity reads no precision
    assert not keys & {t.key for t in bf16}
    notes = Grid.from_spec({"analysis": ["sensitivity"], "precision": ["bf16"]}).not_applicable()
    assert any("'precision'" in n for n in notes)
    with pytest.raises(SpecError, match="precision values"):
        Grid.from_spec({"precision": ["fp16"]})
    a, b = analyses.worker_model(str(smollm2_gguf), "bf16"), analyses.worker_model(str(smollm2_gguf))
    assert (a.precision, b.precision) == ("bf16", "fp32") and a is not b
    assert analyses.worker_model(str(smollm2_gguf), "bf16") is a
