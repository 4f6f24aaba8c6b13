"""lmrl's SFT and DPO stages side by side with TRL's `SFTTrainer` and `DPOTrainer` on the same tiny Llama and the
same records: the token ids and trained tokens lmrl encodes equal those of TRL's dataset preparation, and on one
batch the loss and the gradient of every parameter equal TRL's.

lmrl's side is the real stage (`build_stages` with `algo.preset=sft|dpo` on a JSON-lines file), its batch assembled
and provided as the step loop does it and put through `Learner._backward` with the mini-batch's scale, the update
minus its optimiser step. TRL's side is a real trainer on a copy of the same weights, its own prepared dataset and
collator, and `training_step` (`compute_loss` with `num_items_in_batch` as TRL's training loop counts it, then
backward).

Where the two differ by design, the test asserts the difference and compares on what is defined the same:

- TRL's `assistant_only_loss` reads the template's `{% generation %}` blocks, so TRL gets a marked copy of the
  test's ChatML template that renders the same text. lmrl reads the unmarked template by rendering prefixes and
  trains each reply through its `<|im_end|>`, not the newline the template writes after it. With blocks that hold
  the reply alone (`MARKED`) both train the same tokens; TRL's own training templates put the header's newline and
  the trailing one inside the block (`TRL_STYLE`), and then TRL trains those two newlines of every turn as well.
- TRL's completion-only loss (and DPO's completions) train everything after the prompt's generation header, the
  template's trailing newline included; lmrl stops at `<|im_end|>`. A template that writes the newline before the
  next turn instead of after this one (`SEPARATED`) leaves nothing after `<|im_end|>`, and both agree.
"""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # noqa: E402

from conftest import CHAT_TEMPLATE, make_tokenizer, toy_run_config  # noqa: E402
from lmrl.data.sft import detect_format, encode_pair, encode_sft  # noqa: E402
from lmrl.inputs import provide  # noqa: E402
from lmrl.loops import build_stages  # noqa: E402
from lmrl.loops.batching import to_batch  # noqa: E402
from lmrl.loops.collect import batch_inputs  # noqa: E402
from lmrl.models import tiny_llama  # noqa: E402

NL = "{{ '\\n' }}"  # a newline written by an expression: jinja's trim_blocks drops one that follows a block tag
MARKED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
          "{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}" + NL +
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TRL_STYLE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}{% if m['role'] == 'assistant' %}{% generation %}"
             + NL + "{{ m['content'] }}<|im_end|>" + NL + "{% endgeneration %}{% else %}" + NL +
             "{{ m['content'] }}<|im_end|>" + NL + "{% endif %}{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SEPARATED = ("{% for m in messages %}{% if not loop.first %}" + NL + "{% endif %}<|im_start|>{{ m['role'] }}\n"
             "{{ m['content'] }}<|im_end|>{% endfor %}"
             "{% if add_generation_prompt %}{% if messages %}" + NL + "{% endif %}<|im_start|>assistant\n{% endif %}")
MAX_LENGTH = 128

CHATS = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i} add"},
                       {"role": "assistant", "content": "a7" + "x" * i}, {"role": "user", "content": "again"},
                       {"role": "assistant", "content": "77" + "y" * (3 - i)}]} for i in range(4)]
TEXT_COMPLETIONS = [{"prompt": f"q{i} say 7:", "completion": " 7" + "z" * i} for i in range(4)]
CHAT_COMPLETIONS = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i} say 7"}],
                     "completion": [{"role": "assistant", "content": "7" + "w" * i}]} for i in range(4)]
PAIRS = [{"prompt": [{"role": "user", "content": f"q{i} say 7"}],
          "chosen": [{"role": "assistant", "content": "7" + "k" * i}],
          "rejected": [{"role": "assistant", "content": f"{i}x" + "m" * (2 - i % 3)}]} for i in range(4)]


def tokenizer(template: str = CHAT_TEMPLATE):
    tok = make_tokenizer()
    tok.chat_template = template
    return tok


def weights(tok, seed: int = 0):
    return tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=seed)


def newline_id() -> int:
    return make_tokenizer().convert_tokens_to_ids("\n")


def lmrl_rows(tok, records) -> list[tuple[list[int], list[int]]]:
    """Each record's token ids and trained mask (1 = trained), as lmrl's SFT source encodes it."""
    fmt = detect_format(records)
    rows = []
    for record in records:
        x = encode_sft(record, fmt, tok, MAX_LENGTH)
        mask = x.loss_mask if x.loss_mask is not None else [1] * len(x.completion_ids)
        rows.append((x.prompt_ids + x.completion_ids, [0] * len(x.prompt_ids) + list(mask)))
    return rows


def sft_trainer(tmp_path, tok, records, **config) -> SFTTrainer:
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_length=MAX_LENGTH, report_to=[], use_cpu=True,
                     per_device_train_batch_size=len(records), gradient_checkpointing=False, shuffle_dataset=False,
                     bf16=False, disable_tqdm=True, **config)
    return SFTTrainer(model=weights(tok), args=args, train_dataset=Dataset.from_list(records), processing_class=tok)


def trl_rows(trainer: SFTTrainer) -> list[tuple[list[int], list[int]]]:
    return [(list(r["input_ids"]), [int(label != -100) for label in r["labels"]]) for r in trainer.train_dataset]


def trl_step(trainer) -> tuple[float, dict[str, torch.Tensor]]:
    """TRL's loss and gradients on its whole prepared dataset as one batch, as its training loop computes them."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    items = trainer._get_num_items_in_batch([batch], torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # as `train` sets it
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.training_step(trainer.model, batch, num_items_in_batch=items)
    return float(loss), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}


def lmrl_step(tmp_path, tok, records, preset: str, policy_seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    """lmrl's loss and gradients on every record of a `preset` stage as one batch: the batch the step loop makes,
    through the learner's forward and backward with the mini-batch's scale. The reference (when the stage keeps
    one) is the seed-0 model; the policy then takes the weights of seed `policy_seed`."""
    data = tmp_path / f"{preset}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = toy_run_config(tmp_path, 1, algo={"preset": preset},
                         batches={"dataset": str(data), "size": len(records), "num_eval": 0, "max_tokens": MAX_LENGTH})
    s = build_stages(cfg, model=weights(tok), tokenizer=tok)
    s.learner.model.load_state_dict(weights(tok, policy_seed).state_dict())
    inputs = batch_inputs(s, s.offline.train, step=1)
    batch = to_batch(inputs, s.engine.pad_token_id)
    provide(batch, inputs, with_learner=True)
    s.algorithm.prepare(batch)
    s.learner.model.train()
    s.learner._zero_grads()
    scale = s.algorithm.scale(s.algorithm.aggregation_mask(batch))
    assert s.learner._backward(batch, s.algorithm, scale, {}, {})
    grads = {name: p.grad.clone() for name, p in s.learner.model.named_parameters()}
    return s.learner.evaluate(batch, s.algorithm)["loss"], grads


def assert_same_step(ours, theirs):
    (our_loss, our_grads), (their_loss, their_grads) = ours, theirs
    assert our_loss == pytest.approx(their_loss, rel=1e-5)
    assert our_grads.keys() == their_grads.keys()
    for name, grad in our_grads.items():
        assert grad.abs().sum() > 0, name
        assert torch.allclose(grad, their_grads[name], atol=1e-6, rtol=1e-4), name


def extra_trained(ours, theirs) -> list[int]:
    """The tokens TRL trains and lmrl does not, over all rows (ids equal); none the other way round."""
    extra = []
    for (ids, mask), (their_ids, their_mask) in zip(ours, theirs):
        assert ids == their_ids
        assert not any(m and not t for m, t in zip(mask, their_mask))
        extra += [token for token, m, t in zip(ids, mask, their_mask) if t and not m]
    return extra


def test_sft_messages_encode_as_trl_assistant_only_loss(tmp_path):
    theirs = trl_rows(sft_trainer(tmp_path, tokenizer(MARKED), CHATS, assistant_only_loss=True))
    assert lmrl_rows(tokenizer(), CHATS) == theirs  # lmrl renders prefixes of the unmarked template
    assert lmrl_rows(tokenizer(MARKED), CHATS) == theirs  # or reads the blocks of the marked one
    ids, mask = theirs[0]
    assert make_tokenizer().decode([t for t, m in zip(ids, mask) if m]) == "a7<|im_end|>77yyy<|im_end|>"


def test_trl_style_blocks_also_train_each_turns_two_newlines(tmp_path):
    theirs = trl_rows(sft_trainer(tmp_path, tokenizer(TRL_STYLE), CHATS, assistant_only_loss=True))
    assert extra_trained(lmrl_rows(tokenizer(), CHATS), theirs) == [newline_id()] * (2 * 2 * len(CHATS))


def test_sft_prompt_completion_encodes_as_trl_completion_only_loss(tmp_path):
    text = sft_trainer(tmp_path / "text", tokenizer(), TEXT_COMPLETIONS)
    assert text.completion_only_loss and lmrl_rows(tokenizer(), TEXT_COMPLETIONS) == trl_rows(text)
    separated = sft_trainer(tmp_path / "separated", tokenizer(SEPARATED), CHAT_COMPLETIONS)
    assert lmrl_rows(tokenizer(SEPARATED), CHAT_COMPLETIONS) == trl_rows(separated)
    chatml = sft_trainer(tmp_path / "chatml", tokenizer(), CHAT_COMPLETIONS)  # TRL trains the trailing newline
    assert extra_trained(lmrl_rows(tokenizer(), CHAT_COMPLETIONS), trl_rows(chatml)) == [newline_id()] * 4


def test_sft_messages_loss_and_gradients_equal_trl(tmp_path):
    theirs = trl_step(sft_trainer(tmp_path, tokenizer(MARKED), CHATS, assistant_only_loss=True))
    assert_same_step(lmrl_step(tmp_path, tokenizer(), CHATS, "sft"), theirs)


def test_sft_prompt_completion_loss_and_gradients_equal_trl(tmp_path):
    theirs = trl_step(sft_trainer(tmp_path, tokenizer(), TEXT_COMPLETIONS))
    assert_same_step(lmrl_step(tmp_path, tokenizer(), TEXT_COMPLETIONS, "sft"), theirs)


def dpo_trainer(tmp_path, tok, policy_seed: int = 0) -> DPOTrainer:
    """TRL's DPO with the seed-0 model as its frozen reference and the seed-`policy_seed` one as the policy."""
    model, reference = weights(tok, policy_seed), weights(tok).eval().requires_grad_(False)
    args = DPOConfig(output_dir=str(tmp_path / "trl"), max_length=MAX_LENGTH, report_to=[], use_cpu=True,
                     per_device_train_batch_size=len(PAIRS), gradient_checkpointing=False, bf16=False,
                     disable_tqdm=True, beta=0.1, loss_type=["sigmoid"])
    return DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(PAIRS),
                      processing_class=tok)


def trained(sample) -> list[int]:
    mask = sample.loss_mask or [1] * len(sample.completion_ids)
    return [t for t, m in zip(sample.completion_ids, mask) if m]


def test_dpo_pairs_encode_as_trl_but_for_the_trailing_newline(tmp_path):
    """Same prompt and completion ids; under ChatML TRL trains the newline after `<|im_end|>`, lmrl keeps it
    in the row untrained."""
    for template, untrained in ((SEPARATED, []), (CHAT_TEMPLATE, [newline_id()])):
        tok = tokenizer(template)
        theirs = dpo_trainer(tmp_path / str(len(untrained)), tok).train_dataset
        for record, row in zip(PAIRS, theirs, strict=True):
            chosen, rejected = encode_pair(record, "preference", tok, MAX_LENGTH)
            assert chosen.prompt_ids == rejected.prompt_ids == row["prompt_ids"]
            assert chosen.completion_ids == row["chosen_ids"] and rejected.completion_ids == row["rejected_ids"]
            assert trained(chosen) + untrained == row["chosen_ids"]
            assert trained(rejected) + untrained == row["rejected_ids"]


@pytest.mark.parametrize("policy_seed", [0, 1])
def test_dpo_loss_and_gradients_equal_trl(tmp_path, policy_seed):
    """Policy = reference (a run's first step, loss log 2), and a policy away from its reference."""
    theirs = trl_step(dpo_trainer(tmp_path, tokenizer(SEPARATED), policy_seed))
    ours = lmrl_step(tmp_path, tokenizer(SEPARATED), PAIRS, "dpo", policy_seed)
    assert (ours[0] == pytest.approx(0.693147, abs=1e-5)) == (policy_seed == 0)
    assert_same_step(ours, theirs)
