"""The validation pipeline: every check of a Config, in one ordered list by stage, driven by declarations.

Stage "names": every registry key resolves (user code `file.py:name` too). Stage "combinations":
what the estimator and the loss declare (`AdvantageSpec`, `LossSpec`) and what the preset brought,
against the rest of the config. Stage "data": the task rows carry the fields the methods and
demonstrations read. `build_config` (so `load_config` and `lmrl train --dry-run`) runs the first two
through `check_names`; `build_stages` runs the last through `check_row_fields` once rows are loaded.
No check names a method: each reads the method's declaration. Pydantic keeps field types and ranges.
"""
from __future__ import annotations

from typing import Any, Callable

from lmrl.config import Config, ConfigError
from lmrl.data import BATCH_SOURCES
from lmrl.envs.mixture import mixture_configs
from lmrl.data.sources import check_batches
from lmrl.envs.controllers import check_controller
from lmrl.validation.demonstrations import _demonstration_rows, _demonstrations, _peers, _sample_source, _source_rows
from lmrl.validation.methods import (_critic, _declared_checks, _groups, _inputs, _kl_in_reward, _method_rows,
                                     _preset_aggregation, _preset_clip_bounds, _rejected_tokens, _sequence_ratio)
from lmrl.validation.names import _params, _registered, _reward_names, _trackers
from lmrl.validation.roles import _roles
from lmrl.validation.runs import (_env_reward, _rollout_workers, _sampler_probe, _stop_rules, _streaming,
                                  check_refresh, streaming_problems)

__all__ = ["CONFIG_STAGES", "PIPELINE", "check_mixture", "check_names", "check_refresh", "check_row_fields", "run_stages",
           "streaming_problems"]

CONFIG_STAGES = ("names", "combinations")  # need no data: build_config runs them
PIPELINE: list[tuple[str, Callable[..., None]]] = [
    ("names", _registered), ("names", _params), ("names", _reward_names), ("names", _trackers),
    ("combinations", _env_reward), ("combinations", _rollout_workers), ("combinations", _preset_clip_bounds), ("combinations", _preset_aggregation), ("combinations", _sequence_ratio),
    ("combinations", _kl_in_reward), ("combinations", _stop_rules), ("combinations", check_batches), ("combinations", _groups), ("combinations", _declared_checks),
    ("combinations", _peers), ("combinations", _demonstrations), ("combinations", _sample_source),
    ("combinations", _critic), ("combinations", _inputs), ("combinations", _rejected_tokens), ("combinations", _sampler_probe),
    ("combinations", _streaming), ("combinations", check_controller), ("combinations", _roles),
    ("data", _demonstration_rows), ("data", _source_rows), ("data", _method_rows),
]


def run_stages(stages: tuple[str, ...], *args: Any) -> None:
    """Run the pipeline's checks of `stages` in order; the first failure raises ConfigError."""
    for stage, check in PIPELINE:
        if stage in stages:
            check(*args)


def check_names(cfg: Config) -> None:
    """The stages that need no data: names resolve, then declarations and settings fit together; for a task
    mixture, in each task's own config too."""
    check_mixture(cfg)
    run_stages(CONFIG_STAGES, cfg)


def check_mixture(cfg: Config) -> None:
    """Each task of a mixture passes every check a run of that task alone would (its error names the task); a
    mixture is a batch source's prompts, so it needs an online one (rollouts, online_pairs)."""
    entries = mixture_configs(cfg)
    if entries and not BATCH_SOURCES.spec(cfg.batches.source).online:
        raise ConfigError(f"mixture.tasks: batches.source={cfg.batches.source} trains the rows of batches.dataset; "
                          "a mixture's tasks are sampled prompts (batches.source=rollouts or online_pairs)")
    if entries and cfg.data.demonstrations != "none":
        raise ConfigError(f"mixture.tasks with data.demonstrations={cfg.data.demonstrations}: a sample source adds "
                          "samples built from one task's fields, which a mixture's tasks do not share; not built for "
                          "mixtures (unset data.demonstrations)")
    for entry in entries:
        try:
            run_stages(CONFIG_STAGES, entry.cfg)
        except ConfigError as err:
            raise ConfigError(f"mixture task {entry.name}: {err}") from None


def check_row_fields(cfg: Config, rows: list[dict]) -> None:
    """The data stage, once the training rows are loaded."""
    run_stages(("data",), cfg, rows)
