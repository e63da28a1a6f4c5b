"""A headless Chromium for the tests that look at an HTML page in a real browser. Found on PATH,
or installed with Debian's apt-get when it is missing and the user is root (or has passwordless
sudo), so that the README's test command works on a fresh machine; otherwise unavailable()."""
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .required import unavailable

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _find():
    return next((p for p in map(shutil.which, NAMES) if p), None)


def chromium() -> str:
    """The path of a Chromium binary (installing Debian's package if it must and may)."""
    found = _find()
    if found:
        return found
    if not shutil.which("apt-get"):
        unavailable("no Chromium on PATH and no apt-get to install it (install chromium)")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if sudo and subprocess.run(sudo + ["true"], capture_output=True).returncode != 0:
        unavailable("no Chromium on PATH, and installing Debian's chromium needs root")
    with open(Path(tempfile.gettempdir()) / "sinklab-chromium.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)           # two test processes: one installs, the other waits
        if not _find():
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            cmd = sudo + ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
            if subprocess.run(cmd, capture_output=True, env=env).returncode != 0:
                subprocess.run(sudo + ["apt-get", "update", "-q"], capture_output=True, env=env)
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode != 0:
                    unavailable(f"apt-get install chromium failed: {res.stderr[-300:]}")
    return _find() or unavailable("chromium installed but not found on PATH")


def headless(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Chromium run headless on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=...``)."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={profile}", *args, url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
