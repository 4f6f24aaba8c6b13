"""`lmrl train | eval | export | merge | list | report | models | serve`: the command line.

Dotted `key=value` overrides may stand anywhere after `train` or `eval`, before or after the options."""
from __future__ import annotations

import argparse
import difflib
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmrl import __version__
from lmrl.config import Config, ConfigError, config_to_yaml
from lmrl.pipeline_config import PipelineConfig
from lmrl.errors import RewardErrorRate
from lmrl.loading import load_recipe, load_run_config
from lmrl.recipe_files import RECIPES_DIR
from lmrl.presets import PRESETS

console = Console(stderr=True)


REGISTRY_KINDS = ["advantages", "losses", "aggregations", "kl", "rewards", "group-rewards", "reward-aggregations",
                  "samplers", "filters", "tasks", "engines", "environments", "sample-sources", "teacher-contexts",
                  "weight-transports", "terms", "shapers", "sources", "rollout-controllers"]
LIST_KINDS = ["algos", "recipes", "stages", *REGISTRY_KINDS]


def _list_kind(what: str) -> str:
    """`lmrl list WHAT`: a known kind, or the nearest one suggested."""
    if what in LIST_KINDS:
        return what
    near = difflib.get_close_matches(what, LIST_KINDS, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise argparse.ArgumentTypeError(f"no kind {what!r}; {hint}(kinds: {', '.join(LIST_KINDS)})")


def _say_notes(cfg: Config) -> None:
    """What loading the config noted (a list replaced, a key spelled the old way), before anything runs."""
    for note in cfg.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", soft_wrap=True, highlight=False)


def _registries() -> dict:
    """Imported only when asked for: they pull in torch, which `lmrl --help` should not wait for."""
    from lmrl.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, LOSSES
    from lmrl.algos.shapers import SHAPERS
    from lmrl.algos.teacher import TEACHER_CONTEXTS
    from lmrl.algos.terms import TERMS
    from lmrl.data import BATCH_SOURCES, GROUP_FILTERS, SAMPLERS
    from lmrl.data.demonstrations import SAMPLE_SOURCES
    from lmrl.engines import ENGINES
    from lmrl.engines.weight_sync import WEIGHT_TRANSPORTS
    from lmrl.envs import ENVIRONMENTS, ROLLOUT_CONTROLLERS, TASKS
    from lmrl.rewards import GROUP_REWARD_FNS, REWARD_AGGREGATIONS, REWARD_FNS

    return dict(zip(REGISTRY_KINDS, [ADVANTAGES, LOSSES, AGGREGATIONS, KL_ESTIMATORS, REWARD_FNS, GROUP_REWARD_FNS,
                                     REWARD_AGGREGATIONS, SAMPLERS, GROUP_FILTERS, TASKS, ENGINES, ENVIRONMENTS,
                                     SAMPLE_SOURCES, TEACHER_CONTEXTS, WEIGHT_TRANSPORTS, TERMS, SHAPERS,
                                     BATCH_SOURCES, ROLLOUT_CONTROLLERS]))


def stage_kinds() -> list[tuple[str, str]]:
    """`lmrl list stages`: (name, description) of what a pipeline's stages can be: each batch source a stage
    trains from (`batches.source`), then the shipped pipeline recipes (those with `stages:`) with their stage
    labels (docs/pipelines.md)."""
    from lmrl.data import BATCH_SOURCES
    from lmrl.recipe_files import read_yaml

    rows = [(f"batches.source={name}", BATCH_SOURCES.describe(name)) for name in BATCH_SOURCES.names()]
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        tree = read_yaml(path)
        if isinstance(tree.get("stages"), list):
            labels = [str(s.get("name")) for s in tree["stages"] if isinstance(s, dict)]
            rows.append((path.stem, f"pipeline recipe, stages: {', '.join(labels)} — {tree.get('description', '')}"))
    return rows


def cmd_list(args) -> int:
    if args.what == "stages":
        rows = stage_kinds()
    elif args.what == "algos":
        rows = [(name, PRESETS.describe(name)) for name in PRESETS.names()]
    elif args.what == "recipes":
        import yaml

        rows = [(p.stem, (yaml.safe_load(p.read_text()) or {}).get("description", ""))
                for p in sorted(RECIPES_DIR.glob("*.yaml"))]
    else:
        reg = _registries()[args.what]
        rows = [(name, reg.describe(name)) for name in reg.names()]
    table = Table(title=args.what)
    table.add_column("name", style="bold")
    table.add_column("description")
    for name, desc in rows:
        table.add_row(name, desc)
    Console().print(table)
    return 0


def _latest_run(loaded: Config | PipelineConfig) -> Path:
    from lmrl.eval.stage_logs import PIPELINE_FILE

    root = Path(loaded.run.output_dir)
    prefix = loaded.run.name or f"{loaded.recipe or 'run'}-"
    runs = sorted((p for p in root.glob(f"{prefix}*") if (p / "config.yaml").exists() or (p / PIPELINE_FILE).exists()),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        raise ConfigError(f"--resume: no run matching {root / prefix}*")
    return runs[-1]


def _recipe_and_overrides(args) -> tuple[str, list[str]]:
    """`lmrl train a.b=1` means the quickstart with an override, not a recipe named `a.b=1`."""
    if args.recipe and "=" in args.recipe:
        return "quickstart", [args.recipe, *args.overrides]
    return args.recipe or "quickstart", list(args.overrides)


LOCATING = ("run.output_dir=", "run.name=")  # with a bare --resume: where to look for the latest run


def _resumed_config(args) -> tuple[Path, Config | PipelineConfig, list[str]]:
    """`--resume RUN` continues RUN under its own config.yaml (a pipeline run: its pipeline.json); a bare
    `--resume` finds the latest run of the recipe. Also returns the overrides the resumed run takes."""
    from lmrl.eval.stage_logs import PIPELINE_FILE

    if "=" in args.resume and not Path(args.resume).is_dir():  # `--resume key=value`: argparse took an override
        args.overrides, args.resume = [args.resume, *args.overrides], ""
    recipe, overrides = _recipe_and_overrides(args)
    if args.resume:
        if args.recipe and "=" not in args.recipe:
            raise ConfigError(f"--resume {args.resume} continues that run with its own config.yaml; "
                              f"drop the recipe {args.recipe!r} (only overrides such as trainer.steps=N may follow)")
        run = Path(args.resume)
    else:
        run = _latest_run(load_recipe(recipe, [o for o in overrides if o.startswith(LOCATING)]))
    overrides = [o for o in overrides if not o.startswith(LOCATING)]
    if (run / PIPELINE_FILE).is_file():
        from lmrl.loops.pipeline import read_pipeline_run

        return run, read_pipeline_run(run), overrides
    return run, load_run_config(run, overrides), overrides


def cmd_train(args) -> int:
    if args.resume is not None:
        resume, cfg, overrides = _resumed_config(args)
    else:
        resume, cfg, overrides = None, load_recipe(*_recipe_and_overrides(args)), []
    if isinstance(cfg, PipelineConfig):
        return _train_pipeline(cfg, resume, overrides, args.dry_run)
    _say_notes(cfg)
    if args.dry_run:
        from lmrl.loops.setup import preflight

        console.print(f"checked: {preflight(cfg, resume=resume)}", soft_wrap=True, highlight=False)
        print(config_to_yaml(cfg), end="")
        return 0
    from lmrl.loops import train

    if resume is not None:
        console.print(f"resuming {resume}")
    result = train(cfg, resume=resume)
    if result.stopped:
        console.print(f"stopped after step {result.steps} (trainer.stop_when: {result.stopped})", soft_wrap=True)
    before = result.eval_before.get("eval/accuracy")
    after = result.eval_after.get("eval/accuracy")
    console.print(f"run directory: {result.run_dir}  (training time {result.train_seconds / 60:.1f} min)",
                  soft_wrap=True)
    if before is not None and after is not None:
        n = int(result.eval_after.get("eval/num_prompts", 0))
        excluded = [int(e.get("eval/excluded", 0)) for e in (result.eval_before, result.eval_after)]
        ungraded = f"; ungraded, the accuracy component erred: {excluded[0]} before, {excluded[1]} after" \
            if any(excluded) else ""
        gain = after - before
        console.print(f"[bold]held-out greedy accuracy ({n} prompts{ungraded}): before {before:.3f} → "
                      f"after {after:.3f}" + ("" if math.isnan(gain) else f" ({gain * 100:+.1f} points)"),
                      soft_wrap=True)
    return 0


def _train_pipeline(pipe: PipelineConfig, resume: Path | None, overrides: list[str], dry_run: bool) -> int:
    """`lmrl train PIPELINE` (docs/pipelines.md): every stage checked, or trained one after another."""
    from lmrl.loops.pipeline import train_pipeline

    for stage in pipe.stages:
        for note in stage.config.notes:
            console.print(f"[yellow]note:[/yellow] stage {stage.label}: {escape(note)}", soft_wrap=True,
                          highlight=False)
    if dry_run:
        return _check_pipeline(pipe, resume, overrides)
    if resume is not None:
        console.print(f"resuming {resume}")
    result = train_pipeline(pipe, resume, overrides)
    for label, folder in result.stages.items():
        console.print(f"stage {label}: {folder}", soft_wrap=True, highlight=False)
    console.print(f"run directory: {result.run_dir}; final weights: {result.model}", soft_wrap=True, highlight=False)
    return 0


def _check_pipeline(pipe: PipelineConfig, resume: Path | None, overrides: list[str]) -> int:
    """`--dry-run` of a pipeline: each stage not yet done checked as a plain run's dry run is, its settings printed."""
    import yaml

    from lmrl.eval.stage_logs import read_pipeline
    from lmrl.loops.pipeline import check_resume_overrides, new_pipeline_dir, stage_config, stage_output
    from lmrl.loops.setup import preflight
    from lmrl.recipe_files import references

    root = resume if resume is not None else new_pipeline_dir(pipe, dry_run=True)
    if resume is not None:
        check_resume_overrides(overrides, resume)
    done = {s["label"] for s in (read_pipeline(root) or {"stages": []})["stages"] if s["status"] == "done"}
    for i, stage in enumerate(pipe.stages):
        if stage.label in done:
            console.print(f"stage {i + 1} {stage.label}: done", soft_wrap=True, highlight=False)
            continue
        start = f"from stage {stage.model_from}'s final weights" if stage.model_from else stage.config.model.path
        cfg, started = stage_config(pipe, i, root, overrides, weights_needed=False)
        unwritten = [f"stage {ref['from']}'s {ref['file']}" for ref in references(stage.tree) if ref.get("file")
                     and not stage_output(pipe, root, ref["from"], ref["file"]).exists()]
        checked = preflight(cfg, resume=root if started else None) if not unwritten else \
            f"settings checked; its data is {', '.join(unwritten)}, written when that stage runs"
        console.print(f"stage {i + 1} {stage.label} (model {start}): checked: {checked}", soft_wrap=True,
                      highlight=False)
        print(f"# stage {i + 1}: {stage.label}\n" + yaml.safe_dump(stage_summary(cfg, stage.model_from),
                                                                   sort_keys=False), end="")
    return 0


def stage_summary(cfg: Config, model_from: str | None) -> dict:
    """A stage's settings that differ from the defaults, its model named by the stage it comes from."""
    summary = cfg.model_dump(mode="json", exclude_defaults=True)
    if model_from is not None:
        summary.setdefault("model", {})["path"] = f"the final weights of stage {model_from}"
    return summary


def cmd_eval(args) -> int:
    """The evaluation suite (docs/eval.md): metrics on stdout, the full result as JSON."""
    from lmrl.eval.suite import eval_target, run_eval, write_suite

    recipe, overrides = _recipe_and_overrides(args)
    overrides += [f"eval.samples={args.samples}", f"eval.pass_k={args.k}"]
    cfg, default_out = eval_target(recipe, overrides, args.model, args.step)
    _say_notes(cfg)
    if args.reward_seeking and not Path(args.reward_seeking).is_file():
        raise FileNotFoundError(f"--reward-seeking: no probe file {args.reward_seeking}")
    if args.dry_run:
        from lmrl.loops.setup import preflight

        console.print(f"checked: {preflight(cfg, trains=False)}", soft_wrap=True, highlight=False)
        print(config_to_yaml(cfg), end="")
        return 0
    result = run_eval(cfg, probe=args.reward_seeking)
    for k, v in result["metrics"].items():
        print(f"eval/{k}: {v:.4f}")
    out = args.out or default_out
    if out:
        console.print(f"wrote {write_suite(result, out)}", soft_wrap=True, highlight=False)
    return 0


def export_role(cfg, name: str, checkpoint: Path, out: Path, what: str) -> int:
    """`lmrl export --role NAME`: a trained role's weights in `checkpoint` as a transformers directory (its adapter
    folded into the base it was trained on)."""
    from lmrl.loading import role_config
    from lmrl.models.lora import export_merged

    if name not in cfg.roles:
        raise ConfigError(f"--role {name}: the run has no such role (its roles: {', '.join(cfg.roles) or 'none'})")
    spec, own = cfg.roles[name], role_config(cfg, name)
    saved = checkpoint / "roles" / name / "model"
    saved = saved / name if spec.model == "adapter" else saved
    if not saved.exists():
        raise ConfigError(f"--role {name}: {checkpoint} holds no weights of it (a frozen role, or one playing the "
                          "policy's weights: export the policy)")
    export_merged(saved, own.model.path, own.model.lora, out)
    console.print(f"exported role {name} at {what} to {out} as a causal LM", soft_wrap=True, highlight=False)
    return 0


def cmd_export(args) -> int:
    """A run's checkpoint as a plain transformers directory, LoRA adapters merged into the weights; a run
    that trained a reward model's score head exports a sequence-classification model (a process reward model's
    step head: a token-classification model)."""
    from lmrl.learners.checkpoint import saved_module
    from lmrl.models.checkpoint_dirs import list_checkpoints
    from lmrl.models.lora import export_merged

    cfg = load_run_config(Path(args.run))
    found = list_checkpoints(Path(args.run) / "checkpoints")
    if not found:
        raise ConfigError(f"{args.run} has no complete checkpoint to export")
    by_step = {int(p.name.split("-")[1]): p for p in found}
    step = max(by_step) if args.step is None else args.step
    if step not in by_step:
        raise ConfigError(f"{args.run} has no checkpoint at step {step}; it has steps {sorted(by_step)}")
    if args.role is not None:
        return export_role(cfg, args.role, by_step[step], Path(args.merge), f"step {step} of {args.run}")
    head = saved_module(by_step[step], "score_head")
    out = export_merged(by_step[step] / "model", cfg.model.path, cfg.model.lora, Path(args.merge),
                        score_weight=None if head is None else head["weight"])
    kind = ("a causal LM" if head is None else "a reward model (sequence classification)"
            if head["weight"].shape[0] == 1 else "a process reward model (token classification)")
    console.print(f"exported step {step} of {args.run} to {out} as {kind}", soft_wrap=True, highlight=False)
    return 0


def cmd_merge(args) -> int:
    """Interpolate or merge models (linear, SLERP, task arithmetic) into a transformers directory."""
    from lmrl.models.merging import merge_models

    out = merge_models(args.models, Path(args.out), args.method, t=args.t, weights=args.weights, base=args.base,
                       lambdas=args.lambdas)
    console.print(f"merged {len(args.models)} model(s) ({args.method}) into {out}", soft_wrap=True, highlight=False)
    return 0


def cmd_compare(args) -> int:
    """Runs side by side with intervals and Holm-corrected tests (docs/eval.md): OUT/compare.json, .html, curves.png."""
    from lmrl.eval.compare import parse_arm, write_comparison

    result = write_comparison([parse_arm(a) for a in args.arms], args.out, alpha=args.alpha, n_boot=args.bootstrap,
                              seed=args.seed, metrics=args.metrics)
    print(result["statement"])
    console.print(f"wrote {Path(args.out) / 'compare.html'}", soft_wrap=True, highlight=False)
    return 0


def cmd_report(args) -> int:
    from lmrl.eval.report import write_report

    print(write_report(args.run))
    return 0


def cmd_models(args) -> int:
    from lmrl.models import pull_default_model, resolve_model_path

    path = pull_default_model() if args.action == "pull" else resolve_model_path(args.path or "default")
    print(path)
    return 0


def cmd_serve(args) -> int:
    import os

    from lmrl.serve import serve

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    serve(args.model, host=args.host, port=args.port, model_name=args.name, api_key=api_key, device=args.device,
          base=args.base, max_tokens_limit=args.max_tokens_limit, max_batch_rows=args.max_batch_rows,
          max_queue=args.max_queue, queue_timeout_s=args.queue_timeout)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lmrl", description="RL post-training of language models")
    p.add_argument("--version", action="version", version=f"lmrl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train with a recipe (default: quickstart) and key=value overrides")
    t.add_argument("recipe", nargs="?", help="recipe name or YAML path")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.preset=dapo trainer.lr=2e-5")
    t.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    t.add_argument("--resume", nargs="?", const="", default=None,
                   help="continue a run from its last complete checkpoint (default: the latest run of the recipe)")
    t.set_defaults(fn=cmd_train)
    e = sub.add_parser("eval", help="evaluation suite on held-out prompts: accuracy, pass@k, maj@k, diversity, "
                                    "calibration, abstention, per-prompt solve rates (docs/eval.md)")
    e.add_argument("recipe", nargs="?", help="recipe name or YAML path, or a run directory (its latest checkpoint)")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--model", help="model directory, .gguf file or 'default' (e.g. a checkpoint's model/)")
    e.add_argument("--step", type=int, help="with a run directory: the checkpoint step (default: the latest)")
    e.add_argument("--samples", type=int, default=1, help="sampled completions per prompt for pass@k")
    e.add_argument("--k", default="[1]", help="pass@k values, e.g. [1,4]")
    e.add_argument("--out", help="write the result JSON here (default: RUN/eval/step-N.json for a run's checkpoint)")
    e.add_argument("--reward-seeking", metavar="PROBE_YAML", help="also measure reward-seeking with this probe")
    e.add_argument("--dry-run", action="store_true", help="check the model, data and settings; print the config")
    e.set_defaults(fn=cmd_eval)
    x = sub.add_parser("export", help="write a run's checkpoint as a transformers model directory (LoRA merged; "
                                            "a reward model as a sequence-classification model)")
    x.add_argument("run", help="run directory, e.g. runs/quickstart-...")
    x.add_argument("--step", type=int, help="checkpoint step (default: the latest complete checkpoint)")
    x.add_argument("--role", help="export this trained role's weights instead of the policy's (docs/roles.md)")
    x.add_argument("--merge", required=True, metavar="OUT_DIR",
                   help="new directory for the merged model (weights, config, tokenizer)")
    x.set_defaults(fn=cmd_export)
    mg = sub.add_parser("merge", help="interpolate or merge models (linear, slerp, task_arithmetic; docs/merging.md)")
    mg.add_argument("models", nargs="+", help="model directories, checkpoints (runs/X/checkpoints/step-N) or runs "
                                              "(their latest checkpoint); LoRA checkpoints are merged into their base")
    mg.add_argument("--out", required=True, help="new directory for the merged model (weights, config, tokenizer)")
    mg.add_argument("--method", choices=["linear", "slerp", "task_arithmetic"], default="linear")
    mg.add_argument("--t", type=float, help="two models: (1-t)*first + t*second (default 0.5)")
    mg.add_argument("--weights", type=float, nargs="+", help="linear: one weight per model, normalised to sum 1")
    mg.add_argument("--base", help="task_arithmetic: the model the others were fine-tuned from")
    mg.add_argument("--lambdas", type=float, nargs="+", help="task_arithmetic: one lambda per model (default 1)")
    mg.set_defaults(fn=cmd_merge)
    ls = sub.add_parser("list", help="what is registered")
    ls.add_argument("what", type=_list_kind, metavar="WHAT", help=f"one of: {', '.join(LIST_KINDS)}")
    ls.set_defaults(fn=cmd_list)
    r = sub.add_parser("report", help="write RUN/report.html with plots of the run's metrics")
    r.add_argument("run")
    r.set_defaults(fn=cmd_report)
    c = sub.add_parser("compare", help="compare runs: metrics with intervals, Holm-corrected tests, training curves")
    c.add_argument("arms", nargs="+", metavar="ARM",
                   help="a run directory or `lmrl eval` JSON; several runs (seeds) of one arm: [NAME=]RUN,RUN,…; "
                        "the first arm is the reference")
    c.add_argument("--out", default="compare", help="output directory (default: ./compare)")
    c.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm's correction")
    c.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples over prompts")
    c.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    c.add_argument("--metrics", nargs="+", help="test only these metrics (default: every metric all runs report)")
    c.set_defaults(fn=cmd_compare)
    m = sub.add_parser("models", help="the embedded default model")
    m.add_argument("action", choices=["pull", "path"])
    m.add_argument("path", nargs="?")
    m.set_defaults(fn=cmd_models)
    sv = sub.add_parser("serve", help="serve a model as an OpenAI-compatible endpoint (e.g. a local judge, or a "
                        "distillation teacher's token log-probs)")
    sv.add_argument("model", help="model directory, .gguf file, 'default', or a LoRA checkpoint's adapter directory")
    sv.add_argument("--base", help="the base model of a LoRA adapter directory (default: the run's model.path)")
    sv.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--name", help="model name reported by the API (default: the directory name or 'default')")
    sv.add_argument("--device", default="auto",
                    help="auto (the first CUDA device when there is one), cpu, cuda or cuda:N")
    sv.add_argument("--max-tokens-limit", type=int, default=1024, help="largest max_tokens a request may ask for")
    sv.add_argument("--max-batch-rows", type=int, default=32,
                    help="most completions (or scored prompts) in one batched call")
    sv.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond this are refused (HTTP 429)")
    sv.add_argument("--queue-timeout", type=float, default=120.0,
                    help="seconds a request may wait for its turn before it is refused (HTTP 503)")
    sv.add_argument("--api-key-env", help="require 'Authorization: Bearer <key>' with the key in this environment variable")
    sv.set_defaults(fn=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]  # `key=value` after an option: an override, wherever it stands
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError, KeyError, RewardErrorRate) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        console.print(f"[red]error:[/red] {escape(str(message))}", soft_wrap=True, highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
