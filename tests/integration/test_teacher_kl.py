"""On-policy distillation from a separate teacher (`teacher_kl`): the teacher's log-probs are its own of the
batch's tokens, and the student's reverse KL to it falls when nothing else pulls."""
import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.models import tiny_llama


def teacher_dir(tmp_path):
    tok = make_tokenizer()
    path = tmp_path / "teacher"
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=7).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def constant(sample, **_):
    """A reward every sample gets: GRPO advantages are 0, so only the distillation term trains."""
    return 1.0


def distil_config(tmp_path, steps, teacher):
    from lmrl.rewards import REWARD_FNS

    if "constant_one" not in REWARD_FNS:
        REWARD_FNS.register("constant_one", "the same reward for every sample (tests)")(constant)
    return toy_run_config(tmp_path, steps, reward={"components": [{"name": "constant_one"}],
                                                   "accuracy_component": "constant_one"},
                          algo={"terms": [{"name": "teacher_kl", "params": {"model": str(teacher)}}]})


def test_the_student_moves_toward_its_teacher(tmp_path):
    from lmrl.loops import build_stages, train
    from lmrl.loops.collect import batch_inputs, collect_groups
    from lmrl.loops.batching import to_batch
    from lmrl.inputs import provide

    teacher = teacher_dir(tmp_path)
    cfg = distil_config(tmp_path, 8, teacher)
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    _, kept, _ = collect_groups(stages)
    inputs = batch_inputs(stages, kept, 1)
    batch = to_batch(inputs, stages.engine.pad_token_id)
    provide(batch, inputs, with_learner=True)
    model = stages.algorithm.built["teacher_kl"].model
    row = 0
    ids = batch.input_ids[row: row + 1, : int(batch.attention_mask[row].sum())]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
    own = logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    mask = batch.completion_mask[row, : ids.shape[1] - 1] > 0
    assert torch.allclose(batch.extras["teacher_model_logp"][row, : ids.shape[1] - 1][mask], own[mask], atol=1e-5)

    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    kl = [r["teacher_kl"] for r in rows if "teacher_kl" in r]
    assert len(kl) == 8 and sum(kl[-3:]) / 3 < sum(kl[:3]) / 3


def test_a_teacher_is_required_and_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="params.model"):
        toy_run_config(tmp_path, 1, algo={"terms": [{"name": "teacher_kl"}]})
    with pytest.raises(ConfigError, match="no such file"):
        toy_run_config(tmp_path, 1, algo={"terms": [{"name": "teacher_kl", "params": {"model": "nowhere"}}]})


def chats(path, n=8):
    rows = [{"messages": [{"role": "user", "content": f"q{i % 4}"}, {"role": "assistant", "content": f"a{i % 3}7"}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gkd_is_trls_generalized_jsd_and_the_student_moves_toward_its_teacher(tmp_path):
    """Supervised distillation on a dataset's completions: the gkd term of the first batch equals TRL's
    `generalized_jsd_loss` of the two models' logits, and training lowers it."""
    trl_gkd = pytest.importorskip("trl.experimental.gkd")
    from lmrl.inputs import provide
    from lmrl.loops import build_stages, train
    from lmrl.loops.batching import to_batch
    from lmrl.loops.collect import batch_inputs
    from lmrl.loops.offline import step_groups

    teacher = teacher_dir(tmp_path)
    cfg = toy_run_config(tmp_path, 10, batches={"source": "sft", "dataset": str(chats(tmp_path / "c.jsonl")), "size": 4},
                         algo={"terms": [{"name": "gkd", "params": {"model": str(teacher), "beta": 0.5,
                                                                    "temperature": 0.9}}]}, trainer={"lr": 1e-2})
    tok = make_tokenizer()
    student = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    stages = build_stages(cfg, model=student, tokenizer=tok)
    groups, _ = step_groups(stages.offline, 4, cfg.trainer.seed, 1)
    inputs = batch_inputs(stages, groups, 1)
    batch = to_batch(inputs, stages.engine.pad_token_id)
    provide(batch, inputs, with_learner=True)
    labels = batch.input_ids.clone()
    shifted = torch.full_like(labels, -100)
    shifted[:, 1:] = torch.where(batch.completion_mask > 0, labels[:, 1:], torch.tensor(-100))
    with torch.no_grad():
        s_logits = student(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        t_logits = stages.algorithm.built["gkd"].model(input_ids=batch.input_ids,
                                                       attention_mask=batch.attention_mask).logits
    want = trl_gkd.GKDTrainer.generalized_jsd_loss(s_logits[:, :-1], t_logits[:, :-1], labels=shifted[:, 1:],
                                                   beta=0.5, temperature=0.9)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    jsd = [r["gkd/jsd"] for r in rows if "gkd/jsd" in r]
    assert jsd[0] == pytest.approx(float(want), rel=1e-4)
    assert jsd[-1] < 0.7 * jsd[0]
