"""lmrl's SFT and DPO steps against TRL's `SFTTrainer` and `DPOTrainer` on the same data and weights.

    python benchmarks/stages_vs_trl.py                          # a random 23M-parameter Llama, both stages
    python benchmarks/stages_vs_trl.py --stage sft --model PATH --batch 8 --max-length 512 --steps 10

Each side runs in its own child process (its peak memory is its own: the RSS high-water mark, or
`torch.cuda.max_memory_allocated` on CUDA) and both stay alive; the parent lets one step run at a time and
alternates them, lmrl, TRL, lmrl, TRL…, after `--warmup` untimed steps of each, so drifts of the machine hit
both alike. A waiting child sits blocked on its stdin between two steps.

The workload: conversational rows (a system and a user message, then the reply) with a fixed number of words
per message, so every row has the same length on both sides under the default word-level tokenizer; SFT trains
the reply (lmrl's `sft` preset; TRL's default completion-only loss), DPO (sigmoid, β 0.1) compares two replies
against a frozen copy of the initial weights (lmrl's `dpo` preset; TRL's `ref_model` made by TRL itself). The
same batch size (rows, or pairs for DPO) and maximum length, AdamW at a constant learning rate, no weight decay,
grad-norm clip 1.0, float32, no gradient checkpointing on either side.

A step is, for lmrl, what its step loop does with an offline batch (`loops.offline.step_groups`, then
`loops.collect.learn`: batch assembly, the inputs' providers with the reference log-probs, the update with its
optimiser step); for TRL, one step of `Trainer.train` from `on_step_begin` to `on_step_end` (forward, backward,
clip, optimiser and scheduler step). Tokens per step are the tokens of the batch's sequences (padding left out):
prompt and completion of every row, both rows of a pair.

Protocol between parent and child (internal): the child writes JSON lines prefixed `@@stages ` to its real stdout
and reads `go` (one more step) or `finish` from its stdin.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "@@stages "
VOCAB = 4096
SMALL_LLAMA = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8,
                   num_key_value_heads=8, max_position_embeddings=2048, tie_word_embeddings=False)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def peak_memory_mib(cuda: bool) -> float:
    """This process's peak memory in MiB: CUDA memory allocated on CUDA, else the RSS high-water mark."""
    import torch

    if cuda:
        return torch.cuda.max_memory_allocated() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def word_tokenizer():
    """Whitespace word-level tokenizer (`w0` … `wN`) with ChatML's tokens and template; newlines make no token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    words = ["system", "user", "assistant"]
    vocab = {t: i for i, t in enumerate(specials + words)}
    vocab.update({f"w{i}": len(vocab) + i for i in range(VOCAB - len(vocab))})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<pad>",
                                  bos_token="<|im_start|>")
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    tok.chat_template = CHATML
    return tok


def write_model(path: Path) -> Path:
    """The default model: a random Llama of `SMALL_LLAMA`'s shape and its tokenizer, saved at `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), **SMALL_LLAMA)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_data(path: Path, stage: str, rows: int, prompt_words: int, reply_words: int) -> Path:
    """Synthetic conversational rows: SFT prompt/completion, or DPO prompt/chosen/rejected."""
    import random

    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(f"w{rng.randrange(VOCAB - 6)}" for _ in range(n))

    with path.open("w") as f:
        for _ in range(rows):
            prompt = [{"role": "system", "content": text(8)}, {"role": "user", "content": text(prompt_words - 8)}]
            replies = {"completion": [{"role": "assistant", "content": text(reply_words)}]} if stage == "sft" else {
                "chosen": [{"role": "assistant", "content": text(reply_words)}],
                "rejected": [{"role": "assistant", "content": text(reply_words)}]}
            f.write(json.dumps({"prompt": prompt, **replies}) + "\n")
    return path


class Channel:
    """The child's end: JSON lines out on the real stdout (library output goes to stderr), commands in."""

    def __init__(self):
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **msg) -> None:
        self.out.write(PREFIX + json.dumps(msg) + "\n")

    def go(self) -> bool:
        line = sys.stdin.readline().strip()
        if line not in ("go", "finish"):
            raise SystemExit(f"stages_vs_trl child: unexpected command {line!r}")
        return line == "go"


def load(spec: dict):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).to(spec["device"])
    return model, AutoTokenizer.from_pretrained(spec["model"])


def child_lmrl(spec: dict, chan: Channel) -> None:
    import torch
    import yaml

    from lmrl.loading import build_config
    from lmrl.loops import build_stages
    from lmrl.loops.collect import learn
    from lmrl.loops.offline import step_groups

    work = Path(spec["workdir"])
    (work / "task.jsonl").write_text(json.dumps({"question": "w1", "answer": "w1"}) + "\n")
    tree = {
        "recipe": f"bench-{spec['stage']}", "algo": {"preset": spec["stage"]},
        "task": {"name": "jsonl", "dataset": str(work / "task.jsonl"), "system_prompt": None, "num_eval": 0},
        "reward": {"components": [{"name": "answer"}], "accuracy_component": "answer"},
        "rollout": {"prompts_per_step": 1},  # the task is unused: the batches come from batches.dataset
        "batches": {"dataset": spec["data"], "size": spec["batch"], "num_eval": 0, "max_tokens": spec["max_length"]},
        "trainer": {"steps": spec["warmup"] + spec["steps"], "lr": spec["lr"], "bf16": False, "seed": 0,
                    "device": spec["device"], "weight_decay": 0.0, "max_grad_norm": 1.0},
        "eval": {"at_start": False, "at_end": False},
        "run": {"output_dir": str(work / "runs"), "name": "lmrl", "progress": False, "checkpoint_every": 0},
    }
    for override in spec["lmrl_overrides"]:
        key, value = override.split("=", 1)
        section, name = key.split(".", 1)
        tree.setdefault(section, {})[name] = yaml.safe_load(value)
    cfg = build_config(tree)
    model, tokenizer = load(spec)
    s = build_stages(cfg, model=model, tokenizer=tokenizer)
    cuda = s.learner.device.type == "cuda"
    chan.send(event="ready", info={"threads": torch.get_num_threads(), "device": str(s.learner.device)})
    step = 0
    while chan.go():
        step += 1
        t0 = time.perf_counter()
        groups, _ = step_groups(s.offline, spec["batch"], cfg.trainer.seed, step)
        metrics = learn(s, groups, step)
        if cuda:
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
        tokens = sum(len(x.prompt_ids) + len(x.completion_ids) for g in groups for x in g.samples)
        loss = metrics.get("nll", metrics.get("pref/loss"))
        chan.send(event="step", step=step, step_s=step_s, tokens=tokens, loss=loss, memory_mib=peak_memory_mib(cuda))


def child_trl(spec: dict, chan: Channel) -> None:
    import datasets
    import torch
    import trl
    from transformers import TrainerCallback

    model, tokenizer = load(spec)
    cuda = spec["device"] == "cuda"
    common = dict(output_dir=str(Path(spec["workdir"]) / "trl"), max_length=spec["max_length"],
                  per_device_train_batch_size=spec["batch"], gradient_accumulation_steps=1,
                  max_steps=spec["warmup"] + spec["steps"], learning_rate=spec["lr"], lr_scheduler_type="constant",
                  warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=False, bf16=False,
                  use_cpu=not cuda, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                  dataloader_num_workers=0, seed=0)
    data = datasets.load_dataset("json", data_files=spec["data"], split="train")
    if spec["stage"] == "sft":
        trainer = trl.SFTTrainer(model=model, args=trl.SFTConfig(**common), train_dataset=data,
                                 processing_class=tokenizer)
    else:
        trainer = trl.DPOTrainer(model=model, args=trl.DPOConfig(**common, beta=0.1, loss_type=["sigmoid"]),
                                 train_dataset=data, processing_class=tokenizer)
    counted = {"tokens": 0, "loss": None}
    training_step = trainer.training_step

    def counting_step(model, inputs, *args, **kwargs):
        counted["tokens"] += int(inputs["attention_mask"].sum())
        loss = training_step(model, inputs, *args, **kwargs)
        counted["loss"] = float(loss)
        return loss

    trainer.training_step = counting_step

    class Gate(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            chan.send(event="ready", info={"threads": torch.get_num_threads(), "device": str(args.device),
                                           "optim": str(args.optim)})
            if not chan.go():
                raise SystemExit(0)

        def on_step_begin(self, args, state, control, **kw):
            counted["tokens"] = 0
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            chan.send(event="step", step=state.global_step, step_s=time.perf_counter() - self.t0,
                      tokens=counted["tokens"], loss=counted["loss"], memory_mib=peak_memory_mib(cuda))
            if state.global_step < args.max_steps and not chan.go():
                control.should_training_stop = True

    trainer.add_callback(Gate())
    trainer.train()


class Side:
    """A child process of the parent, one side of one stage."""

    def __init__(self, name: str, spec: dict, log: Path):
        self.name, self.log_path, self.log = name, log, log.open("w")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", name, "--spec",
                                      json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        self.proc.wait()
        self.log.flush()
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{self.name} child exited (rc={self.proc.returncode}); log {self.log_path}:\n{tail}")

    def step(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.receive()

    def close(self) -> None:
        try:
            self.proc.stdin.write("finish\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_stage(spec: dict) -> dict[str, list[dict]]:
    """Both sides of one stage, loaded one after the other, their steps alternating; every step's report."""
    sides, steps = {}, {"lmrl": [], "trl": []}
    try:
        for name in ("lmrl", "trl"):
            (Path(spec["workdir"]) / name).mkdir(parents=True)
            sides[name] = Side(name, {**spec, "workdir": str(Path(spec["workdir"]) / name)},
                               Path(spec["workdir"]) / f"{name}.log")
            print(f"[{spec['stage']}] {name} ready: {sides[name].receive()['info']}", flush=True)
        for i in range(spec["warmup"] + spec["steps"]):
            for name in ("lmrl", "trl"):
                msg = sides[name].step()
                msg["warmup"] = i < spec["warmup"]
                steps[name].append(msg)
                print(f"[{spec['stage']}] {name:4s} step {i + 1}{' (warm-up)' if msg['warmup'] else ''}: "
                      f"{msg['step_s']:6.2f} s  {msg['tokens']} tokens  {msg['tokens'] / msg['step_s']:8.1f} tok/s  "
                      f"loss {msg['loss']:.4f}  peak {msg['memory_mib']:.0f} MiB", flush=True)
    finally:
        for side in sides.values():
            side.close()
    return steps


def summary(stage: str, steps: dict[str, list[dict]]) -> dict[str, float]:
    out = {}
    for name, rows in steps.items():
        timed = [r for r in rows if not r["warmup"]]
        out[f"{name}_tok_s"] = sum(r["tokens"] for r in timed) / sum(r["step_s"] for r in timed)
        out[f"{name}_step_s"] = statistics.median(r["step_s"] for r in timed)
        out[f"{name}_tokens"] = statistics.mean(r["tokens"] for r in timed)
        out[f"{name}_memory_mib"] = rows[-1]["memory_mib"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=["sft", "dpo", "both"], default="both")
    p.add_argument("--model", help="a transformers model directory (default: a random Llama built here)")
    p.add_argument("--batch", type=int, default=4, help="rows per step (pairs for DPO)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=48)
    p.add_argument("--reply-words", type=int, default=48)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=0, help="torch threads per side (0: torch's default)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--lmrl-override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a setting of lmrl's config, e.g. trainer.share_prompt=false (repeatable)")
    p.add_argument("--child", choices=["lmrl", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        (child_lmrl if a.child == "lmrl" else child_trl)(json.loads(a.spec), Channel())
        return 0

    import torch
    import transformers
    import trl

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="stages_vs_trl-") as tmp:
        work = Path(tmp)
        model = a.model or str(write_model(work / "model"))
        params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(model).parameters())
        print(f"model {a.model or 'random Llama ' + json.dumps(SMALL_LLAMA)}: {params / 1e6:.1f}M parameters; "
              f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; device {device}", flush=True)
        results = {}
        for stage in (["sft", "dpo"] if a.stage == "both" else [a.stage]):
            data = write_data(work / f"{stage}.jsonl", stage, 8 * a.batch * (a.warmup + a.steps), a.prompt_words,
                              a.reply_words)
            spec = {"stage": stage, "model": model, "data": str(data), "batch": a.batch, "max_length": a.max_length,
                    "warmup": a.warmup, "steps": a.steps, "lr": a.lr, "threads": a.threads, "device": device,
                    "lmrl_overrides": a.lmrl_override, "workdir": str(work / stage)}
            Path(spec["workdir"]).mkdir()
            results[stage] = summary(stage, run_stage(spec))
    memory = "peak CUDA memory allocated" if device == "cuda" else "peak RSS"
    print(f"\n| stage | lmrl tok/s | TRL tok/s | lmrl / TRL tok/s | lmrl step s | TRL step s | tokens/step "
          f"(lmrl, TRL) | lmrl {memory} MiB | TRL {memory} MiB | memory lmrl / TRL |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for stage, r in results.items():
        print(f"| {stage} | {r['lmrl_tok_s']:.0f} | {r['trl_tok_s']:.0f} | {r['lmrl_tok_s'] / r['trl_tok_s']:.2f} | "
              f"{r['lmrl_step_s']:.2f} | {r['trl_step_s']:.2f} | {r['lmrl_tokens']:.0f}, {r['trl_tokens']:.0f} | "
              f"{r['lmrl_memory_mib']:.0f} | {r['trl_memory_mib']:.0f} | "
              f"{r['lmrl_memory_mib'] / r['trl_memory_mib']:.2f} |")
    print(f"\n{a.batch} {'pairs' if a.stage == 'dpo' else 'rows (pairs for DPO)'} per step, max length "
          f"{a.max_length}, {a.warmup} warm-up + {a.steps} timed steps per side, alternating; step times are medians, "
          "tok/s the timed steps' tokens over their time.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
