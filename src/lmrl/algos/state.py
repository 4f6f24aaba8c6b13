"""State an estimator or loss keeps between training steps: controllers, running statistics, replays.

Some methods are not a function of one batch: GEPO thresholds group entropies against their
history, ACRL adapts its trust band from the discrepancy it measured, PIPO judges the last update
by the reward window and replays the previous batch. Such a method declares its state class at
registration (`state=...`, beside the method: `GepoHistory` in `entropy_control.py`, `AcrlBand`
and `PipoReplay` in `controllers.py`). The class is built once per run from the method's knobs
(`algo.advantage_params` or `algo.loss_params`; the names in its `knobs` tuple are consumed by the
state and not passed to the function). The `Algorithm` calls its hooks; the loop and the learner
never see which method runs (docs/methods/inputs.md, "State between steps"):

- `before_prepare(batch)`: put inputs into the batch (`context`, `extras`) before its advantages;
- `after_update(batch, metrics) -> dict`: learn from the finished update (its averaged metrics);
  returns metrics to log;
- `replay(batch) -> Batch | None`: a batch for one extra update after this one (its advantages are
  computed by the same estimator, with the inputs the state put into it);
- `state_dict()` / `load_state_dict(state)`: saved in checkpoints, so resume continues the state.

Every hook is optional.
"""
from __future__ import annotations

from typing import Any

from lmrl.algos.declarations import AdvantageSpec, LossSpec


def state_knobs(spec: AdvantageSpec | LossSpec) -> tuple[str, ...]:
    """Knob names the declared state consumes (empty without a state)."""
    return spec.state.knobs if spec.state is not None else ()


def build_state(spec: AdvantageSpec | LossSpec, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(state object or None, the knobs left for the function itself)."""
    if spec.state is None:
        return None, dict(params)
    consumed = state_knobs(spec)
    return spec.state(**params), {k: v for k, v in params.items() if k not in consumed}
