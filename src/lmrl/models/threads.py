"""CPU thread policy: as many torch threads as there are idle cores, chosen again before every step.

With two torch threads on two cores, one other busy process (a browser, a compile, a second run)
makes every parallel region wait for a descheduled thread: decoding fell from 72 to 8 tokens/s
here, while one thread kept 56. `auto` therefore counts the other runnable tasks (Linux's
/proc/loadavg, sampled a few times) and uses the cores they leave free, at least one. An explicit
number, or OMP_NUM_THREADS in the environment, fixes the count instead (docs/performance.md).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

LOADAVG = Path("/proc/loadavg")


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def other_runnable_tasks(samples: int = 3, interval_s: float = 0.005) -> int:
    """Runnable tasks besides this thread, the least of a few readings (a blip is not a competitor)."""
    if not LOADAVG.exists():
        return 0
    counts = []
    for i in range(samples):
        running = int(LOADAVG.read_text().split()[3].split("/")[0])
        counts.append(max(running - 1, 0))  # this thread is running while it reads
        if i + 1 < samples:
            time.sleep(interval_s)
    return min(counts)


def choose_threads(setting: int | str) -> int:
    """The torch thread count for `trainer.threads` (a number, or "auto")."""
    if setting != "auto":
        return int(setting)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, available_cores() - other_runnable_tasks())


def apply_threads(setting: int | str) -> int:
    """Set torch's intra-op threads for the next phase of work; returns the count."""
    threads = choose_threads(setting)
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return threads
