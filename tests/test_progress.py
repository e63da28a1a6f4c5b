"""The progress bar helper: a shown bar is tqdm's; a bar not shown is a SilentBar that counts
like tqdm does and never imports tqdm (so a quiet process's first long C call runs no import a
Ctrl-C could land in)."""
import io
import subprocess
import sys
import textwrap

from sinklab.progress import SilentBar, progress_bar


def test_silent_bar_counts_like_tqdm():
    from tqdm.auto import tqdm

    items = list(range(7))
    for make in (lambda **kw: progress_bar(progress=False, **kw), lambda **kw: tqdm(file=io.StringIO(), **kw)):
        bar = make(iterable=items)
        assert list(bar) == items and bar.total == 7
        with make(total=10) as manual:
            manual.update(3)
            manual.update()
            manual.set_postfix_str("x")
            assert manual.n == 4 and manual.total == 10
    assert isinstance(progress_bar(items, progress=False), SilentBar)
    assert isinstance(progress_bar(items, progress=True, disable=True), tqdm)


def test_quiet_calls_never_import_tqdm(smollm2_gguf):
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        import sinklab as sl
        m = sl.load({str(smollm2_gguf)!r}, quiet=True)
        ids = np.arange(1, 20)
        m.run(ids, progress=False)
        m.jacobian(ids, of=(2, 18), progress=False)
        m.loss_and_grad(ids)
        print("tqdm" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
