"""RunState (loops/run_state.py): a checkpoint holds its list of parts, and a guard rollback restores every part
that `--resume` restores, the sample source and the reward scorer's memory included."""
from __future__ import annotations

import copy
import dataclasses
import random

import numpy as np
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.algos.guards import Verdict
from lmrl.learners.checkpoint import list_checkpoints
from lmrl.loops import RunResult, build_stages, train
from lmrl.loops.run_dir import RunDir
from lmrl.loops.run_state import FILE_PARTS, HISTORY, RunState
from lmrl.loops.collect import collect_groups, learn
from lmrl.models import tiny_llama


class CountingSource:
    """A stateful sample source: passes the groups through and remembers how many it saw."""

    def __init__(self, inner):
        self.inner, self.calls, self.groups = inner, 0, 0

    def __call__(self, groups, generate=None):
        self.calls, self.groups = self.calls + 1, self.groups + len(groups)
        return self.inner(groups, generate)

    def state_dict(self):
        return {"calls": self.calls, "groups": self.groups}

    def load_state_dict(self, state):
        self.calls, self.groups = state["calls"], state["groups"]


def stages(tmp_path, steps=2):
    tok = make_tokenizer()
    cfg = toy_run_config(tmp_path, steps, run={"checkpoint_every": 1, "keep_checkpoints": steps + 1},
                         algo={"guards": {"enabled": True, "patience": 99, "lr_factor": 1.0}},
                         reward={"components": [{"name": "contains_7"},  # meds keeps a memory: a stateful scorer
                                                {"name": "meds", "weight": 0.0, "params": {"feature": "text"}}],
                                 "accuracy_component": "contains_7"},
                         rollout={"controller": "rail",  # a bandit over interventions: a stateful controller
                                  "controller_params": {"shadow_steps": 1, "branch_tokens": 2}})
    s = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    return dataclasses.replace(s, add_samples=CountingSource(s.add_samples))


def run_state(s, run_dir) -> RunState:
    return RunState(s, RunDir(run_dir), RunResult(run_dir, s.cfg.trainer.steps))


def snapshot(s, state: RunState) -> dict:
    """Every part's state now: the `state.pt` parts and the file parts (weights, optimiser, scheduler)."""
    out = {name: copy.deepcopy(part.read()) for name, part in state.parts.items()}
    modules = {f"{n}.{k}": v for n, m in s.learner.modules().items() for k, v in m.state_dict().items()}
    out["weights"] = {k: v.detach().clone() for k, v in {**s.model.state_dict(), **modules}.items()}
    out["optimizer"] = copy.deepcopy(s.learner.optimizer.state_dict())
    out["scheduler"] = copy.deepcopy(s.learner.scheduler.state_dict())
    assert set(out) == set(state.parts) | set(FILE_PARTS)
    return out


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def one_more_step(s) -> None:
    """Mutate every part as a bad step would: roll out, score, feed the sampler and source, update, draw."""
    _, kept, _ = collect_groups(s)
    assert learn(s, kept, step=3) is not None
    s.learner.scheduler.step()
    random.random(), np.random.rand(), torch.rand(1)
    s.algorithm.states["guard"].check(3, {"grad_norm": float("nan")})


def test_a_checkpoint_holds_the_run_states_parts_and_its_history(tmp_path):
    s = stages(tmp_path)
    run_dir = train(s.cfg, stages=s).run_dir
    saved = torch.load(list_checkpoints(run_dir / "checkpoints")[-1] / "state.pt", weights_only=False)
    state = run_state(s, run_dir)
    assert set(saved) - set(HISTORY) == set(state.parts)
    assert {"step", "logs", "eval_before", "eval_after", "stopped"} <= set(saved)
    assert saved["sample_source"] == {"calls": 2, "groups": 8}  # 2 steps of 4 kept prompts
    assert saved["rewards"]["meds"]["memory"]  # the scorer's memory is saved


def test_rollback_restores_every_part_resume_restores(tmp_path):
    s = stages(tmp_path)
    run_dir = train(s.cfg, stages=s).run_dir
    state = run_state(s, run_dir)
    at_checkpoint = snapshot(s, state)  # the end of step 2, as checkpoint step-2 holds it
    one_more_step(s)
    mutated = snapshot(s, state)
    assert [name for name in at_checkpoint if same(at_checkpoint[name], mutated[name])] == []  # each part moved

    out = state.rollback(s.algorithm.states["guard"], Verdict(True, ("nonfinite",), 3), step=3)
    assert out["guard/restored_step"] == 2.0
    rolled_back = snapshot(s, state)

    resumed_stages = stages(tmp_path / "fresh")
    resumed = RunState(resumed_stages, RunDir(run_dir), RunResult(run_dir, 2))
    assert resumed.resume(run_dir)[0] == 2
    from_resume = snapshot(resumed_stages, resumed)

    # what a rollback does beyond restoring: it counts itself and reseeds the rollout generator from the restored one
    counted = copy.deepcopy(at_checkpoint["algorithm"])
    counted["guard"]["state"]["rollbacks"] = 1
    reseeded = torch.Generator()
    reseeded.set_state(at_checkpoint["rng"]["generators"]["rollout"])
    reseeded.manual_seed(int(torch.randint(2 ** 62, (1,), generator=reseeded)) + 1)
    expected = {**at_checkpoint, "algorithm": counted}
    expected["rng"] = {**at_checkpoint["rng"], "generators": {**at_checkpoint["rng"]["generators"],
                                                               "rollout": reseeded.get_state()}}
    for name in expected:
        assert same(rolled_back[name], expected[name]), name
    for name in set(from_resume) - {"rng", "algorithm"}:
        assert same(from_resume[name], rolled_back[name]), name
    assert same(from_resume["rng"], at_checkpoint["rng"]) and same(from_resume["algorithm"], at_checkpoint["algorithm"])
    assert rolled_back["sample_source"] == {"calls": 2, "groups": 8}  # the bad step's source state is gone


def test_a_checkpoint_pickled_before_a_record_class_moved_still_loads(tmp_path, monkeypatch):
    import sys
    import types

    import torch

    from lmrl.learners.checkpoint import MOVED_MODULES, load_state
    from lmrl.loops.source import Rollout

    old = types.ModuleType("lmrl.loops.async_")

    class OldRollout(Rollout):  # the same record, pickled under the module earlier versions had
        pass

    OldRollout.__module__, OldRollout.__qualname__, OldRollout.__name__ = "lmrl.loops.async_", "Rollout", "Rollout"
    old.Rollout = OldRollout
    monkeypatch.setitem(sys.modules, "lmrl.loops.async_", old)
    torch.save({"async": {"queue": [OldRollout(3, 1, [], [], {"m": 1.0}, 0.5, 7)]}}, tmp_path / "state.pt")
    monkeypatch.delitem(sys.modules, "lmrl.loops.async_")
    assert MOVED_MODULES["lmrl.loops.async_"] == "lmrl.loops.source"
    [rollout] = load_state(tmp_path)["async"]["queue"]
    assert type(rollout) is Rollout and (rollout.step, rollout.version, rollout.generated) == (3, 1, 7)
