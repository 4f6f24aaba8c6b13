"""HindSearch-style distillation in the training loop: tool-use episodes, a tiny model as the critique judge."""
import json
import math

from conftest import make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.serve import ChatService


class ServedJudge:
    """A judge answered by a real tiny model through `lmrl serve`'s chat-completion service (sampled)."""

    def __init__(self, service: ChatService):
        self.service, self.calls = service, 0

    def chat(self, messages, **_):
        self.calls += 1
        reply = self.service.complete({"messages": messages, "max_tokens": 12, "seed": self.calls})
        return reply["choices"][0]["message"]["content"]


def test_tool_use_trains_with_hindsight_critique_distillation(tmp_path):
    data = tmp_path / "mul.jsonl"
    data.write_text("".join(json.dumps({"question": f"what is {a} times 3?", "answer": str(3 * a)}) + "\n"
                            for a in range(20, 40)))
    cfg = toy_run_config(tmp_path, 2, dataset=data,
                         env={"name": "tool_use", "params": {"tools": ["calculator"]}, "max_turns": 2,
                              "max_episode_tokens": 200},
                         reward={"components": [{"name": "answer"}, {"name": "env"}], "accuracy_component": "answer"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
                         algo={"terms": [{"name": "distill", "coef": 0.1,
                                          "params": {"context": "hindsight_critique"}}]})
    tok = make_tokenizer()
    judge = ServedJudge(ChatService(tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=1), tok))
    cfg.algo.terms[0].params["context_params"] = {"judge": judge}  # after build_config, which copies its tree
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2
    failed = sum(round((1 - r["accuracy"]) * 8 * (1 - r["excluded"])) for r in steps)
    assert judge.calls == failed > 0  # one critique per failed episode
    assert all(0 < r["distill/samples"] <= 1 and math.isfinite(r["distill/kl"]) for r in steps)
    assert all(math.isfinite(r["grad_norm"]) for r in steps)
