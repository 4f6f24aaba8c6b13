"""Input providers: where each per-sample input an algorithm declares comes from.

An estimator or loss declares the inputs it needs (`requires` in its registry declaration); a
provider, registered under the input's name, says what it needs to produce it (the learner, the
tokenizer, the task rows, …) and fills it into the batch. The loop asks the providers for what the
algorithm declares and names no method (docs/architecture.md).
"""
from __future__ import annotations

from lmrl.algos.inputs import ALIASES, MODEL_OUTPUTS, ROW_FIELD_INPUTS
from lmrl.registry import Registry

PROVIDERS: Registry = Registry("input provider")

# The inputs the loop provides today; replaced by the names of the registered providers.
_PROVIDED = ({"acc", "group_acc", "rollout_logp", "ref_logp", "old_logp", "reward_components", "step",
              "total_steps", "entropy", "acoustic_rewards", "speech_mask", "pmi"}
             | set(ALIASES) | MODEL_OUTPUTS | ROW_FIELD_INPUTS)


def provided_inputs() -> set[str]:
    """Every per-sample input name some provider can fill."""
    return set(_PROVIDED) | set(PROVIDERS.names())
