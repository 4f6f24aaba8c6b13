"""What the benchmarks report about the machine they ran on: the CPU model and the load average."""
from __future__ import annotations

import os
import platform
import subprocess


def cpu_model() -> str:
    """`lscpu`'s Model name (e.g. "AMD EPYC"), else what `platform` knows."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine() or "unknown CPU"
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else platform.machine() or "unknown CPU"


def load_average() -> str:
    """The 1/5/15-minute load averages, as text."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"
