"""The Python API: a config from a recipe, training on your own data, rewards and environments, evaluation.

    import lmrl
    cfg = lmrl.recipe("quickstart", trainer__steps=5)
    result = lmrl.train(cfg, dataset=rows, rewards=[my_reward, ("format", 0.2)])
    result.metric("reward/mean"), result.eval_after["eval/accuracy"]

Every call goes through what the command line uses: `recipe` reads a recipe with its bases and
applies overrides like `lmrl train` (then the preset, then every config check); `train` runs
`lmrl.loops.train` (a pipeline's stages: `lmrl.loops.pipeline`); `evaluate` runs `lmrl eval`'s suite.
Python objects become names in the config:
a reward function or environment class is registered under its own `__name__` (a notebook cell run
again replaces its earlier definition; another object under a taken name is refused), and a dataset
is written as a JSON-lines file named by its content (`run.output_dir/datasets/`), so the run's config.yaml
names all it trained on and a resumed run can tell whether it is given the same rows.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmrl.config import Config, ConfigError
from lmrl.pipeline_config import PipelineConfig, PipelineStage
from lmrl.loading import build_config, dotted_items, pipeline_from_tree
from lmrl.loops.loop import RunResult
from lmrl.loops.pipeline import PipelineResult
from lmrl.recipe_files import merge_trees, parse_override, recipe_tree

__all__ = ["TrainResult", "evaluate", "recipe", "train"]

DATASETS_DIR = "datasets"  # under run.output_dir: the rows passed to `train`, one file per content


@dataclass
class TrainResult(RunResult):
    """What `train` returns: the loop's `RunResult` (run_dir, steps, eval_before, eval_after, train_seconds,
    stopped) with the run's metric rows (metrics.jsonl, one dict per logged row) and its final config."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: Config | None = None

    def metric(self, name: str) -> list[float]:
        """The logged values of metric `name`, in order (e.g. `result.metric("reward/mean")`, one per step)."""
        return [row[name] for row in self.metrics if name in row]

    @property
    def checkpoint(self) -> Path | None:
        """The model folder of the run's latest complete checkpoint (None when it saved none): its `model/`
        (a transformers directory; a LoRA run's peft adapters, sharded or not), or for a sharded learner's
        whole model its shards gathered into `step-N/gathered/` in this process, the first time it is asked
        (`models.sharded_checkpoint.loadable_model`)."""
        from lmrl.models.checkpoint_dirs import latest_checkpoint
        from lmrl.models.sharded_checkpoint import loadable_model

        found = latest_checkpoint(self.run_dir / "checkpoints")
        return loadable_model(found) if found is not None else None


def recipe(name: str | None = "quickstart", overrides: Sequence[str] = (),
           **settings: Any) -> Config | PipelineConfig:
    """A validated config: the recipe `name` (shipped, or a YAML path; None for the defaults), then the
    command line's `key=value` `overrides`, then `settings` with `__` for the dots (`trainer__steps=5`).

    A setting's value is a Python value, used as given (no YAML parsing); a dict merges into the
    section key by key (`algo={"preset": "dapo", "eps_high": 0.3}`). Errors are those of `lmrl train`.
    A pipeline recipe (with `stages:`) gives its `PipelineConfig`, every stage validated; a setting
    `stages__<label>__key=value` is one stage's (docs/pipelines.md).
    """
    tree = recipe_tree(name)
    if "stages" in tree:
        parsed = [parse_override(item) for item in overrides]
        parsed += [pair for key, value in settings.items() for pair in dotted_items({key.replace("__", "."): value})]
        return pipeline_from_tree(tree, parsed)
    for item in overrides:
        _set(tree, *parse_override(item))
    for key, value in settings.items():
        _set(tree, key.replace("__", "."), value)
    return build_config(tree)


def train(cfg: Config | PipelineConfig, dataset: Iterable[Mapping[str, Any]] | None = None,
          eval_dataset: Iterable[Mapping[str, Any]] | None = None, rewards: Sequence[Any] | None = None,
          env: Any = None, resume: str | Path | None = None, model=None, tokenizer=None
          ) -> TrainResult | PipelineResult:
    """Train `cfg`, with Python objects in place of its data, rewards and environment.

    `dataset` / `eval_dataset`: a `datasets.Dataset` or a list of dicts, with the fields
    `task.prompt_field` and `task.answer_field` name (written to `run.output_dir/datasets/`, the task
    becomes `jsonl` on that file); without `eval_dataset` the held-out rows are taken from `dataset`. `rewards`: reward functions `fn(sample, **params)`, registered names
    (`"format"`), `(either, weight)` pairs, or components as the config writes them (`{"name": fn,
    "weight": 0.5, "params": {...}}`); they replace `reward.components`, and the first becomes
    `reward.accuracy_component` unless that is one of them. `env`: an environment class (or a registered
    name); without `rewards` its episode reward is the reward. `resume`: the run directory to continue
    (same arguments as the run it continues). `model` / `tokenizer`: objects to train instead of
    loading `model.path`.

    A pipeline (`recipe` of a recipe with `stages:`) trains its stages in order, the data, rewards and
    environment given applying to every stage, and returns a `PipelineResult` (run_dir, each stage's
    run directory and final metrics, the final weights); `model` / `tokenizer` are a plain run's only.
    """
    if isinstance(cfg, PipelineConfig):
        return _train_pipeline(cfg, dataset, eval_dataset, rewards, env, resume, model, tokenizer)
    from lmrl.loops import build_stages
    from lmrl.loops import train as run_loop

    tree = user_tree(cfg)
    if dataset is not None:
        _use_rows(tree, Path(cfg.run.output_dir) / DATASETS_DIR, dataset, eval_dataset)
    elif eval_dataset is not None:
        raise ConfigError("eval_dataset needs dataset as well (or set task.params.eval_dataset for a jsonl task)")
    _use_objects(tree, rewards, env)
    final = build_config(tree)
    stages = build_stages(final, model=model, tokenizer=tokenizer) if model is not None or tokenizer is not None \
        else None
    result = run_loop(final, resume=Path(resume) if resume is not None else None, stages=stages)
    return TrainResult(**vars(result), metrics=read_metrics(result.run_dir), config=final)


def _train_pipeline(pipe: PipelineConfig, dataset, eval_dataset, rewards, env, resume, model, tokenizer
                    ) -> PipelineResult:
    from lmrl.loops.pipeline import train_pipeline

    if model is not None or tokenizer is not None:
        raise TypeError("a pipeline loads each stage's model from its model.path (the first stage's, then the "
                        "stage before's final weights): save the model and set model.path instead of model=")
    stages = []
    for stage in pipe.stages:
        tree = copy.deepcopy(stage.tree)
        if dataset is not None:
            _use_rows(tree, Path(stage.config.run.output_dir) / DATASETS_DIR, dataset, eval_dataset)
        _use_objects(tree, rewards, env)
        stages.append(PipelineStage(stage.label, build_config(tree), tree, stage.model_from))
    pipe = PipelineConfig(pipe.recipe, pipe.description, pipe.run, tuple(stages))
    return train_pipeline(pipe, resume=Path(resume) if resume is not None else None)


def evaluate(cfg: Config, model: str | Path | TrainResult | None = None,
             dataset: Iterable[Mapping[str, Any]] | None = None, rewards: Sequence[Any] | None = None,
             env: Any = None) -> dict[str, Any]:
    """`lmrl eval` from Python: the suite's result (`metrics`, per-prompt `prompts`, `never_solved`,
    `settings`; docs/eval.md) for `model` (a model argument, a checkpoint's `model/` folder, or a
    `TrainResult`: its latest checkpoint; default `cfg.model.path`) on `dataset` (every row; default the
    config's held-out rows), scored by `rewards` and played in `env` as in `train`."""
    from lmrl.eval.suite import run_eval

    tree = user_tree(cfg)
    if model is not None:
        path = model.checkpoint if isinstance(model, TrainResult) else model
        if path is None:
            raise ConfigError(f"{model.run_dir} has no checkpoint to evaluate")
        if (Path(path) / "adapter_config.json").is_file():
            raise ConfigError(f"{path} holds LoRA adapters: export them first (lmrl export RUN --merge DIR) "
                              "and evaluate DIR")
        tree.setdefault("model", {})["path"] = str(path)
    _use_objects(tree, rewards, env)
    if dataset is None:
        return run_eval(build_config(tree))
    with tempfile.TemporaryDirectory(prefix="lmrl-eval-") as folder:
        rows = _use_rows(tree, Path(folder), dataset, dataset)
        tree["task"]["num_eval"] = rows
        return run_eval(build_config(tree))


def user_tree(cfg: Config) -> dict[str, Any]:
    """The settings of `cfg` that were chosen (recipe, overrides), without the defaults and the preset's
    fill-ins, so that a config rebuilt from it expands its preset and checks itself anew."""
    tree = cfg.model_dump(exclude_unset=True)
    for key in cfg._preset_filled:
        *sections, last = key.split(".")
        node = tree
        for section in sections:
            node = node.get(section, {})
        node.pop(last, None)
    return copy.deepcopy(tree)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    file = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()] if file.exists() else []


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key`; a dict value merges into a section that is already there."""
    *sections, last = key.split(".")
    node = tree
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {section!r} is not a section")
    both = isinstance(value, dict) and isinstance(node.get(last), dict)
    node[last] = merge_trees(node[last], value) if both else value


def _rows(data: Iterable[Mapping[str, Any]], what: str) -> list[dict[str, Any]]:
    if isinstance(data, Mapping):
        raise TypeError(f"{what} is a mapping (a DatasetDict of splits, or columns): pass one split "
                        "(dataset['train']) or a list of row dicts")
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise TypeError(f"{what}: row {i} is a {type(row).__name__}, not a dict of fields (a pandas DataFrame: "
                            "pass df.to_dict('records'))")
        rows.append(dict(row))
    if not rows:
        raise ValueError(f"{what} has no rows")
    return rows


def _write_rows(rows: list[dict[str, Any]], folder: Path, what: str) -> Path:
    """`rows` as a JSON-lines file in `folder`, named by its content's hash (the same rows: the same file)."""
    lines = []
    for i, row in enumerate(rows):
        try:
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        except TypeError as err:
            raise TypeError(f"{what}: row {i} cannot be written as JSON ({err}); keep to text, numbers, lists "
                            "and dicts") from None
    data = "".join(lines).encode("utf-8")
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


def _use_rows(tree: dict[str, Any], folder: Path, dataset, eval_dataset) -> int:
    """Point the task at `dataset` (and `eval_dataset`) written as JSON lines in `folder`; the rows' count."""
    rows = _rows(dataset, "dataset")
    task = tree.setdefault("task", {})
    task.update(name="jsonl", dataset=str(_write_rows(rows, folder, "dataset")), params={})
    if eval_dataset is dataset:
        task["params"] = {"eval_dataset": task["dataset"]}
    elif eval_dataset is not None:
        task["params"] = {"eval_dataset": str(_write_rows(_rows(eval_dataset, "eval_dataset"), folder,
                                                          "eval_dataset"))}
    return len(rows)


def _use_objects(tree: dict[str, Any], rewards: Sequence[Any] | None, env: Any) -> None:
    """Register the reward functions and environment passed in, and name them in the tree."""
    if env is not None:
        tree.setdefault("env", {})["name"] = register_env(env)
        if rewards is None:
            rewards = ["env"]
    if rewards is None:
        return
    if isinstance(rewards, (str, Mapping)) or callable(rewards) or not rewards:
        raise TypeError("rewards must be a non-empty list: reward functions, registered names, (reward, weight) pairs")
    components = [_component(r) for r in rewards]
    reward = tree.setdefault("reward", {})
    reward["components"] = components
    names = [c["name"] for c in components]
    if reward.get("accuracy_component", "answer") not in names:
        reward["accuracy_component"] = names[0]


def _component(entry: Any) -> dict[str, Any]:
    if isinstance(entry, Mapping):  # a component as the config writes it, its name possibly a function
        component = dict(entry)
        if callable(component.get("name")):
            component["name"] = register_reward(component["name"])
        return component
    weight = 1.0
    if isinstance(entry, tuple):
        if len(entry) != 2:
            raise TypeError(f"a reward pair is (reward, weight), got {entry!r}")
        entry, weight = entry
    if isinstance(entry, str):
        return {"name": entry, "weight": float(weight)}
    if not callable(entry):
        raise TypeError(f"a reward is a function of a Sample or a registered name, got {type(entry).__name__}")
    return {"name": register_reward(entry), "weight": float(weight)}


def _own_name(obj: Any, kind: str) -> str:
    name = getattr(obj, "__name__", None)
    if not name or name == "<lambda>":
        raise TypeError(f"a {kind} needs a name to be logged under: define it with def (a lambda has none)")
    return name


def register_reward(fn: Any) -> str:
    """The name `fn` is registered under as a reward: its registration (a group reward's decorator), else its
    `__name__` in REWARD_FNS (registered now; a redefinition of the same function replaces the old one)."""
    from lmrl.rewards import GROUP_REWARD_FNS, REWARD_FNS

    for registry in (GROUP_REWARD_FNS, REWARD_FNS):
        name = registry.name_of(fn)
        if name is not None:
            return name
    name = _own_name(fn, "reward function")
    REWARD_FNS.register(name)(fn)
    return name


def register_env(env: Any) -> str:
    """The registered name of `env`: a name as given, or an environment class registered under its `__name__`."""
    from lmrl.envs.environment import ENVIRONMENTS, forget_built_environments

    if isinstance(env, str):
        return env
    if not inspect.isclass(env):
        raise TypeError(f"env must be an environment class or a registered name, got {type(env).__name__}")
    name = ENVIRONMENTS.name_of(env)
    if name is None:
        name = _own_name(env, "environment")
        ENVIRONMENTS.register(name)(env)
        forget_built_environments()  # environments are built once per name: a redefined class must be built anew
    return name
