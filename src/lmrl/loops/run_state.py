"""One `RunState`: every stateful part of a run listed once; checkpoint save, `--resume` and guard rollback use it.

A checkpoint holds the run's training state, which both `--resume` and a guard rollback restore,
and its history, which only `--resume` restores:

- training state: the weights (and the learner's other modules, e.g. a value head), optimiser and
  scheduler (files written by `learners.checkpoint`, or by every rank of a sharded learner as
  `learners.sharded_checkpoint` shards), then the `PARTS` kept in `state.pt`: the
  sampler, every random state, the method states (the guard among them), the reward scorer and
  the sample source;
- history: the step, how far the logs had got, the evaluation results, why `trainer.stop_when`
  ended the run and what its rules remember, and the background batch source's queued batches. A rollback keeps it: step numbers
  and logs go on from where the bad streak ended (docs/guards.md).

The batch source (`loops.source`) takes part in a rollback: it stops before the restore and goes on
from the restored state after it (the inline source when the loop has set none).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from lmrl.algos.guards import Guard, GuardError, Verdict, scale_lr
from lmrl.config import ConfigError
from lmrl.data import load_source_state, source_state
from lmrl.learners.checkpoint import load_checkpoint, remove_checkpoint, restore_rng, rng_state, save_checkpoint
from lmrl.learners.sharded_checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from lmrl.models.sharded_checkpoint import is_sharded
from lmrl.models.checkpoint_dirs import latest_checkpoint, list_checkpoints
from lmrl.loops.inline import InlineSource
from lmrl.loops.role_setup import read_roles, write_roles
from lmrl.loops.run_dir import RunDir
from lmrl.loops.setup import Stages
from lmrl.loops.source import BatchSource

_REQUIRED = object()

# the weights, optimiser and scheduler: written as files beside `state.pt` (learners.checkpoint)
FILE_PARTS = ("weights", "optimizer", "scheduler")
# the history a checkpoint records and a rollback keeps
HISTORY = ("step", "logs", "eval_before", "eval_after", "stopped", "stop_watch", "async")


@dataclass(frozen=True)
class Part:
    """One stateful part kept in `state.pt`: how to read its state and how to put it back.

    `missing`: what restoring a checkpoint written before the part existed loads (required when unset)."""

    read: Callable[[], Any]
    load: Callable[[Any], None]
    missing: Any = _REQUIRED


def controller_states(s: Stages) -> dict[str, Any]:
    """The states of the rollout controllers that keep one between steps (a bandit's estimates), by task."""
    return {k: c.state_dict() for k, c in s.controllers().items() if hasattr(c, "state_dict")}


def load_controller_states(s: Stages, states: dict[str, Any]) -> None:
    for k, c in s.controllers().items():
        if k in states:
            c.load_state_dict(states[k])


class RunState:
    """The stateful parts of one run's stages (`s`), its directory and the loop's result record."""

    def __init__(self, s: Stages, run: RunDir, result, source: BatchSource | None = None):
        self.s, self.run, self.result = s, run, result
        self.source: BatchSource = source or InlineSource(s)
        self.generators = {"rollout": s.generator, "shuffle": s.learner.shuffle}
        gens = self.generators
        self.parts: dict[str, Part] = {  # restored in this order
            "sampler": Part(s.sampler.state_dict, s.sampler.load_state_dict),
            "rng": Part(lambda: rng_state(gens), lambda state: restore_rng(state, gens)),
            "algorithm": Part(s.algorithm.state_dict, s.algorithm.load_state_dict, {}),
            "rewards": Part(s.scorer.state_dict, s.scorer.load_state_dict, {}),
            "sample_source": Part(lambda: source_state(s.add_samples),
                                  lambda state: load_source_state(s.add_samples, state), {}),
            "controllers": Part(lambda: controller_states(s), lambda state: load_controller_states(s, state), {}),
        }

    def boundary(self, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """Everything besides the weights that a checkpoint at the end of this step must restore, including
        how far the logs had got (a resumed run rewinds them there and logs the rest again); `skip`: the
        parts the batch source moves on its own, which it reads itself (`BatchSource.checkpoint_state`)."""
        return {**self.read(tuple(name for name in self.parts if name not in skip)), "logs": self.run.positions()}

    def read(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The states of the parts `names`."""
        return {name: self.parts[name].read() for name in names}

    def save(self, step: int, boundary: dict[str, Any]) -> None:
        """A checkpoint at `step` holding `boundary` (a `boundary()`, with the loop's own history added):
        rank 0 writes it while the other ranks wait; with `trainer.sharding: fsdp` every rank writes its
        shards of the weights and optimiser, and rank 0 the rest."""
        s = self.s
        state = {"step": step, "eval_before": self.result.eval_before, "eval_after": self.result.eval_after,
                 **boundary}
        keep = s.cfg.run.keep_checkpoints
        if s.cfg.trainer.sharding == "fsdp":
            save_sharded_checkpoint(self.run.checkpoints, step, s.learner, s.tokenizer, state, keep, s.parallel)
        elif s.parallel.is_main:
            save_checkpoint(self.run.checkpoints, step, s.model, s.tokenizer, s.learner.optimizer,
                            s.learner.scheduler, state, keep=keep, modules=s.learner.modules(),
                            extra=(lambda tmp: write_roles(s.roles, tmp)) if s.roles else None)
        s.parallel.barrier()

    def restore(self, path: Path) -> dict[str, Any]:
        """Load the training state of checkpoint `path` into the stages; return its saved state."""
        s = self.s
        if s.cfg.trainer.sharding == "fsdp":
            state = load_sharded_checkpoint(path, s.learner)
        elif is_sharded(path):
            raise ConfigError(f"checkpoint {path} holds FSDP shards: resume it with trainer.sharding=fsdp")
        else:
            state = load_checkpoint(path, s.model, s.learner.optimizer, s.learner.scheduler,
                                    modules=s.learner.modules())
        for name, part in self.parts.items():
            if name not in state and part.missing is _REQUIRED:
                raise RuntimeError(f"checkpoint {path} holds no {name} state; it cannot be restored")
            part.load(state.get(name, part.missing))
        read_roles(s.roles, path)
        return state

    def resume(self, resume: Path | None) -> tuple[int, dict[str, Any]]:
        """Load the last complete checkpoint of the run directory into the stages, history included:
        (its step, its saved state). (0, {}) for a new run, or one killed before its first checkpoint."""
        if not resume:
            return 0, {}
        ckpt = latest_checkpoint(self.run.checkpoints)
        if ckpt is None:
            self.run.rewind(None)  # killed before its first checkpoint: start over
            return 0, {}
        state = self.restore(ckpt)
        start = state["step"]
        if start > self.s.cfg.trainer.steps:
            raise ConfigError(f"{ckpt} is at step {start}, past trainer.steps={self.s.cfg.trainer.steps}")
        self.result.eval_before, self.result.eval_after = state.get("eval_before", {}), state.get("eval_after", {})
        self.s.engine.update_weights(None, start)
        if "logs" in state:
            self.run.rewind(state["logs"])
        else:  # a checkpoint from a version that did not record log positions
            self.run.truncate_after(start)
        return start, state

    def rollback(self, guard: Guard, verdict: Verdict, step: int) -> dict[str, float]:
        """Restore the training state of the last checkpoint saved before `verdict.since`, as `--resume` would.

        Then counts the rollback, multiplies the learning rate by `lr_factor` (once per rollback since
        that checkpoint), reseeds the rollout generator from the restored one and the rollback count
        (so the retried steps draw other completions; the same samples at the same rate would fail
        the same way), deletes the checkpoints after it (they hold the bad weights, and a later
        `--resume` must not pick them) and sends the weights to the engine as version `step`.
        """
        why = f"{', '.join(verdict.reasons)} for {guard.cfg.patience} step(s) in a row since step {verdict.since}"
        if guard.rollbacks >= guard.cfg.max_rollbacks:
            raise GuardError(f"guard tripped at step {step} ({why}) after {guard.rollbacks} rollback(s) "
                             f"(algo.guards.max_rollbacks={guard.cfg.max_rollbacks}): stopping. Lower trainer.lr, "
                             "raise algo.guards.max_rollbacks, or loosen the guard's thresholds")
        found = list_checkpoints(self.run.checkpoints)
        good = [p for p in found if _step_of(p) < verdict.since]
        if not good:
            raise GuardError(f"guard tripped at step {step} ({why}) but no checkpoint from before step "
                             f"{verdict.since} is left to roll back to (complete checkpoints at steps "
                             f"{[_step_of(p) for p in found]}); set run.checkpoint_every lower or "
                             "run.keep_checkpoints higher")
        target = good[-1]
        rollbacks = guard.rollbacks + 1
        learner = self.s.learner
        with self.source.restarting(step):
            guard.load_state_dict({"streak": 0, "since": None, "rollbacks": 0})  # a checkpoint without guard state
            self.restore(target)
            scale_lr(learner.optimizer, learner.scheduler, guard.cfg.lr_factor ** (rollbacks - guard.rollbacks))
            guard.load_state_dict({"streak": 0, "since": None, "rollbacks": rollbacks})
            rollout = self.generators["rollout"]
            rollout.manual_seed(int(torch.randint(2 ** 62, (1,), generator=rollout)) + rollbacks)
            for later in found:
                if _step_of(later) > _step_of(target):
                    remove_checkpoint(later)
        return {"guard/rollbacks": float(rollbacks), "guard/restored_step": float(_step_of(target)),
                "guard/lr": float(learner.optimizer.param_groups[0]["lr"])}

    def guard_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """The loop's call after step `step`'s update: the guard's metrics, after a rollback when it tripped.

        Nothing (an empty dict) when the run has no guard."""
        guard = self.s.algorithm.states.get("guard")
        if guard is None:
            return {}
        verdict = guard.check(step, metrics)
        if not verdict.tripped:
            return verdict.metrics
        return {**verdict.metrics, **self.rollback(guard, verdict, step)}


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("-")[1])
