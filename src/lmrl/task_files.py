"""Task files written before training, from a recipe and its overrides or from recorded data:

    python -m lmrl.task_files peers RECIPE OUT.jsonl --model PEER [--samples 4] [--rows N] [overrides]
    python -m lmrl.task_files teacher_samples RECIPE OUT.jsonl --model TEACHER [--samples 1] [--rows N] [--greedy]
        [--min-reward R] [--drop-truncated] [overrides]
    python -m lmrl.task_files hints RECIPE OUT.jsonl [overrides] [--samples 8] [--delta 0.03] [--rows N]
    python -m lmrl.task_files judge_rows OUT.jsonl --rollouts RUN/rollouts.jsonl [--max-candidates 4]
        [--reward-range 0 1] [--seed 0]
    python -m lmrl.task_files judge_rows OUT.jsonl --pairs PAIRS.jsonl [--chosen-score 7] [--rejected-score 3]
    python -m lmrl.task_files rubric_rows OUT.jsonl --current RUN/rollouts.jsonl [--earlier RUN0/rollouts.jsonl]
    python -m lmrl.task_files critic_rows OUT.jsonl --rollouts RUN/rollouts.jsonl [--accuracy answer] [--k 4]
    python -m lmrl.task_files steps RECIPE OUT.jsonl [overrides] [--model PATH] [--prompts N] [--solutions 4]
        [--k 4] [--separator '\\n'] [--max-steps S] [--hard]
    python -m lmrl.task_files hit_counts RECIPE OUT.jsonl [overrides] [--samples 128] [--rows N]

`peers`: the recipe's training rows with another model's rollouts, for Mutual RL's PRP
(`data.demonstrations: peers`, lmrl.data.peers). `teacher_samples`: a teacher's completions of the training
prompts as an SFT dataset, for sequence-level distillation (`batches.source: sft`, lmrl.data.teacher_samples;
with `--min-reward`, only those the recipe's reward scores at least R). `hints`: each row's knowledge points chosen by the
recipe's own policy, for KnowRL (`data.demonstrations: hints`, lmrl.data.hints). `steps`: Math-Shepherd
step labels of the policy's own solutions from Monte-Carlo continuations, a process-reward-model dataset
(lmrl.data.step_labels). `hit_counts`: each training fact of a recall task with the number of `--samples`
replies the recipe's accuracy component grades correct, and its split by that count (lmrl.data.hit_counts).
Each of these loads the config, the model and the task as a run would, then writes one JSON line per training
row (`steps`: per solution).
`judge_rows`: GRRM judge prompts over a run's recorded groups (or preference pairs) with their
reference scores, for the `grrm_judge` recipe; `rubric_rows`: EVOLM's rubric-writing prompts with a
newer and an older reply of each prompt, for the `evolm_generator` recipe (lmrl.data.judge_rows,
docs/stages/judges.md); `critic_rows`: GenAC critic prompts over each recorded group's prompt and the previous
group's rollouts, with the group's success rate as the `genac_critic` target (docs/methods/genac.md). These read files only; no model loads.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def policy_and_rows(cfg, rows: int | None):
    """The config's model as an engine, its tokenizer, the first `rows` training rows and the seeded generator."""
    import torch

    from lmrl.envs.pieces import build_pieces

    pieces = build_pieces(cfg)
    train = pieces.train_rows[:rows] if rows else pieces.train_rows
    return pieces.engine, pieces.tokenizer, train, torch.Generator().manual_seed(cfg.trainer.seed)


def unescaped(text: str) -> str:
    """A command-line separator with its \\n and \\t read as a new line and a tab."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def write_rows(out: Path, rows: list[dict]) -> None:
    out.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))


def peers(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.peers import peer_rows
    from lmrl.loading import load_config

    if a.samples < 1 or (a.rows is not None and a.rows < 1):
        p.error("--samples and --rows must be >= 1")
    cfg = load_config(a.recipe, [*a.overrides, f"model.path={a.model}"])
    engine, tokenizer, train, generator = policy_and_rows(cfg, a.rows)
    rows = peer_rows(cfg, train, engine, tokenizer, a.samples, generator)
    write_rows(a.out, rows)
    print(f"{len(rows)} prompts × {a.samples} peer rollouts written to {a.out}")
    return 0


def checked_config(p: argparse.ArgumentParser, recipe: str, overrides: list[str], check) -> object:
    """The recipe's config with `overrides`, passed through `check(cfg)`; a ConfigError is a usage error."""
    from lmrl.errors import ConfigError
    from lmrl.loading import load_config

    try:
        cfg = load_config(recipe, overrides)
        check(cfg)
    except ConfigError as err:
        p.error(str(err))
    return cfg


def _progress(label: str):
    """A progress bar on stderr (shown on a terminal only), and the console beside it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, disable=not console.is_terminal), console


def teacher_samples(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.teacher_samples import check_teacher_config, teacher_rows

    if a.rows is not None and a.rows < 1:
        p.error("--rows must be >= 1")
    cfg = checked_config(p, a.recipe, [*a.overrides, f"model.path={a.model}"],
                         lambda cfg: check_teacher_config(cfg, a.samples, a.greedy))
    engine, tokenizer, train, generator = policy_and_rows(cfg, a.rows)
    bar, _ = _progress("teacher samples")
    with bar:
        task = bar.add_task("prompts", total=len(train))
        written = teacher_rows(cfg, train, engine, tokenizer, a.samples, generator, a.greedy, a.min_reward,
                               a.drop_truncated, advance=lambda n: bar.advance(task, n))
    if not written.rows:
        p.error(f"no teacher sample was kept: {written.summary()}")
    write_rows(a.out, written.rows)
    print(f"{written.summary()} written to {a.out}")
    return 0


def hints(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.demonstrations import source_params
    from lmrl.data.hints import choose_hints
    from lmrl.loading import load_config

    cfg = load_config(a.recipe, [*a.overrides, "data.demonstrations=hints"])
    if not source_params(cfg).selected:
        p.error("data.source_params.selected names no field to write the chosen indices to")
    engine, tokenizer, train, generator = policy_and_rows(cfg, a.rows)
    rows = choose_hints(cfg, train, engine, tokenizer, a.samples, a.delta, generator)
    write_rows(a.out, rows)
    print(f"{len(rows)} prompts with their chosen hints written to {a.out}")
    return 0


def _records(p: argparse.ArgumentParser, path: Path, what: str) -> list[dict]:
    from lmrl.data.sft import read_records
    from lmrl.envs.tasks import TaskError

    try:
        return list(read_records(str(path), key=what))
    except TaskError as err:
        p.error(str(err))


def _skipped(skipped) -> str:
    return f" ({', '.join(f'{n} {why}' for why, n in sorted(skipped.items()))} skipped)" if skipped else ""


def _written(p: argparse.ArgumentParser, out: Path, rows: list[dict], skipped, what: str, why_none: str) -> int:
    """Write `rows` to `out` and say so (with what was skipped); none at all is an error saying why."""
    if not rows:
        p.error(f"no {what}: {why_none}{_skipped(skipped)}")
    write_rows(out, rows)
    print(f"{len(rows)} {what} written to {out}{_skipped(skipped)}")
    return 0


def hit_counts(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from collections import Counter

    from lmrl.data.hit_counts import hit_count_rows
    from lmrl.loading import load_config

    if a.samples < 1 or (a.rows is not None and a.rows < 1):
        p.error("--samples and --rows must be >= 1")
    cfg = load_config(a.recipe, a.overrides)
    engine, tokenizer, train, generator = policy_and_rows(cfg, a.rows)
    bar, _ = _progress("hit counts")
    with bar:
        task = bar.add_task("facts", total=len(train))
        rows = hit_count_rows(cfg, train, engine, tokenizer, a.samples, generator, lambda n: bar.advance(task, n))
    write_rows(a.out, rows)
    splits = Counter(r["hit_split"] for r in rows)
    print(f"{len(rows)} facts × {a.samples} samples written to {a.out}: "
          + ", ".join(f"{name} {splits[name]}" for name in ("h=0", "1-16", ">16")))
    return 0


def judge_rows(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.judge_rows import grrm_rows_from_pairs, grrm_rows_from_rollouts
    from lmrl.envs.tasks import TaskError

    if (a.rollouts is None) == (a.pairs is None):
        p.error("give one source: --rollouts RUN/rollouts.jsonl or --pairs PAIRS.jsonl")
    try:
        if a.rollouts is not None:
            rows, skipped = grrm_rows_from_rollouts(_records(p, a.rollouts, "--rollouts"), a.seed, a.max_candidates,
                                                    a.max_score, *a.reward_range)
        else:
            rows, skipped = grrm_rows_from_pairs(_records(p, a.pairs, "--pairs"), a.seed, a.chosen_score,
                                                 a.rejected_score, a.max_score), {}
    except (TaskError, ValueError) as err:
        p.error(str(err))
    return _written(p, a.out, rows, skipped, "judge rows", "every group was skipped")


def rubric_rows(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.judge_rows import rubric_rows as make_rows
    from lmrl.envs.tasks import TaskError

    earlier = a.earlier or a.current
    one_run = earlier.resolve() == a.current.resolve()
    try:
        rows, skipped = make_rows(_records(p, a.current, "--current"), _records(p, earlier, "--earlier"), a.seed,
                                  one_run)
    except TaskError as err:
        p.error(str(err))
    return _written(p, a.out, rows, skipped, "rubric rows", "no prompt has a newer and an older reply")


def critic_rows(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.judge_rows import critic_rows_from_rollouts
    from lmrl.envs.tasks import TaskError

    try:
        rows, skipped = critic_rows_from_rollouts(_records(p, a.rollouts, "--rollouts"), a.accuracy, a.k)
    except (TaskError, ValueError) as err:
        p.error(str(err))
    return _written(p, a.out, rows, skipped, "critic rows", "no recorded group was graded")


def steps(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    from lmrl.data.step_labels import label_steps, step_grader

    if any(n is not None and n < 1 for n in (a.prompts, a.solutions, a.k, a.max_steps)):
        p.error("--prompts, --solutions, --k and --max-steps must be >= 1")
    if not a.separator:
        p.error("--separator must not be empty")
    cfg = checked_config(p, a.recipe, [*a.overrides, *([f"model.path={a.model}"] if a.model else [])], step_grader)
    engine, tokenizer, train, generator = policy_and_rows(cfg, a.prompts)
    bar, console = _progress("step labels")
    with bar:
        task = bar.add_task("prompts", total=len(train))
        labelled = label_steps(cfg, train, engine, tokenizer, a.solutions, a.k, a.separator, a.max_steps, a.hard,
                               generator, report=lambda message: console.print(message, markup=False, highlight=False),
                               advance=lambda n: bar.advance(task, n))
    write_rows(a.out, labelled.rows)
    print(f"{labelled.summary()}: written to {a.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lmrl.task_files", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pe = sub.add_parser("peers", help="the recipe's training rows with a peer model's rollouts (PRP)")
    pe.add_argument("recipe")
    pe.add_argument("out", type=Path)
    pe.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. rollout.temperature=0.8")
    pe.add_argument("--model", required=True, help="the peer: a model directory, .gguf file or 'default'")
    pe.add_argument("--samples", type=int, default=4, help="rollouts per prompt")
    pe.add_argument("--rows", type=int, help="only the first ROWS training prompts")
    pe.set_defaults(fn=peers, sub=pe)
    te = sub.add_parser("teacher_samples", help="a teacher's completions of the training prompts as an SFT dataset "
                                                "(sequence-level distillation)")
    te.add_argument("recipe")
    te.add_argument("out", type=Path)
    te.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. rollout.temperature=0.8")
    te.add_argument("--model", required=True, help="the teacher: a model directory, .gguf file or 'default'")
    te.add_argument("--samples", type=int, default=1, help="completions per prompt")
    te.add_argument("--rows", type=int, help="only the first ROWS training prompts")
    te.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling at rollout.temperature")
    te.add_argument("--min-reward", type=float, help="keep only completions the recipe's reward scores at least this "
                                                     "(rejection sampling)")
    te.add_argument("--drop-truncated", action="store_true", help="leave out completions cut at rollout.max_new_tokens")
    te.set_defaults(fn=teacher_samples, sub=te)
    hi = sub.add_parser("hints", help="each training row's knowledge points chosen by the policy (KnowRL)")
    hi.add_argument("recipe")
    hi.add_argument("out", type=Path)
    hi.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. model.path=...")
    hi.add_argument("--samples", type=int, default=8, help="rollouts per prompt and subset")
    hi.add_argument("--delta", type=float, default=0.03, help="accuracy a subset may lose against all points")
    hi.add_argument("--rows", type=int, help="only the first ROWS training prompts")
    hi.set_defaults(fn=hints, sub=hi)
    ju = sub.add_parser("judge_rows", help="GRRM judge prompts with reference scores, to train a judge (grrm_judge)")
    ju.add_argument("out", type=Path)
    ju.add_argument("--rollouts", type=Path, help="a run's RUN/rollouts.jsonl (run.save_rollouts=true)")
    ju.add_argument("--pairs", type=Path, help="a preference dataset: prompt, chosen, rejected")
    ju.add_argument("--max-candidates", type=int, default=4, help="candidates per judge prompt (a seeded choice)")
    ju.add_argument("--reward-range", type=float, nargs=2, default=(0.0, 1.0), metavar=("LOW", "HIGH"),
                    help="recorded rewards mapped linearly onto 0..--max-score")
    ju.add_argument("--max-score", type=int, default=10, help="top of the judge's score scale")
    ju.add_argument("--chosen-score", type=int, default=7, help="--pairs: the chosen reply's reference score")
    ju.add_argument("--rejected-score", type=int, default=3, help="--pairs: the rejected reply's reference score")
    ju.add_argument("--seed", type=int, default=0, help="the candidates' shuffled order")
    ju.set_defaults(fn=judge_rows, sub=ju)
    ru = sub.add_parser("rubric_rows", help="EVOLM rubric prompts with a newer and an older reply (evolm_generator)")
    ru.add_argument("out", type=Path)
    ru.add_argument("--current", type=Path, required=True, help="the current policy's RUN/rollouts.jsonl: y+")
    ru.add_argument("--earlier", type=Path, help="an earlier checkpoint's rollouts.jsonl: y- (default: --current, "
                                                 "its first step against its last)")
    ru.add_argument("--seed", type=int, default=0, help="the choice among a step's replies")
    ru.set_defaults(fn=rubric_rows, sub=ru)
    cr = sub.add_parser("critic_rows", help="GenAC critic prompts with the actor group's success rate (genac_critic)")
    cr.add_argument("out", type=Path)
    cr.add_argument("--rollouts", type=Path, required=True, help="a run's RUN/rollouts.jsonl (run.save_rollouts=true)")
    cr.add_argument("--accuracy", default="answer", help="the reward component whose >= 1 counts as a success")
    cr.add_argument("--k", type=int, default=4, help="recent rollouts of the prompt shown to the critic")
    cr.set_defaults(fn=critic_rows, sub=cr)
    st = sub.add_parser("steps", help="Math-Shepherd step labels of the policy's solutions (a PRM dataset)")
    st.add_argument("recipe")
    st.add_argument("out", type=Path)
    st.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. rollout.temperature=0.8")
    st.add_argument("--model", help="the policy instead of the recipe's model.path: a directory, .gguf or 'default'")
    st.add_argument("--prompts", type=int, help="only the first PROMPTS training prompts")
    st.add_argument("--solutions", type=int, default=4, help="solutions sampled per prompt")
    st.add_argument("--k", type=int, default=4, help="continuations per step prefix (VinePPO uses 9)")
    st.add_argument("--separator", default="\n", type=unescaped,
                    help="the text that ends a step (\\n and \\t read as a new line and a tab)")
    st.add_argument("--max-steps", type=int, help="steps per solution; the ones past it join the last step")
    st.add_argument("--hard", action="store_true", help="label 1 when any continuation is correct (else the mean)")
    st.set_defaults(fn=steps, sub=st)
    hc = sub.add_parser("hit_counts", help="each training fact's hit count in SAMPLES replies, and its split (recall)")
    hc.add_argument("recipe")
    hc.add_argument("out", type=Path)
    hc.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. model.path=...")
    hc.add_argument("--samples", type=int, default=128, help="replies sampled per fact (k)")
    hc.add_argument("--rows", type=int, help="only the first ROWS training facts")
    hc.set_defaults(fn=hit_counts, sub=hc)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return a.fn(a.sub, a)


if __name__ == "__main__":
    sys.exit(main())
