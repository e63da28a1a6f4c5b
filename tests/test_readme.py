"""The README's quick start is what CI runs, and the repository cites only the paper itself."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands():
    md = (ROOT / "README.md").read_text()
    section = md.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    cmds = quick_start_commands()
    assert len(cmds) == 2, cmds
    main_job, tests = cmds
    assert "sinklab reproduce" in main_job and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines(), "CI must run the README's test command verbatim"
    assert "python3 -m venv" in ci


def test_nothing_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout (an sdist): read the package tree instead
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    offenders = []
    for rel in tracked:
        if rel.endswith((".py", ".md", ".ipynb", ".c", ".h", ".toml", ".txt")):
            text = (ROOT / rel).read_text(encoding="utf-8", errors="replace")
            if "PAPER" + ".md" in text or "../" + "shared" in text:
                offenders.append(rel)
    assert not offenders, f"files citing documents outside the repository: {offenders}"
