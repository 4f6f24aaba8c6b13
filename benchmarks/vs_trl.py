"""lmrl against TRL's GRPOTrainer at an identical GRPO workload, side by side, in one invocation.

    python benchmarks/vs_trl.py                     # defaults: 8 prompts x 4 samples, 64 new tokens, 4 steps
    python benchmarks/vs_trl.py --repeats 2 --out results.md

Each side runs in its own child process (so that its peak RSS, `ru_maxrss` of RUSAGE_SELF, is its
own) and both stay alive for the whole run. The parent lets exactly one of them run at a time and
alternates: warm-up (lmrl, then TRL), then blocks of `--block` measured steps, lmrl, TRL, lmrl, TRL…
A child that is not running sits blocked on its stdin between two steps, so the timed steps never
share the CPU with the other side. `--repeats R` repeats the whole thing with fresh processes,
swapping which side goes first each time.

Identical workload: the same model directory, the same prompts in the same order (TRL's dataset is
the exact sequence lmrl's seeded sampler draws, with TRL's shuffling off; the children report the
prompt uids of every step and the parent checks they match), the same chat template and system
prompt, the same reward (lmrl's `answer` logic: final_answer / answers_match),
fp32, β = 0 (no reference model), temperature 1, constant learning rate, one optimiser step per
rollout batch of prompts × group completions.

Measured per step: wall time of the step (rollout + update, from the start of the step to the end of
the optimiser step; logging and checkpointing are outside), generated tokens (EOS included, both
sides), tokens / step time, tokens / rollout time (lmrl: `timing/rollout_s` + `timing/reward_s`, i.e.
generation, decoding and rewards; TRL: its `_generate` + `_calculate_rewards`, the same work), and the RSS
high-water mark of each child at the end of its last measured step.

Protocol between parent and child (internal): the child writes one JSON object per line, prefixed
with `@@vs_trl `, to its real stdout (library output is redirected to stderr) and reads one
command per line from stdin: `go` (run the next step) or `finish` (wind down and exit).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "@@vs_trl "
DEFAULT_PARAMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
                  "allow_parentheses": False, "allow_negation": False}
DEFAULT_SYSTEM = "Solve the problem. End your reply with 'Answer: <number>'."


# ----------------------------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------------------------

def peak_rss_mib() -> float:
    """This process's RSS high-water mark in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def lmrl_overrides(spec: dict) -> list[str]:
    """The dotted overrides that turn the quickstart recipe into the benchmark workload."""
    def kv(key, value):
        return f"{key}={json.dumps(value)}"  # JSON is YAML: strings with ': ' stay strings

    return [
        kv("model.path", spec["model"]),
        kv("task.dataset", spec["dataset"]),
        kv("task.params", spec["task_params"]),
        kv("task.system_prompt", spec["system_prompt"]),
        kv("reward.components", [{"name": "answer", "params": {"fallback": "last_number"}}]),
        kv("reward.accuracy_component", "answer"),
        kv("rollout.prompts_per_step", spec["prompts"]),
        kv("rollout.group_size", spec["group"]),
        kv("rollout.max_new_tokens", spec["max_new_tokens"]),
        kv("rollout.temperature", spec["temperature"]),
        kv("rollout.top_p", 1.0),
        kv("rollout.top_k", 0),
        kv("algo.kl_coef", 0.0),
        kv("trainer.lr", spec["lr"]),
        kv("trainer.steps", spec["warmup"] + spec["steps"]),
        kv("trainer.seed", spec["seed"]),
        kv("trainer.bf16", False),
        kv("eval.at_start", False),
        kv("eval.at_end", False),
        kv("eval.every", 0),
        kv("run.checkpoint_every", 0),
        kv("run.progress", False),
        kv("run.output_dir", spec["workdir"]),
        kv("run.name", "lmrl"),
        *spec["lmrl_overrides"],
    ]


class Channel:
    """The child's end of the protocol: JSON lines out on the real stdout, commands in on stdin."""

    def __init__(self):
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # anything libraries print goes to stderr from here on
        sys.stdout = sys.stderr

    def send(self, **msg) -> None:
        self.out.write(PREFIX + json.dumps(msg) + "\n")
        self.out.flush()

    def wait(self) -> str:
        line = sys.stdin.readline()
        if not line:
            raise SystemExit("vs_trl child: parent went away")
        return line.strip()


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def setup_child(spec: dict) -> Channel:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    chan = Channel()
    import torch

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    return chan


# ----------------------------------------------------------------------------------------------
# lmrl child
# ----------------------------------------------------------------------------------------------

def child_lmrl(spec: dict) -> None:
    chan = setup_child(spec)
    import torch
    import lmrl.loops.loop as step_loop
    from lmrl.config import config_to_yaml
    from lmrl.loading import load_config
    from lmrl.loops.setup import build_stages

    cfg = load_config("quickstart", lmrl_overrides(spec))
    stages = build_stages(cfg)
    step_uids: list[list[str]] = []
    draw = stages.sampler.next_prompts

    def recording_next_prompts(n):
        rows = draw(n)
        step_uids.append([r["uid"] for r in rows])
        return rows

    stages.sampler.next_prompts = recording_next_prompts

    class GatedProgress(step_loop.StepProgress):
        """Blocks between steps (after the step's timing and logging) until the parent says go."""

        def __enter__(self):
            super().__enter__()
            chan.send(event="ready", side="lmrl", info={
                "lmrl": _version("lmrl"), "torch": torch.__version__,
                "threads": torch.get_num_threads(), "config": cfg.model_dump(mode="json")})
            chan.wait()
            return self

        def update(self, step, m):
            super().update(step, m)
            chan.send(event="step", side="lmrl", step=step, step_s=m["timing/step_s"],
                      rollout_s=m["timing/rollout_s"] + m.get("timing/reward_s", 0.0),
                      tokens=round(m["tokens_per_s"] * m["timing/rollout_s"]),
                      reward=m.get("reward/mean"), accuracy=m.get("accuracy"),
                      uids=step_uids[-1] if step_uids else [], rss_mib=peak_rss_mib())
            chan.wait()

    step_loop.StepProgress = GatedProgress
    result = step_loop.train_here(cfg, stages=stages)
    # the numbers of record are those lmrl itself logged to metrics.jsonl
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    steps = [{"step": r["step"], "step_s": r["timing/step_s"],
              "rollout_s": r["timing/rollout_s"] + r.get("timing/reward_s", 0.0),
              "tokens": round(r["tokens_per_s"] * r["timing/rollout_s"]),
              "tokens_from_mean_length": r["response_length/mean"] * spec["prompts"] * spec["group"],
              "reward": r.get("reward/mean"), "accuracy": r.get("accuracy"), "inert_rows": r.get("inert_rows")}
             for r in rows if "timing/step_s" in r]
    if spec.get("save_models"):
        stages.model.save_pretrained(Path(spec["save_models"]) / "lmrl")
        stages.tokenizer.save_pretrained(Path(spec["save_models"]) / "lmrl")
    chan.send(event="done", side="lmrl", steps=steps, final_rss_mib=peak_rss_mib(),
              config_yaml=config_to_yaml(cfg))


# ----------------------------------------------------------------------------------------------
# TRL child
# ----------------------------------------------------------------------------------------------

def trl_config_kwargs(spec: dict) -> dict:
    """GRPOConfig arguments: the benchmark workload plus TRL's fastest settings that run here."""
    batch = spec["prompts"] * spec["group"]
    kwargs = dict(
        output_dir=str(Path(spec["workdir"]) / "trl"),
        max_steps=spec["warmup"] + spec["steps"],
        # one optimiser step = one generation batch = prompts x group completions, in one micro-batch
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        generation_batch_size=batch,
        num_generations=spec["group"],
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",  # lmrl: constant lr (trainer.warmup_steps=0)
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        beta=0.0,  # no KL, no reference model
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        epsilon=0.2,  # lmrl: eps_low = eps_high = 0.2
        use_cpu=True,
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": "float32"},
        use_vllm=False,
        gradient_checkpointing=False,
        disable_dropout=True,
        shuffle_dataset=False,  # the dataset already is lmrl's sampled order
        seed=spec["seed"],
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    for item in spec["trl_args"]:
        import yaml

        key, raw = item.split("=", 1)
        kwargs[key.strip()] = yaml.safe_load(raw)
    return kwargs


def adapt_to_installed_trl(kwargs: dict) -> tuple[dict, dict]:
    """Rename or drop GRPOConfig arguments the installed TRL/transformers does not have.

    Returns the arguments to use and {argument: what happened to it}.
    """
    import dataclasses

    import trl

    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    kwargs, notes = dict(kwargs), {}
    # transformers 5.x renamed gradient_checkpointing (TRL's default: True) to activation_checkpointing
    if "activation_checkpointing" in fields and "gradient_checkpointing" in kwargs:
        kwargs["activation_checkpointing"] = kwargs.pop("gradient_checkpointing")
        notes["gradient_checkpointing"] = "passed as activation_checkpointing (transformers 5 name)"
    if "use_cpu" not in fields and "use_cpu" in kwargs and "no_cuda" in fields:
        kwargs["no_cuda"] = kwargs.pop("use_cpu")
        notes["use_cpu"] = "passed as no_cuda (older transformers)"
    for key in [k for k in kwargs if k not in fields]:
        notes[key] = f"dropped: GRPOConfig has no field {key!r} in TRL {trl.__version__}"
        kwargs.pop(key)
    return kwargs, notes


def child_trl(spec: dict) -> None:
    chan = setup_child(spec)
    import dataclasses

    import datasets
    import torch
    import transformers
    import trl
    from transformers import TrainerCallback

    from lmrl.data import SAMPLERS
    from lmrl.envs import prompt_messages
    from lmrl.envs.pieces import build_pieces
    from lmrl.loading import load_config
    from lmrl.models import resolve_model_path
    from lmrl.rewards.functions import answers_match, final_answer

    P, G = spec["prompts"], spec["group"]
    total = spec["warmup"] + spec["steps"]
    cfg = load_config("quickstart", lmrl_overrides(spec))
    model_dir = resolve_model_path(cfg.model.path)
    pieces = build_pieces(cfg, weights=False)  # TRL loads the model itself, from model_dir
    tokenizer, train_rows = pieces.tokenizer, pieces.train_rows
    sampler = SAMPLERS.get(cfg.data.sampler)(train_rows, seed=cfg.trainer.seed)
    ordered = [row for _ in range(total) for row in sampler.next_prompts(P)]  # exactly lmrl's draws
    dataset = datasets.Dataset.from_list([
        {"prompt": prompt_messages(r, cfg.task.system_prompt), "answer": str(r["answer"]), "uid": r["uid"],
         "question": r["question"]}
        for r in ordered])
    expected_prompt_ids = [list(r["prompt_ids"]) for r in ordered]

    calls: list[dict] = []  # one record per reward call (one per step here)

    def answer(completions, answer, uid, completion_ids, question, **_):
        """lmrl's `answer` reward with fallback=last_number, on TRL's decoded completions."""
        out = []
        for completion, gold, q in zip(completions, answer, question):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            predicted = final_answer(text, fallback="last_number", question=q)
            out.append(float(predicted is not None and answers_match(predicted, str(gold), question=q)))
        seen = []
        for u in uid:
            if not seen or seen[-1] != u:
                seen.append(u)
        calls.append({"tokens": sum(len(ids) for ids in completion_ids), "uids": seen,
                      "reward": sum(out) / len(out)})
        return out

    config_kwargs, config_notes = adapt_to_installed_trl(trl_config_kwargs(spec))
    args = trl.GRPOConfig(**config_kwargs)
    trainer = trl.GRPOTrainer(model=str(model_dir), reward_funcs=[answer], args=args, train_dataset=dataset,
                              processing_class=tokenizer)

    clock = {"rollout_s": 0.0, "prompts_ok": True}
    generate, rewards, single_turn = trainer._generate, trainer._calculate_rewards, trainer._generate_single_turn

    def timed(fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                clock["rollout_s"] += time.perf_counter() - t
        return wrapper

    def checked_single_turn(prompt_ids, *a, **kw):
        step = trainer.state.global_step
        want = expected_prompt_ids[step * P:(step + 1) * P]
        got = [list(p) for p in prompt_ids]
        # TRL repeats each prompt G times before tokenising; lmrl tokenises once and shares it
        clock["prompts_ok"] &= got == [ids for ids in want for _ in range(G)]
        return single_turn(prompt_ids, *a, **kw)

    trainer._generate, trainer._calculate_rewards = timed(generate), timed(rewards)
    trainer._generate_single_turn = checked_single_turn

    settings = {k: v for k, v in dataclasses.asdict(args).items() if k in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
        "steps_per_generation", "num_generations", "num_iterations", "max_completion_length", "learning_rate",
        "lr_scheduler_type", "beta", "temperature", "top_p", "top_k", "epsilon", "epsilon_high", "loss_type",
        "scale_rewards", "importance_sampling_level", "mask_truncated_completions", "use_cpu", "bf16", "fp16",
        "use_vllm", "use_transformers_continuous_batching", "cache_implementation", "gradient_checkpointing",
        "activation_checkpointing",
        "disable_dropout", "optim", "max_grad_norm", "weight_decay", "shuffle_dataset", "seed", "torch_compile",
        "model_init_kwargs")}
    settings = json.loads(json.dumps(settings, default=str))

    class Gate(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            chan.send(event="ready", side="trl", info={
                "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                "datasets": datasets.__version__, "threads": torch.get_num_threads(), "grpo_config": settings,
                "grpo_config_kwargs": json.loads(json.dumps(config_kwargs, default=str)),
                "config_notes": config_notes})
            chan.wait()

        def on_step_begin(self, args, state, control, **kw):
            self.calls_before = len(calls)
            clock["rollout_s"] = 0.0
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - self.t0
            new = calls[self.calls_before:]
            chan.send(event="step", side="trl", step=state.global_step, step_s=step_s,
                      rollout_s=clock["rollout_s"], tokens=sum(c["tokens"] for c in new),
                      reward=sum(c["reward"] for c in new) / max(len(new), 1), accuracy=None,
                      uids=[u for c in new for u in c["uids"]], prompt_tokens_match=clock["prompts_ok"],
                      rss_mib=peak_rss_mib())
            chan.wait()

    trainer.add_callback(Gate())
    trainer.train()
    if spec.get("save_models"):
        trainer.save_model(str(Path(spec["save_models"]) / "trl"))
        tokenizer.save_pretrained(str(Path(spec["save_models"]) / "trl"))
    chan.send(event="done", side="trl", final_rss_mib=peak_rss_mib(),
              logs=[h for h in trainer.state.log_history if "loss" in h])


# ----------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------

class Side:
    def __init__(self, name: str, spec: dict, log_path: Path, verbose: bool):
        self.name, self.log_path = name, log_path
        self.log = None if verbose else log_path.open("w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", name, "--spec", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1, env=env)

    def receive(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                tail = ""
                if self.log is not None:
                    self.log.flush()
                    tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])
                raise RuntimeError(f"{self.name} child exited (rc={self.proc.returncode}) before reporting; "
                                   f"log {self.log_path}:\n{tail}")
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.log is not None:
            self.log.close()


def run_round(spec: dict, order: list[str], verbose: bool, round_no: int) -> dict:
    """One pair of child processes, steps alternating in blocks; returns everything they reported."""
    workdir = Path(spec["workdir"])
    sides = {}
    out = {name: {"steps": [], "info": None, "done": None} for name in order}
    try:
        for name in order:  # load one after the other: peak RSS and load time stay unshared
            sides[name] = Side(name, {**spec, "workdir": str(workdir / f"round{round_no}-{name}")},
                               workdir / f"round{round_no}-{name}.log", verbose)
            ready = sides[name].receive()
            out[name]["info"] = ready["info"]
            print(f"[round {round_no}] {name} ready", flush=True)

        def run_steps(name: str, n: int, warm: bool) -> None:
            for _ in range(n):
                sides[name].send("go")
                msg = sides[name].receive()
                msg["warmup"] = warm
                out[name]["steps"].append(msg)
                tps = msg["tokens"] / msg["step_s"] if msg["step_s"] else float("nan")
                print(f"[round {round_no}] {name:4s} step {msg['step']:>2}{' (warm-up)' if warm else ''}: "
                      f"{msg['step_s']:7.2f} s  {msg['tokens']:5d} tokens  {tps:7.1f} tok/s  "
                      f"rollout {msg['rollout_s']:6.2f} s  reward {msg['reward'] if msg['reward'] is not None else float('nan'):.3f}  "
                      f"peak RSS {msg['rss_mib']:7.0f} MiB", flush=True)

        for name in order:
            run_steps(name, spec["warmup"], warm=True)
        remaining = spec["steps"]
        while remaining > 0:
            n = min(spec["block"], remaining)
            for name in order:
                run_steps(name, n, warm=False)
            remaining -= n
        for name in order:
            sides[name].send("finish")
        for name in order:
            out[name]["done"] = sides[name].receive()
            sides[name].proc.wait(timeout=600)
        if "lmrl" in out:  # lmrl's numbers of record: its own metrics.jsonl (the same values it reported live)
            logged = {s["step"]: s for s in out["lmrl"]["done"]["steps"]}
            for msg in out["lmrl"]["steps"]:
                if msg["step"] in logged:
                    msg.update({k: logged[msg["step"]][k] for k in ("step_s", "rollout_s", "tokens")})
    finally:
        for side in sides.values():
            side.close()
    return out


def summarise(rounds: list[dict], spec: dict, names: list[str]) -> tuple[str, dict]:
    def measured(name):
        return [s for r in rounds for s in r[name]["steps"] if not s["warmup"]]

    stats = {}
    for name in names:
        steps = measured(name)
        times = [s["step_s"] for s in steps]
        tokens = [s["tokens"] for s in steps]
        rollout = [s["rollout_s"] for s in steps]
        rewards = [s["reward"] for s in steps if s["reward"] is not None]
        stats[name] = {
            "steps": len(steps),
            "step_s_median": statistics.median(times),
            "step_s_mean": statistics.fmean(times),
            "step_s_min": min(times),
            "tokens_per_step": statistics.fmean(tokens),
            "tok_s_step": sum(tokens) / sum(times),
            "tok_s_rollout": sum(tokens) / sum(rollout) if sum(rollout) else float("nan"),
            "rollout_share": sum(rollout) / sum(times),
            # RSS high-water mark at the end of the last measured step (checkpoint/exit excluded)
            "peak_rss_mib": max(r[name]["steps"][-1]["rss_mib"] for r in rounds),
            "exit_rss_mib": max(r[name]["done"]["final_rss_mib"] for r in rounds),
            "reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
        }

    same_prompts = None
    prompt_tokens_ok = None
    if set(names) == {"lmrl", "trl"}:
        same_prompts = all([s["uids"] for s in r["lmrl"]["steps"]] == [s["uids"] for s in r["trl"]["steps"]]
                           for r in rounds)
        prompt_tokens_ok = all(s.get("prompt_tokens_match", False) for r in rounds for s in r["trl"]["steps"])

    info = {name: rounds[0][name]["info"] for name in names}
    lines = ["# lmrl vs TRL GRPOTrainer", "", f"`python {' '.join(['benchmarks/vs_trl.py', *sys.argv[1:]])}`", ""]
    lines.append(f"Workload: {spec['model']} · reasoning-gym `{spec['dataset']}` {json.dumps(spec['task_params'])} · "
                 f"{spec['prompts']} prompts × {spec['group']} samples per step · {spec['max_new_tokens']} max new "
                 f"tokens · lr {spec['lr']} · β = 0 · temperature {spec['temperature']} · fp32 · seed {spec['seed']} · "
                 f"{spec['steps']} measured steps after {spec['warmup']} warm-up, alternating in blocks of "
                 f"{spec['block']} · {len(rounds)} round(s)")
    lines.append("")
    first = names[0]
    lines.append(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {info[first].get('torch')}, "
                 f"{info[first].get('threads')} torch threads per side. "
                 + (f"TRL {info['trl']['trl']}, transformers {info['trl']['transformers']}." if "trl" in info else ""))
    if same_prompts is not None:
        lines.append(f"Same prompts (uids) every step on both sides: {'yes' if same_prompts else 'NO'}; "
                     f"TRL prompt token ids identical to lmrl's: {'yes' if prompt_tokens_ok else 'NO'}.")
    lines.append("")
    header = "| metric | " + " | ".join(n if n == "lmrl" else "TRL" for n in names) + \
             (" | lmrl / TRL |" if len(names) == 2 else " |")
    lines += [header, "|---|" + "---:|" * (len(names) + (1 if len(names) == 2 else 0))]
    rows = [
        ("step time, median (s)", "step_s_median", "{:.2f}"),
        ("step time, mean (s)", "step_s_mean", "{:.2f}"),
        ("generated tokens / step", "tokens_per_step", "{:.0f}"),
        ("generated tokens/s (over step time)", "tok_s_step", "{:.1f}"),
        ("generated tokens/s (over rollout time)", "tok_s_rollout", "{:.1f}"),
        ("rollout share of step time", "rollout_share", "{:.0%}"),
        ("peak RSS (MiB)", "peak_rss_mib", "{:.0f}"),
        ("mean reward (sanity)", "reward_mean", "{:.3f}"),
    ]
    for label, key, fmt in rows:
        cells = [fmt.format(stats[n][key]) for n in names]
        ratio = ""
        if len(names) == 2 and key != "rollout_share" and key != "reward_mean":
            ratio = f" {stats['lmrl'][key] / stats['trl'][key]:.2f} |" if stats["trl"][key] else " – |"
        elif len(names) == 2:
            ratio = " |"
        lines.append(f"| {label} | " + " | ".join(cells) + " |" + ratio)
    lines.append("")
    lines.append("Ratios are lmrl / TRL: below 1 is better for step time and memory, above 1 for tokens/s. "
                 "Generated tokens include the EOS token on both sides; sampling differs between the sides, so "
                 "tokens per step differ and tokens/s is the like-for-like throughput. Rollout time is lmrl's "
                 "`timing/rollout_s` + `timing/reward_s` (generation, decoding, rewards) and TRL's `_generate` + "
                 "`_calculate_rewards`.")
    lines.append("")
    lines.append("Per measured step (s / tokens):")
    lines.append("")
    lines.append("| round | step | " + " | ".join(f"{n if n == 'lmrl' else 'TRL'} s | {n if n == 'lmrl' else 'TRL'} tokens"
                                                  for n in names) + " |")
    lines.append("|---|---:|" + "---:|---:|" * len(names))
    for ri, r in enumerate(rounds):
        per = {n: [s for s in r[n]["steps"] if not s["warmup"]] for n in names}
        for i in range(len(per[names[0]])):
            cells = " | ".join(f"{per[n][i]['step_s']:.2f} | {per[n][i]['tokens']}" for n in names)
            lines.append(f"| {ri} | {per[names[0]][i]['step']} | {cells} |")
    if "trl" in info:
        lines.append("")
        lines.append(f"TRL {info['trl']['trl']} `GRPOConfig` (resolved, relevant fields):")
        lines.append("")
        lines.append("```")
        lines += [f"{k} = {v!r}" for k, v in sorted(info["trl"]["grpo_config"].items())]
        lines.append("```")
        for key, note in info["trl"].get("config_notes", {}).items():
            lines.append(f"- `{key}`: {note}")
    if "lmrl" in info:
        c = info["lmrl"]["config"]
        lines.append("")
        lines.append("lmrl settings: `load_config('quickstart', …)` with " +
                     ", ".join(f"{k}={v}" for k, v in [
                         ("algo.advantage", c["algo"]["advantage"]), ("algo.loss", c["algo"]["loss"]),
                         ("algo.aggregation", c["algo"]["aggregation"]), ("algo.kl_coef", c["algo"]["kl_coef"]),
                         ("rollout.engine", c["rollout"]["engine"]), ("trainer.bf16", c["trainer"]["bf16"]),
                         ("trainer.micro_batch_tokens", c["trainer"]["micro_batch_tokens"]),
                         *[(k, v) for k, v in c["trainer"].items() if k == "share_prompt"],
                         ("extra overrides", spec["lmrl_overrides"] or "none")]))
    md = "\n".join(lines) + "\n"
    return md, {"stats": stats, "same_prompts": same_prompts, "prompt_tokens_match": prompt_tokens_ok,
                "info": info, "spec": spec, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="model directory, .gguf, or 'default' (embedded SmolLM2-135M)")
    p.add_argument("--dataset", default="basic_arithmetic", help="reasoning-gym dataset")
    p.add_argument("--task-params", default=json.dumps(DEFAULT_PARAMS), help="reasoning-gym params (JSON)")
    p.add_argument("--system-prompt", default=DEFAULT_SYSTEM)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=4, help="measured steps per side and round")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps per side and round")
    p.add_argument("--block", type=int, default=1, help="consecutive steps a side runs before the other's turn")
    p.add_argument("--repeats", type=int, default=1, help="rounds with fresh processes, first side alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads per side (0: torch's default)")
    p.add_argument("--only", choices=["lmrl", "trl"], help="run one side only")
    p.add_argument("--lmrl-override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra lmrl config override (repeatable), e.g. trainer.micro_batch_tokens=4096")
    p.add_argument("--trl-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra/overriding GRPOConfig argument (repeatable, YAML value), e.g. loss_type=grpo")
    p.add_argument("--out", type=Path, help="also write the markdown summary here")
    p.add_argument("--json", type=Path, help="also write every raw measurement here")
    p.add_argument("--save-models", type=Path, help="save each side's final weights under DIR/lmrl and DIR/trl")
    p.add_argument("--keep", action="store_true", help="keep the temporary run directories and child logs")
    p.add_argument("--verbose", action="store_true", help="show the children's own output")
    p.add_argument("--child", choices=["lmrl", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        spec = json.loads(a.spec)
        (child_lmrl if a.child == "lmrl" else child_trl)(spec)
        return 0

    if a.steps < 1 or a.warmup < 0 or a.block < 1 or a.repeats < 1 or a.group < 2 or a.prompts < 1:
        p.error("need --steps >= 1, --warmup >= 0, --block >= 1, --repeats >= 1, --group >= 2, --prompts >= 1")
    workdir = Path(tempfile.mkdtemp(prefix="lmrl-vs-trl-"))
    spec = {"model": a.model, "dataset": a.dataset, "task_params": json.loads(a.task_params),
            "system_prompt": a.system_prompt, "prompts": a.prompts, "group": a.group,
            "max_new_tokens": a.max_new_tokens, "lr": a.lr, "temperature": a.temperature, "steps": a.steps,
            "warmup": a.warmup, "block": a.block, "seed": a.seed, "threads": a.threads,
            "lmrl_overrides": a.lmrl_override, "trl_args": a.trl_arg, "workdir": str(workdir),
            "save_models": str(a.save_models.resolve()) if a.save_models else None}
    names = [a.only] if a.only else ["lmrl", "trl"]
    print(f"vs_trl: work directory {workdir}", flush=True)
    rounds = []
    try:
        for r in range(a.repeats):
            order = names if r % 2 == 0 else names[::-1]
            rounds.append(run_round(spec, order, a.verbose, r))
        md, raw = summarise(rounds, spec, names)
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(md, end="")
    if a.out:
        a.out.write_text(md)
        print(f"\nwritten to {a.out}")
    if a.json:
        a.json.write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
