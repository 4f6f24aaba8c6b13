"""The schema of a pipeline recipe: stages trained one after another into one run directory, and a refresh
pipeline's rounds (docs/pipelines.md). Reading one is lmrl.loading's work (`load_pipeline`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from lmrl.config import Config, RunConfig, Section


class StageEntry(Section):
    """One entry of a pipeline recipe's `stages:` list (docs/pipelines.md)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")  # the stage's label: its folder, `stages.<label>.key=value`
    recipe: str | None = None  # a recipe name or path the stage starts from (the shared keys then go over it)
    # the stage's own settings, over the shared keys: dotted keys or nested mappings
    overrides: dict[str, Any] = Field(default_factory=dict)


FEEDBACK_FILE = "feedback.jsonl"  # in a refresh pipeline's policy stage: the labelled rollouts its next round adds


class RefreshConfig(Section):
    """A pipeline's proxy-refresh rounds (docs/pipelines.md#refresh): its two stages, a reward model trained on
    labelled rollouts and a policy trained against it, repeat; a policy stage that over-optimises (its
    `trainer.stop_when` drop rule fires) is rolled back to its best evaluation, and the rollouts sampled from
    there, `feedback_groups` groups of them, join the next reward model's data (stages_and_credit §5.1)."""

    rounds: int = Field(3, ge=1)  # the most rounds of (reward model, policy)
    feedback_groups: int = Field(32, ge=1)  # the rollout groups of the rolled-back policy labelled per round


@dataclass(frozen=True)
class PipelineStage:
    """A stage of a loaded pipeline: its label, its validated config, the tree that config was built from
    (rebuilt when the stage is placed in its run directory; `{from: <label>}` values in it name an earlier
    stage's output), and the stage whose final weights it starts from (None: its own `model.path`). In a
    refresh pipeline, `role` is "reward_model" or "policy" and `round` counts from 1."""

    label: str
    config: Config
    tree: dict[str, Any]
    model_from: str | None = None
    role: str | None = None
    round: int = 0


@dataclass(frozen=True)
class PipelineConfig:
    """Stages trained one after another into one run directory (`run.output_dir`/`run.name`; docs/pipelines.md)."""

    recipe: str | None
    description: str
    run: RunConfig
    stages: tuple[PipelineStage, ...]
    refresh: RefreshConfig | None = None

    @property
    def labels(self) -> list[str]:
        return [stage.label for stage in self.stages]
