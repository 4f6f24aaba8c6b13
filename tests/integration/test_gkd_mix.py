"""GKD's student-data fraction λ (`batches.on_policy`, spec §4.1): each step a coin seeded by (seed, step) keeps
the dataset's completions or has the student regenerate them; the choice is a function of the step (a resumed
run makes the same), λ = 0 trains exactly the dataset's batches, λ = 1 the student's own, and the gkd term of an
on-policy step is the generalised JSD of those very tokens."""
import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops.offline import on_policy_fraction, on_policy_step, step_groups
from lmrl.models import tiny_llama
from lmrl.types import Origin

NEW_KEYS = {"train/on_policy", "train/on_policy_fraction"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A teacher (another tiny Llama, same tokenizer) and a chat dataset."""
    root = tmp_path_factory.mktemp("gkd")
    tok = make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=7).save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    rows = [{"messages": [{"role": "user", "content": f"q{i % 4}"}, {"role": "assistant", "content": f"a{i % 3}7"}]}
            for i in range(8)]
    (root / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def gkd_config(tmp_path, files, steps, on_policy=None, **sections):
    batches = {"source": "sft", "dataset": str(files / "c.jsonl"), "size": 4,
               **({} if on_policy is None else {"on_policy": on_policy})}
    sections.setdefault("algo", {"terms": [{"name": "gkd", "params": {"model": str(files / "teacher")}}]})
    return toy_run_config(tmp_path, steps, batches=batches, rollout={"temperature": 0.9}, trainer={"lr": 1e-2},
                          **sections)


def stages_of(cfg):
    from lmrl.loops import build_stages

    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def trained(cfg, resume=None):
    from lmrl.loops import train

    result = train(cfg, resume=resume, stages=stages_of(cfg))
    return [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


def step_rows(rows):
    return {r["step"]: r for r in rows if "gkd/jsd" in r}


def test_the_coin_is_a_function_of_seed_and_step():
    drawn = [on_policy_step(0.5, 3, k) for k in range(1, 2001)]
    assert [on_policy_step(0.5, 3, k) for k in range(2000, 0, -1)] == drawn[::-1]  # order does not matter
    assert drawn != [on_policy_step(0.5, 4, k) for k in range(1, 2001)]
    assert 0.45 < sum(drawn) / 2000 < 0.55 and on_policy_fraction(0.5, 3, 2000) == sum(drawn) / 2000
    assert not any(on_policy_step(0.0, 3, k) for k in range(1, 200))
    assert all(on_policy_step(1.0, 3, k) for k in range(1, 200))


def test_at_lambda_zero_the_steps_are_the_pure_dataset_steps(tmp_path, files):
    pure = step_rows(trained(gkd_config(tmp_path / "pure", files, 3)))
    mixed = step_rows(trained(gkd_config(tmp_path / "mixed", files, 3, on_policy=0.0)))
    timing = {k for r in pure.values() for k in r if k == "time" or "timing" in k or "per_s" in k}
    assert [r["train/on_policy"] for r in mixed.values()] == [0.0] * 3
    assert [r["train/on_policy_fraction"] for r in mixed.values()] == [0.0] * 3
    assert [{k: v for k, v in r.items() if k not in timing | NEW_KEYS} for r in mixed.values()] == \
        [{k: v for k, v in r.items() if k not in timing} for r in pure.values()]


def hand_jsd(student, teacher, groups, beta=0.5, temperature=0.9) -> float:
    """JSD_β of the two models' softmax(z / T) at every completion token of `groups`, row by row, token mean."""
    values = []
    with torch.no_grad():
        for g in groups:
            for x in g.samples:
                ids = torch.tensor([x.prompt_ids + x.completion_ids])
                start = len(x.prompt_ids) - 1  # the position that predicts the first completion token
                end = start + len(x.completion_ids)
                p_s = torch.softmax(student(input_ids=ids).logits[0, start:end] / temperature, -1)
                p_t = torch.softmax(teacher(input_ids=ids).logits[0, start:end] / temperature, -1)
                m = beta * p_t + (1 - beta) * p_s
                kl_t = (p_t * (p_t / m).log()).sum(-1)
                kl_s = (p_s * (p_s / m).log()).sum(-1)
                values += (beta * kl_t + (1 - beta) * kl_s).tolist()
    return sum(values) / len(values)


def test_at_lambda_one_the_student_regenerates_and_gkd_trains_its_tokens(tmp_path, files):
    from lmrl.loops.collect import learn
    from lmrl.loops.offline import OfflineSource

    cfg = gkd_config(tmp_path, files, 2, on_policy=1.0)
    s = stages_of(cfg)
    source = OfflineSource(s)
    taken = source.take(1)
    dataset, _ = step_groups(s.offline, 4, cfg.trainer.seed, 1)
    assert [g.uid for g in taken.kept] == [g.uid for g in dataset]
    for own, data in zip(taken.kept, dataset):
        x, d = own.samples[0], data.samples[0]
        assert (x.origin, d.origin) == (Origin.SAMPLED, Origin.DATASET)
        assert x.prompt_ids == d.prompt_ids and 1 <= len(x.completion_ids) <= cfg.rollout.max_new_tokens
        assert len(x.behaviour_logprobs) == len(x.completion_ids) and all(lp < 0 for lp in x.behaviour_logprobs)
    assert [x.completion_ids for g in taken.kept for x in g.samples] != \
        [x.completion_ids for g in dataset for x in g.samples]
    assert taken.metrics["train/on_policy"] == 1.0 and taken.generated == taken.trained > 0
    want = hand_jsd(s.model, s.algorithm.built["gkd"].model, taken.kept)
    assert learn(s, taken.kept, 1)["gkd/jsd"] == pytest.approx(want, rel=1e-4)


def test_a_resumed_mixed_run_makes_the_same_choices_and_ends_the_same(tmp_path, files):
    from lmrl.loading import load_run_config

    straight = step_rows(trained(gkd_config(tmp_path / "a", files, 6, on_policy=0.5)))
    coins = [float(on_policy_step(0.5, 1, k)) for k in range(1, 7)]
    assert [r["train/on_policy"] for r in straight.values()] == coins and 0.0 < sum(coins) < 6.0
    assert straight[6]["train/on_policy_fraction"] == pytest.approx(sum(coins) / 6)
    trained(gkd_config(tmp_path / "b", files, 3, on_policy=0.5))  # ends with a checkpoint at step 3
    run_dir = tmp_path / "b" / "runs" / "toy"
    resumed_cfg = load_run_config(run_dir, ["trainer.steps=6"])
    resumed = step_rows(trained(resumed_cfg, resume=run_dir))
    keys = ["train/on_policy", "train/on_policy_fraction", "data/trained_tokens", "gkd/jsd"]
    assert sorted(resumed) == sorted(straight) == list(range(1, 7))
    assert [r[k] for r in resumed.values() for k in keys] == pytest.approx(
        [r[k] for r in straight.values() for k in keys], rel=1e-6)


def test_what_a_mixed_source_refuses(tmp_path, files):
    from lmrl.loops.setup import read_offline

    teacher = str(files / "teacher")
    with pytest.raises(ConfigError, match="policy's own samples already"):
        toy_run_config(tmp_path, 1, batches={"on_policy": 0.5},
                       algo={"terms": [{"name": "gkd", "params": {"model": teacher}}]})
    with pytest.raises(ConfigError, match="has no such rows"):
        toy_run_config(tmp_path, 1, batches={"source": "pairs", "dataset": "p.jsonl", "on_policy": 0.5},
                       algo={"preset": "dpo"})
    with pytest.raises(ConfigError, match="'teacher_kl' term's gradient holds on the policy's own samples only"):
        gkd_config(tmp_path, files, 1, on_policy=1.0, algo={"terms": [{"name": "teacher_kl",
                                                                        "params": {"model": teacher}}]})
    with pytest.raises(ConfigError, match="on_policy"):
        gkd_config(tmp_path, files, 1, on_policy=1.5)
    text = tmp_path / "t.jsonl"
    text.write_text("".join(json.dumps({"text": f"row {i} 7"}) + "\n" for i in range(4)))
    cfg = toy_run_config(tmp_path, 1, batches={"source": "sft", "dataset": str(text), "on_policy": 0.5},
                         algo={"terms": [{"name": "nll"}]})
    with pytest.raises(ConfigError, match="text rows .* have no prompt"):
        read_offline(cfg, make_tokenizer(), [], [])
    assert gkd_config(tmp_path, files, 1, on_policy=0.5, algo={"terms": [{"name": "nll"}]}).batches.on_policy == 0.5


def test_the_gkd_recipe_distils_on_the_task_answers_half_of_the_steps_the_students(tmp_path, files):
    from conftest import write_toy_task
    from lmrl.loading import load_config

    toy_run_config(tmp_path, 1)  # registers the toy reward
    cfg = load_config("gkd", [
        "task.name=jsonl", f"task.dataset={write_toy_task(tmp_path / 'toy.jsonl')}", "task.prompt_field=question",
        "task.system_prompt=null", "task.num_eval=4", "task.num_train=32", "batches.size=4", "batches.num_eval=2",
        "reward.components=[{name: contains_7}]", "reward.accuracy_component=contains_7",
        f"algo.terms.gkd.params.model={files / 'teacher'}", "rollout.max_new_tokens=6", "trainer.steps=4",
        "eval.at_start=false", "eval.at_end=false", f"run.output_dir={tmp_path / 'runs'}", "run.progress=false"])
    assert (cfg.batches.source, cfg.batches.on_policy, cfg.rollout.temperature) == ("demonstrations", 0.5, 0.9)
    assert cfg.algo.terms[0].params == {"model": str(files / "teacher"), "beta": 0.5, "temperature": 0.9}
    rows = step_rows(trained(cfg))
    coins = [on_policy_step(0.5, cfg.trainer.seed, k) for k in range(1, 5)]
    assert [bool(r["train/on_policy"]) for r in rows.values()] == coins
    demo = len(make_tokenizer()("Answer: 7")["input_ids"]) + 1  # the reference answer and EOS
    assert [r["data/trained_tokens"] for r in rows.values()] == [24.0 if c else 4.0 * demo for c in coins]
