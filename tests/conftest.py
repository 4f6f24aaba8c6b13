"""Shared test helpers: a character-level tokenizer with a chat template, tiny random models, toy tasks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lmrl.models import tiny_llama

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 :+-=?.'<>\n")
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(chars: list[str] = CHARS, template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per character of `chars` (and the ChatML specials), with the chat template `template`."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(chars) + ["<unk>"])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|im_start\|>|<\|im_end\|>|<pad>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<pad>",
                                  bos_token="<|im_start|>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.chat_template = template
    return tok


@pytest.fixture
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    return tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=2, heads=4, seed=0)


class ScriptedJudge:
    """A stand-in for JudgeClient: `respond(prompt_text, request_fields)` gives each reply; calls are recorded."""

    def __init__(self, respond):
        self.respond, self.calls = respond, []

    def chat(self, messages, **fields):
        self.calls.append((messages[-1]["content"], fields))
        return self.respond(messages[-1]["content"], fields)

    def chat_many(self, conversations, per_call=None, **fields):
        extras = per_call or [{}] * len(conversations)
        return [self.chat(c, **fields, **(extra or {})) for c, extra in zip(conversations, extras)]


def write_toy_task(path: Path, n: int = 64) -> Path:
    """Prompts 'say 7' with gold answer 7: a toy task a random model can learn in seconds."""
    rows = [{"question": f"q{i % 10} say 7", "answer": "7"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def contains_seven(sample, **_):
    """Toy reward of the tiny-model training tests: 1 if the completion contains a '7'."""
    return float("7" in sample.text)


TOY_REWARD_FILE = '''
def contains_seven(sample, **_):
    return float("7" in sample.info["text"])
'''


def save_tiny_model(path: Path, tok=None) -> Path:
    """The tiny Llama and its tokenizer (`make_tokenizer()` unless given) as a transformers directory at `path`
    (for `model.path=`)."""
    tok = tok or make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def tiny_model_dir(tmp_path):
    return save_tiny_model(tmp_path / "model")


def toy_run_on_disk(tmp_path: Path) -> dict:
    """The toy run's model and reward as files, for runs in other processes (Ray actors, torchrun ranks)
    that cannot see objects registered in this one: config sections for `toy_run_config`."""
    model_dir = save_tiny_model(tmp_path / "model")
    (tmp_path / "toy_reward.py").write_text(TOY_REWARD_FILE)
    name = f"{tmp_path / 'toy_reward.py'}:contains_seven"
    return {"model": {"path": str(model_dir)}, "reward": {"components": [{"name": name}], "accuracy_component": name}}


def toy_run_config(tmp_path, steps, dataset=None, num_eval=8, num_train=56, **sections):
    """The tiny-model training config shared by the integration tests; `sections` update its sections."""
    from lmrl.loading import build_config
    from lmrl.rewards import REWARD_FNS

    if "contains_7" not in REWARD_FNS:
        REWARD_FNS.register("contains_7", "toy reward for tests")(contains_seven)
    tmp_path.mkdir(parents=True, exist_ok=True)
    tree = {
        "recipe": "toy",
        "task": {"name": "jsonl", "dataset": str(dataset or write_toy_task(tmp_path / "toy.jsonl")),
                 "system_prompt": None, "num_eval": num_eval, "num_train": num_train},
        "reward": {"components": [{"name": "contains_7"}], "accuracy_component": "contains_7"},
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 6},
        "trainer": {"steps": steps, "lr": 3e-3, "bf16": False, "seed": 1},
        "eval": {"at_start": False, "at_end": False},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "toy", "progress": False, "checkpoint_every": 0},
    }
    for section, values in sections.items():
        tree.setdefault(section, {}).update(values)
    return build_config(tree)


def train_tiny(cfg) -> tuple[list[dict], object]:
    """Train `cfg` (a `toy_run_config`) on a fresh tiny Llama: the logged rows of its steps, and its stages."""
    rows, stages = run_tiny(cfg)
    return [r for r in rows if "reward/mean" in r], stages


def run_tiny(cfg, resume=None) -> tuple[list[dict], object]:
    """Train `cfg` on a fresh tiny Llama (continuing the run directory `resume`): every row it logged (steps and
    evaluations), and its stages."""
    from lmrl.loops import build_stages, train

    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, resume=resume, stages=stages)
    return [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()], stages


class LocalServer:
    """A threaded HTTP server on a free local port serving `handler` (the tests' fake endpoints); `url` is its
    OpenAI-style base URL (…/v1)."""

    def __init__(self, handler):
        import threading
        from http.server import ThreadingHTTPServer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
