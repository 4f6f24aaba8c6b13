"""Pipelines: stages trained one after another into one run directory (docs/pipelines.md).

`runs/<name>/pipeline.json` records the stages, their status (pending, running, done) and final metrics;
each stage is a normal run directory `runs/<name>/stages/<NN>-<label>/` (its own config.yaml, logs,
checkpoints), so `lmrl report`, `lmrl eval` and `lmrl export` work on a stage. A finished stage's final
checkpoint is exported there as `model/`, a plain transformers directory (LoRA adapters merged): the
model the next stage starts from. Resuming skips the finished stages, continues the interrupted one from
its last checkpoint (the run's own resume) and goes on with the rest.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lmrl.config import Config, ConfigError, resumable
from lmrl.pipeline_config import PipelineConfig, PipelineStage, RefreshConfig
from lmrl.eval.stage_logs import PIPELINE_FILE, STAGES_DIR, read_pipeline
from lmrl.loading import build_config, checked_tree, load_run_config
from lmrl.loops.dispatch import train
from lmrl.loops.refresh import START, refresh_after
from lmrl.loops.run_dir import new_run_path, remove_run, run_entries
from lmrl.models.checkpoint_dirs import latest_checkpoint
from lmrl.recipe_files import parse_override, resolve_references, set_dotted
from lmrl.validation import check_refresh

EXPORTED_FROM = "lmrl_checkpoint.txt"  # the checkpoint a stage's model/ was exported from
FINAL_MODEL = "model"  # in a finished stage's directory: its final weights as a transformers directory
SKIPPED = "skipped"  # a refresh round the pipeline did not need: the round before it did not over-optimise


@dataclass
class PipelineResult:
    """What a pipeline run gives: its directory, each stage's run directory and final metrics (by label), and
    the last stage's final weights (a transformers directory)."""

    run_dir: Path
    stages: dict[str, Path] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    model: Path | None = None


def stage_name(index: int, label: str) -> str:
    """A stage's run name: its place and label (`02-rl`)."""
    return f"{index + 1:02d}-{label}"


def stage_folder(index: int, label: str) -> str:
    return f"{STAGES_DIR}/{stage_name(index, label)}"


def stage_output(pipe: PipelineConfig, root: Path, label: str, file: str | None = None) -> Path:
    """Where stage `label` of the pipeline run `root` leaves its final weights (`FINAL_MODEL`) or `file`."""
    return root / stage_folder(pipe.labels.index(label), label) / (file or FINAL_MODEL)


def placed(pipe: PipelineConfig, index: int, root: Path, model_path: str | None = None,
           overrides: list[str] = ()) -> Config:
    """Stage `index`'s config as it runs: in its folder of the pipeline run `root`, from `model_path` when given
    (an earlier stage's final weights), its references to earlier stages' outputs made paths in `root`, with the
    (resumable) `overrides` of a resumed pipeline."""
    stage = pipe.stages[index]
    tree = resolve_references(stage.tree, lambda label, file: str(stage_output(pipe, root, label, file)))
    run = tree.setdefault("run", {})
    run.update(output_dir=str(root / STAGES_DIR), name=stage_name(index, stage.label), overwrite=False)
    if model_path is not None:
        tree.setdefault("model", {})["path"] = model_path
    for key, value in (parse_override(item) for item in overrides):
        set_dotted(tree, key, value)
    return build_config(tree)


def _record(pipe: PipelineConfig) -> dict[str, Any]:
    return {"recipe": pipe.recipe, "description": pipe.description,
            "refresh": pipe.refresh.model_dump() if pipe.refresh else None,
            "stages": [{"label": s.label, "dir": stage_folder(i, s.label), "status": "pending",
                        "model_from": s.model_from, "role": s.role, "round": s.round, "steps": None, "metrics": {},
                        "tree": s.tree}
                       for i, s in enumerate(pipe.stages)]}


def _write_record(root: Path, record: dict[str, Any]) -> None:
    tmp = root / f".{PIPELINE_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, root / PIPELINE_FILE)


def new_pipeline_dir(pipe: PipelineConfig, dry_run: bool = False) -> Path:
    """Where a new pipeline run writes (`run.output_dir`/`run.name`, or the recipe and a timestamp); a
    directory holding a run is refused unless `run.overwrite` is set, which deletes that run first (not in a
    dry run, which changes nothing)."""
    path = new_run_path(pipe.run, pipe.recipe)
    if pipe.run.overwrite and run_entries(path) and not dry_run:
        remove_run(path)
    return path


def read_pipeline_run(run_dir: Path) -> PipelineConfig:
    """The pipeline a run directory was started with, from its pipeline.json."""
    record = read_pipeline(run_dir)
    if record is None:
        raise ConfigError(f"{run_dir} has no {PIPELINE_FILE}: it is not a pipeline run")
    stages: list[PipelineStage] = []
    for s in record["stages"]:
        cfg = build_config(checked_tree(s["label"], s["tree"], stages))
        stages.append(PipelineStage(s["label"], cfg, s["tree"], s["model_from"], s.get("role"), s.get("round", 0)))
    run = stages[0].config.run.model_copy(update={"output_dir": str(Path(run_dir).parent),
                                                  "name": Path(run_dir).name})
    refresh = RefreshConfig.model_validate(record["refresh"]) if record.get("refresh") else None
    return PipelineConfig(record["recipe"], record["description"], run, tuple(stages), refresh)


def _final_metrics(run_dir: Path, steps: int) -> dict[str, Any]:
    """The metrics a stage logged at its last step (its step row and its evaluation there)."""
    merged: dict[str, Any] = {}
    file = run_dir / "metrics.jsonl"
    for line in file.read_text().splitlines() if file.exists() else []:
        row = json.loads(line)
        if row.get("step") == steps:
            merged.update({k: v for k, v in row.items() if k not in ("step", "time")})
    return merged


def export_final(cfg: Config, run_dir: Path, checkpoint: Path | str | None = None) -> Path:
    """The stage's final checkpoint (or `checkpoint`; `START`: the model it started from) as `run_dir/model/`, a transformers directory (written
    aside, then renamed), as `lmrl export` writes it: a reward-model stage's score head makes it a sequence
    classifier (a process reward model's step head, a token classifier). The checkpoint it came from is
    recorded beside it (`EXPORTED_FROM`), so a stage that trained on after an export (a resume that extended
    it) is exported again."""
    from lmrl.learners.checkpoint import saved_module
    from lmrl.models.lora import export_merged

    out, tmp = run_dir / FINAL_MODEL, run_dir / f".{FINAL_MODEL}.tmp"
    if checkpoint == START:
        return _export_start(cfg, out, tmp)
    found = checkpoint or latest_checkpoint(run_dir / "checkpoints")
    if found is None:
        raise RuntimeError(f"{run_dir} finished without a checkpoint to start the next stage from")
    if out.is_dir() and (out / EXPORTED_FROM).is_file() and (out / EXPORTED_FROM).read_text() == found.name:
        return out
    shutil.rmtree(tmp, ignore_errors=True)
    head = saved_module(found, "score_head")
    export_merged(found / "model", cfg.model.path, cfg.model.lora, tmp,
                  score_weight=head["weight"] if head else None)
    (tmp / EXPORTED_FROM).write_text(found.name)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _export_start(cfg: Config, out: Path, tmp: Path) -> Path:
    """The model the stage started from as its `model/` (a rollback to before its first step)."""
    from lmrl.models.loading import resolve_model_path

    if out.is_dir() and (out / EXPORTED_FROM).is_file() and (out / EXPORTED_FROM).read_text() == START:
        return out
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(resolve_model_path(cfg.model.path), tmp)
    (tmp / EXPORTED_FROM).write_text(START)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def check_resume_overrides(overrides: list[str], run_dir: Path) -> None:
    for key, _ in (parse_override(item) for item in overrides):
        if not resumable(key):
            raise ConfigError(f"{key} cannot change when resuming {run_dir}: the settings that may change are those "
                              f"of a plain run's resume (docs/runs.md); start a new run to change {key}")


def stage_config(pipe: PipelineConfig, index: int, root: Path, overrides: list[str] = (),
                 weights_needed: bool = True) -> tuple[Config, bool]:
    """(config, started) of a stage not yet done, as it runs: a started stage under its own config.yaml, a
    pending one placed in `root`, from the final weights of the stage its model comes from (`weights_needed`
    False, as `--dry-run` checks a pipeline before any stage ran: from the model its chain starts from)."""
    stage, folder = pipe.stages[index], root / stage_folder(index, pipe.stages[index].label)
    if (folder / "config.yaml").exists():
        return load_run_config(folder, list(overrides)), True
    source = None
    if stage.model_from is not None:
        source = root / stage_folder(pipe.labels.index(stage.model_from), stage.model_from) / FINAL_MODEL
        if not source.is_dir():
            if weights_needed:
                raise RuntimeError(f"stage {stage.label!r} starts from {source}, which is missing")
            source = None
    return placed(pipe, index, root, str(source) if source is not None else None, overrides), False


def train_pipeline(pipe: PipelineConfig, resume: Path | None = None, overrides: list[str] = ()) -> PipelineResult:
    """Train the stages in order into one run directory (or continue the pipeline run `resume`).

    Each stage's status is written to pipeline.json as it starts and ends, so a run killed at any moment
    resumes where it was: finished stages are skipped, a started one continues from its last checkpoint
    (`overrides`: the resumable settings, as for a plain run), and the rest follow."""
    if resume is not None:
        root = Path(resume)
        check_resume_overrides(list(overrides), root)
        record = read_pipeline(root)
        if record is None or [s["label"] for s in record["stages"]] != pipe.labels:
            raise ConfigError(f"resuming {root}: it is not a pipeline run of the stages {', '.join(pipe.labels)}")
    else:
        root = new_pipeline_dir(pipe)
        root.mkdir(parents=True, exist_ok=True)
        record = _record(pipe)
        _write_record(root, record)
    result = PipelineResult(root)
    for i, (stage, entry) in enumerate(zip(pipe.stages, record["stages"])):
        if entry["status"] == SKIPPED:
            continue
        folder = root / entry["dir"]
        result.stages[stage.label] = folder
        if entry["status"] != "done":
            cfg, started = stage_config(pipe, i, root, overrides)
            entry["status"] = "running"
            _write_record(root, record)
            done = train(cfg, resume=folder if started else None)
            if stage.role == "policy":
                check_refresh(pipe.stages[i - 1], replace(stage, config=cfg), pipe.refresh)  # resume overrides too
                rm_dir = root / stage_folder(i - 1, pipe.stages[i - 1].label)
                entry["refresh"] = refresh_after(cfg, folder, pipe.refresh.feedback_groups, rm_dir,
                                                 lambda checkpoint: export_final(cfg, folder, checkpoint))
            else:
                export_final(cfg, folder)
            kept = entry.get("refresh", {}).get("rolled_back_to", done.steps)  # the step its model/ is from
            entry.update(status="done", steps=done.steps, metrics=_final_metrics(folder, kept))
            if entry.get("refresh", {}).get("over_optimised") is False:  # the proxy held: no further round
                for later in record["stages"][i + 1:]:
                    later["status"] = SKIPPED
            _write_record(root, record)
        result.metrics[stage.label] = entry["metrics"]
        result.model = folder / FINAL_MODEL
    return result
