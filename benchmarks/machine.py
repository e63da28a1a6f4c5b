"""What the benchmarks print about the machine they ran on."""
from sinklab.runtime import cpu_name  # noqa: F401  (the CPU model; re-exported for the benchmarks)


def lscpu_lines() -> list:
    """lscpu's lines on the CPU model, cores and caches, and its SIMD flags (empty without lscpu)."""
    import shutil
    import subprocess

    if not shutil.which("lscpu"):
        return []
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keys = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per", "Socket(s)", "L1d", "L2", "L3")
    lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(keys)]
    for ln in out.splitlines():
        if ln.strip().startswith("Flags:"):
            simd = [f for f in ln.split()[1:] if f.startswith(("avx", "fma", "amx", "f16c"))]
            lines.append("SIMD flags: " + " ".join(simd))
    return lines
