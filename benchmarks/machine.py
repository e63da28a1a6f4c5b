"""What the benchmarks print about the machine they ran on."""
import platform


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
