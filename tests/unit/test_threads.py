"""Thread policy: `auto` uses the cores other runnable tasks leave idle; a number or OMP_NUM_THREADS fixes it."""
from __future__ import annotations

import pytest
import torch

from lmrl.models import threads


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A two-core machine whose /proc/loadavg reports `running` runnable tasks (this thread included)."""
    loadavg = tmp_path / "loadavg"
    monkeypatch.setattr(threads, "LOADAVG", loadavg)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return lambda running: loadavg.write_text(f"0.50 0.40 0.30 {running}/120 4242\n")


@pytest.mark.parametrize("running, expected", [(1, 2), (2, 1), (3, 1), (9, 1)])
def test_auto_leaves_cores_to_other_runnable_tasks(machine, running, expected):
    machine(running)
    assert threads.choose_threads("auto") == expected


def test_a_number_or_omp_num_threads_fixes_the_count(machine, monkeypatch):
    machine(5)
    assert threads.choose_threads(2) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.choose_threads("auto") == 2


def test_apply_sets_torch_threads(machine):
    before = torch.get_num_threads()
    try:
        machine(2)
        assert threads.apply_threads("auto") == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
