"""`import lmrl.envs` (the environment and task registries, read by `lmrl list` and the config checks)
loads no model library: transformers and the optional task packages load when a run first uses them."""
from __future__ import annotations

import subprocess
import sys

DEFERRED = ("transformers", "accelerate", "peft", "vllm", "datasets", "reasoning_gym", "math_verify", "ray",
            "textarena")


def test_importing_the_environments_loads_no_heavy_library():
    code = ("import sys, lmrl.envs; "
            f"print(' '.join(m for m in {DEFERRED!r} if m in sys.modules)); "
            "print(len(lmrl.envs.ENVIRONMENTS.names()), len(lmrl.envs.TASKS.names()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, counts = out.split("\n")[:2]
    assert loaded == ""
    assert all(int(n) > 0 for n in counts.split())  # the registries are filled all the same

