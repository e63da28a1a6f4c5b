"""User-defined analyses in a sweep (``analysis = "package.module:function"``): their rows are the
function's own, called directly; keys are stable and hold the function's source; a rerun skips the
finished tasks and an edited function reruns; a raising or contract-breaking function fails only
its task; bad names are refused before anything runs; a 2-worker LocalCluster gives the serial
run's results."""
import importlib
import json
import os
import sys
import textwrap

import numpy as np
import pytest

import sinklab as sl
from sinklab.sweeps import Grid, SpecError, sweep, task_arrays
from sinklab.sweeps.grid import address_all

from tests.support.reference_models import require

pd = require("pandas")

USER_MODULE = textwrap.dedent('''
    import numpy as np
    from sinklab.sweeps.grid import read_prompts

    def mean_first_attention(task, model):
        """Mean attention to position 0 over the last query, per eps the share of heads above it."""
        texts = read_prompts(task.point["prompts"])[: task.settings.get("n_prompts", 2)]
        bos = model.config.bos_token_id if task.point["bos"] else None
        out = []
        for t in texts:
            ids = list(model.tokenize(t, bos=False))[: task.point["T"] - (bos is not None)]
            ids = ([bos] if bos is not None else []) + ids
            out.append(model.run(np.asarray(ids), capture="stats", progress=False).stats.to_first[:, :, -1])
        a = np.stack(out)                                   # (P, L, H)
        rows = [{"share_above": float((a > r["eps"]).mean()), "mean": float(a.mean())} for r in task.rows]
        return rows, {"to_first_last": a}

    def broken(task, model):
        raise RuntimeError("this analysis is broken on purpose")

    def wrong_rows(task, model):
        return [{"x": 1.0}] * (len(task.rows) + 1), {}
''')


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    """A fresh module ``sweep_user_mod`` on sys.path (and PYTHONPATH, for cluster workers)."""
    name = f"sweep_user_mod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield name, tmp_path / f"{name}.py"
    sys.modules.pop(name, None)


def _spec(mod, fn="mean_first_attention", **kw):
    return {"analysis": [f"{mod}:{fn}"], "model": ["smollm2-135m-instruct"], "bos": [True, False], "T": [16, 24],
            "eps": [0.2, 0.5], "settings": {f"{mod}:{fn}": {"n_prompts": 3}}, **kw}


def test_rows_are_the_functions_own_and_a_rerun_skips(user_module, smollm2_model, tmp_path):
    mod, _ = user_module
    spec = _spec(mod)
    out = str(tmp_path / "s")
    res = sweep(spec, out=out, serial=True, progress=False, figures=True, verbose=False)
    assert len(res.ran) == 4 and not res.failed and len(res.table) == 8
    fn = importlib.import_module(mod).mean_first_attention
    tasks = address_all(Grid.from_spec(spec).tasks(), sl.__version__)
    for t in tasks:
        rows, arrays = fn(t, smollm2_model)
        got = res.table[res.table["key"] == t.key].sort_values("eps")
        assert list(got["share_above"]) == [r["share_above"] for r in rows]
        np.testing.assert_array_equal(task_arrays(out, t)["to_first_last"], arrays["to_first_last"])
        assert t.identity["user_source_sha256"] and t.name.startswith(mod + "_mean_first_attention-")
    again = sweep(spec, out=out, serial=True, progress=False, figures=False, verbose=False)
    assert not again.ran and len(again.skipped) == 4
    assert [t.key for t in address_all(Grid.from_spec(spec).tasks(), sl.__version__)] == [t.key for t in tasks]


def test_an_edited_function_gets_new_keys_and_runs_again(user_module, tmp_path):
    mod, path = user_module
    spec = _spec(mod, T=[16], bos=[True])
    out = str(tmp_path / "s")
    first = sweep(spec, out=out, serial=True, progress=False, figures=False, verbose=False)
    path.write_text(USER_MODULE.replace("Mean attention to position 0", "Mean attention to the first token"))
    sys.modules.pop(mod, None)
    importlib.invalidate_caches()
    second = sweep(spec, out=out, serial=True, progress=False, figures=False, verbose=False)
    assert len(second.ran) == 1 and second.ran != first.ran and not second.skipped
    assert len(os.listdir(os.path.join(out, "tasks"))) == 4          # both versions' .json and .npz kept


def test_a_failing_function_fails_only_its_task(user_module, tmp_path):
    mod, _ = user_module
    spec = {"analysis": [f"{mod}:broken", f"{mod}:wrong_rows", "sink_study"], "model": ["smollm2-135m-instruct"],
            "bos": [True], "T": [16], "settings": {"sink_study": {"n_prompts": 2}}}
    res = sweep(spec, out=str(tmp_path / "s"), serial=True, progress=False, figures=False, verbose=False)
    assert len(res.ran) == 1 and len(res.failed) == 2
    text = {n: json.load(open(os.path.join(tmp_path, "s", "failed", n + ".json")))["error"] for n in res.failed}
    assert any("broken on purpose" in t for t in text.values())
    assert any("must return a list of 1 dict(s)" in t for t in text.values())


def test_a_worker_with_another_source_refuses_the_task(user_module):
    from sinklab.sweeps.analyses import model_analysis

    mod, _ = user_module
    (t,) = address_all(Grid.from_spec(_spec(mod, T=[16], bos=[True])).tasks(), sl.__version__)
    t.identity["user_source_sha256"] = "0" * 64
    with pytest.raises(RuntimeError, match="different source"):
        model_analysis(t)


@pytest.mark.parametrize("name, match", [
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("os:no_such_function", "has no attribute 'no_such_function'"),
    ("os:sep", "is a str, not a function"),
    (":f", "written 'package.module:function'"),
    ("os:path:join", "written 'package.module:function'"),
    ("sink_studyy", "or name a function 'package.module:function'"),
])
def test_bad_user_analysis_names_are_refused_before_anything_runs(name, match, tmp_path):
    with pytest.raises(SpecError, match=match):
        sweep({"analysis": [name]}, out=str(tmp_path / "o"), serial=True, progress=False, verbose=False)
    assert not (tmp_path / "o" / "tasks").exists()


def test_two_worker_local_cluster_equals_the_serial_run(user_module, tmp_path):
    mod, _ = user_module
    spec = _spec(mod)
    serial = sweep(spec, out=str(tmp_path / "a"), serial=True, threads=1, progress=False, figures=False, verbose=False)
    both = sweep(spec, out=str(tmp_path / "b"), workers=2, threads=1, progress=False, figures=False, verbose=False)
    assert len(both.ran) == 4 and not both.failed
    for t in address_all(Grid.from_spec(spec).tasks(), sl.__version__):
        a, b = task_arrays(str(tmp_path / "a"), t), task_arrays(str(tmp_path / "b"), t)
        np.testing.assert_array_equal(a["to_first_last"], b["to_first_last"])
    cols = ["key", "eps", "share_above", "mean"]
    pd.testing.assert_frame_equal(serial.table[cols].sort_values(cols[:2]).reset_index(drop=True),
                                  both.table[cols].sort_values(cols[:2]).reset_index(drop=True))
    assert json.loads(json.dumps(list(both.table["analysis"].unique()))) == [f"{mod}:mean_first_attention"]
