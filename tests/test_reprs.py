"""Compact reprs of result objects (sinklab.reprs): one line, arrays by shape, dtype and range
(the range checked against NumPy on the object's own array), nested results summarised, and no
result class left with the dataclass repr that printed every number."""
import dataclasses
import importlib
import pkgutil

import numpy as np
import pytest

import sinklab as sl
import sinklab.analysis
from tests.support.reference_models import SPECS, make_hf_model, save_hf

# small specifications and items, whose full repr is short and shows what they hold
SMALL = {"Condition", "_Item", "PasskeyPrompt", "PasskeyTrial", "MultikeyPrompt", "ClozeItem", "Interval",
         "SeedSummary", "Verdict", "TrainConfig"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return sl.load(save_hf(make_hf_model(SPECS["mha"]), tmp_path_factory.mktemp("reprs") / "tiny"))


def _range(a):
    return f"{tuple(a.shape)} {a.dtype} in [{a.min():.4g}, {a.max():.4g}]"


def test_sink_study_and_bos_comparison(tiny):
    texts = [f"the cat number {i} sat on the mat and the dog ran away to the river" for i in range(40)]
    s = sl.sink_study(tiny, texts, T=12, progress=False)
    r = repr(s)
    assert "\n" not in r and len(r) < 600, r
    assert r.startswith(f"<sinklab.SinkStudy {s.model}: importance {_range(s.importance)}")
    assert "T=12" in r and "first_token_ids (40,) int64" in r
    b = sl.compare_bos(tiny, texts[:8], T=12, progress=False)
    rb = repr(b)
    assert "\n" not in rb and len(rb) < 1200, rb
    assert f"bos=SinkStudy(importance {_range(b.bos.importance)}" in rb
    assert f"nobos=SinkStudy(importance {_range(b.nobos.importance)}" in rb


def test_oversquashing_bound(tiny):
    ids = np.arange(1, 9)
    res = sl.oversquashing_bound(tiny, ids)
    r = repr(res)
    assert "\n" not in r and len(r) < 2500, r
    for f in dataclasses.fields(res):
        v = getattr(res, f.name)
        if isinstance(v, np.ndarray) and v.size and np.isfinite(v).all() and v.dtype.kind == "f":
            assert f"{f.name} {_range(v)}" in r


def test_arrays_with_non_finite_entries_say_how_many():
    from sinklab.reprs import summarize

    a = np.array([1.0, np.nan, 3.0, np.inf], np.float32)
    assert summarize(a) == "(4,) float32 in [1, 3], 2 not finite"
    assert summarize(list(range(100))) == "list[100] of int"
    assert summarize({f"k{i}": i for i in range(10)}).startswith("{10 keys: k0, k1, k2, k3, …}")


def test_no_result_class_keeps_the_generated_repr():
    mods = [importlib.import_module(f"sinklab.analysis.{m.name}") for m in pkgutil.iter_modules(sinklab.analysis.__path__)]
    mods += [importlib.import_module(n) for n in ("sinklab.train.run", "sinklab.sweeps.runner")]
    default = []
    for mod in mods:
        for name, obj in vars(mod).items():
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__
                    and name not in SMALL and hasattr(obj.__repr__, "__wrapped__")):
                default.append(f"{mod.__name__}.{name}")
    assert default == []
