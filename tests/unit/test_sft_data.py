"""SFT and preference datasets: reading, format detection, and the token masks of each format (stages/sft.md).

The assistant mask is checked against transformers' own `return_assistant_tokens_mask` on a template with
`{% generation %}` blocks, and the prefix method on the same template without them must give the same mask."""
from __future__ import annotations

import json
import random
import string
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import make_tokenizer as character_tokenizer
from transformers import PreTrainedTokenizerFast

from lmrl.data.conversations import encode_conversation, prefix_spans
from lmrl.learners.packing import pack_documents
from lmrl.data.sft import (EMPTY, NO_ASSISTANT, NOTHING_LEFT, Records, Skipped, detect_format,
                           encode_pair, encode_records, encode_sft, encode_unpaired, read_records,
                           skipped_summary)
from lmrl.envs.chat import TemplateError, encode_opening
from lmrl.envs.tasks import TaskError
from lmrl.models.default import default_model_dir
from lmrl.types import Origin, collate

NL = "{{ '\\n' }}"
MARKED = (  # ChatML with generation blocks: the reply, its tool calls and <|im_end|> are the assistant's
    "{% for m in messages %}<|im_start|>{{ m['role'] }}" + NL +
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>{% endgeneration %}" + NL +
    "{% else %}{{ m['content'] }}<|im_end|>" + NL + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + NL + "{% endif %}"
)
UNMARKED = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# SmolLM2-135M-Instruct's chat template, as its tokenizer config has it
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2_MARKED = SMOLLM2.replace(
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endif %}")

CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
TOOL_CHAT = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
    {"role": "user", "content": "And 1+1?"},
    {"role": "assistant", "content": "2."},
]
TWO_TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "bye"}, {"role": "assistant", "content": "Bye."}]


def make_tokenizer(template: str | None = MARKED) -> PreTrainedTokenizerFast:
    """One token per printable character, plus the ChatML specials."""
    return character_tokenizer(list(string.printable), template)


def transformers_mask(template: str, messages: list[dict]) -> tuple[list[int], list[int]]:
    out = make_tokenizer(template).apply_chat_template(messages, tokenize=True, return_dict=True,
                                                       return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def trained(tok, ids, mask) -> str:
    return tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)


TOOL_TRAINED = ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
                "It is 5.<|im_end|>2.<|im_end|>")


@pytest.mark.parametrize("messages, text", [(TOOL_CHAT, TOOL_TRAINED), (TWO_TURNS, "Hello!<|im_end|>Bye.<|im_end|>")])
def test_the_mask_is_transformers_assistant_mask_with_and_without_generation_blocks(messages, text):
    expected_ids, expected = transformers_mask(MARKED, messages)
    assert sum(expected) > 0 and trained(make_tokenizer(), expected_ids, expected) == text
    for template in (MARKED, UNMARKED):  # generation blocks read, then the prefix method
        ids, mask = encode_conversation(make_tokenizer(template), messages)
        assert ids == expected_ids and mask == expected


def test_the_prefix_method_on_a_marked_template_gives_its_blocks():
    tok = make_tokenizer(MARKED)
    full, spans = prefix_spans(tok, TOOL_CHAT)
    assert [full[a:b] for a, b in spans] == ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                                             "<|im_end|>", "It is 5.<|im_end|>", "2.<|im_end|>"]


@pytest.mark.parametrize("messages", [TOOL_CHAT[1:2] + [{"role": "assistant", "content": "5"}], TWO_TURNS, TOOL_CHAT])
def test_smollm2_template_prefix_mask_equals_its_marked_variant(messages):
    messages = [m for m in messages if m["role"] != "tool" and "tool_calls" not in m]
    expected_ids, expected = transformers_mask(SMOLLM2_MARKED, messages)
    ids, mask = encode_conversation(make_tokenizer(SMOLLM2), messages)
    assert ids == expected_ids and mask == expected and sum(mask) > 0
    assert make_tokenizer().decode(ids).startswith("<|im_start|>system\n")


def cached_smollm2_tokenizer():
    """The default model's tokenizer when its converted directory is cached (its tokenizer file only)."""
    path = default_model_dir() / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|im_end|>") if path.is_file() else None


def test_smollm2_real_tokenizer_prefix_mask_when_cached():
    tok = cached_smollm2_tokenizer()
    if tok is None:
        pytest.skip("no cached SmolLM2 tokenizer")
    messages = [m for m in TOOL_CHAT if m["role"] != "tool" and "tool_calls" not in m]
    tok.chat_template = SMOLLM2_MARKED
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    tok.chat_template = SMOLLM2
    ids, mask = encode_conversation(tok, messages)
    assert ids == list(out["input_ids"]) and mask == list(out["assistant_masks"])
    assert trained(tok, ids, mask) == "It is 5.<|im_end|>2.<|im_end|>"


def test_a_template_that_rewrites_earlier_turns_is_refused():
    rewriting = UNMARKED.replace("{{ m['content'] }}{% for c", "{{ m['content'] if loop.last else '...' }}{% for c")
    with pytest.raises(TemplateError, match="rewrites earlier turns"):
        encode_conversation(make_tokenizer(rewriting), TWO_TURNS)


def test_messages_sample_prompt_is_everything_before_the_first_assistant_token():
    tok = make_tokenizer(UNMARKED)
    sample = encode_sft({"messages": TOOL_CHAT}, "messages", tok, max_tokens=4096)
    opening = list(tok.apply_chat_template(TOOL_CHAT[:2], add_generation_prompt=True, tokenize=True)["input_ids"])
    assert sample.prompt_ids == opening and sample.origin is Origin.DATASET
    assert sample.behaviour_logprobs == [0.0] * len(sample.completion_ids) and sample.finish_reason == "stop"
    assert sample.input_ids == encode_conversation(tok, TOOL_CHAT)[0]
    assert trained(tok, sample.completion_ids, sample.loss_mask) == TOOL_TRAINED
    assert sample.loss_mask[-1] == 0  # the "\n" after the last <|im_end|>
    assert sample.text.split("\n") == ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                                       "It is 5.", "2."]
    assert sample.row == {"messages": TOOL_CHAT}
    batch = collate([replace(sample, reward=0.0)], [0], tok.pad_token_id)  # the mask reaches the shifted positions
    assert batch.completion_mask.sum().item() == sum(sample.loss_mask)


def test_assistant_only_false_trains_every_token_but_the_first():
    tok = make_tokenizer(UNMARKED)
    sample = encode_sft({"messages": TWO_TURNS}, "messages", tok, max_tokens=4096, assistant_only=False)
    assert len(sample.prompt_ids) == 1 and sample.loss_mask is None
    assert sample.input_ids == encode_conversation(tok, TWO_TURNS)[0]


def test_truncation_keeps_the_start_and_a_row_left_without_trained_tokens_is_skipped():
    tok = make_tokenizer(UNMARKED)
    full = encode_sft({"messages": TWO_TURNS}, "messages", tok, max_tokens=4096)
    width = len(full.prompt_ids) + 3
    cut = encode_sft({"messages": TWO_TURNS}, "messages", tok, max_tokens=width)
    assert cut.input_ids == full.input_ids[:width] and cut.finish_reason == "length"
    assert cut.prompt_ids == full.prompt_ids and cut.loss_mask is None and cut.text == "Hel"
    short = encode_sft({"messages": TWO_TURNS}, "messages", tok, max_tokens=len(full.prompt_ids))
    assert isinstance(short, Skipped) and short.reason == NOTHING_LEFT and not short


def test_rows_without_assistant_turns_are_counted_once_per_reason():
    tok = make_tokenizer(UNMARKED)
    records = [{"messages": TWO_TURNS}, {"messages": TWO_TURNS[:1]}, {"messages": [TWO_TURNS[0], TWO_TURNS[2]]}]
    kept, skipped = encode_records(records, "messages", tok, max_tokens=4096)
    assert len(kept) == 1 and skipped == Counter({NO_ASSISTANT: 2})
    assert skipped_summary(skipped) == "2 rows had no assistant tokens to train on"
    assert skipped_summary(Counter({NOTHING_LEFT: 1}), 64) == "1 row had no trained token within max_tokens=64"


def test_plain_text_prompt_completion_and_text_append_eos():
    tok = make_tokenizer(UNMARKED)
    eos = tok.eos_token_id
    sample = encode_sft({"prompt": "2+2=", "completion": "4"}, "prompt_completion", tok, max_tokens=64)
    assert sample.prompt_ids == tok("2+2=")["input_ids"] and sample.completion_ids == [tok.convert_tokens_to_ids("4"), eos]
    assert sample.loss_mask is None and sample.text == "4"
    text = encode_sft({"text": "abc"}, "text", tok, max_tokens=64)
    assert text.prompt_ids == tok("a")["input_ids"] and text.completion_ids == tok("bc")["input_ids"] + [eos]
    assert text.loss_mask is None
    empty = encode_sft({"prompt": "x", "completion": ""}, "prompt_completion", make_tokenizer(None), 64)
    assert empty.completion_ids == [eos]  # EOS is still trained
    no_eos = make_tokenizer(None)
    no_eos.eos_token = None
    assert encode_sft({"prompt": "x", "completion": ""}, "prompt_completion", no_eos, 64) == Skipped(EMPTY)


def test_conversational_prompt_completion_trains_the_completion_turns_only():
    tok = make_tokenizer(UNMARKED)
    prompt = TWO_TURNS[:3]  # an earlier assistant turn in the prompt is context
    record = {"prompt": prompt, "completion": [{"role": "assistant", "content": "Bye."}]}
    sample = encode_sft(record, "prompt_completion", tok, max_tokens=4096)
    assert sample.prompt_ids == list(tok.apply_chat_template(prompt, add_generation_prompt=True)["input_ids"])
    assert trained(tok, sample.completion_ids, sample.loss_mask) == "Bye.<|im_end|>"
    as_string = encode_sft({"prompt": prompt, "completion": "Bye."}, "prompt_completion", tok, max_tokens=4096)
    assert as_string.input_ids == sample.input_ids and as_string.loss_mask == sample.loss_mask
    whole = encode_sft(record, "prompt_completion", tok, max_tokens=4096, assistant_only=False)
    assert whole.prompt_ids == sample.prompt_ids and whole.loss_mask is None


def test_without_a_chat_template_conversations_use_the_plain_convention():
    tok = make_tokenizer(None)
    ids, mask = encode_conversation(tok, TWO_TURNS)
    assert ids[: mask.index(1)] == encode_opening(tok, TWO_TURNS[:1])
    assert trained(tok, ids, mask) == "Hello!<|im_end|>Bye.<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=False) == "hi\nHello!<|im_end|>\nbye\nBye.<|im_end|>"
    ids, mask = encode_conversation(tok, TOOL_CHAT[1:4] + [TOOL_CHAT[4]])
    assert trained(tok, ids, mask) == ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                                       "<|im_end|>It is 5.<|im_end|>")


def test_tool_schemas_go_to_the_system_message_when_the_template_has_no_tools():
    tok = make_tokenizer(UNMARKED)
    tools = [{"type": "function", "function": {"name": "add"}}]
    sample = encode_sft({"messages": TWO_TURNS, "tools": json.dumps(tools)}, "messages", tok, 4096)
    assert tok.decode(sample.prompt_ids).startswith("<|im_start|>system\nYou can call these tools:\n<tools>\n")
    assert trained(tok, sample.completion_ids, sample.loss_mask) == "Hello!<|im_end|>Bye.<|im_end|>"


PAIR_CASES = {
    "explicit strings": ({"prompt": "sky: ", "chosen": "blue", "rejected": "green"}, "sky: "),
    "implicit strings": ({"chosen": "the sky is blue", "rejected": "the sky is green"}, "the sky is"),
    "explicit messages": ({"prompt": [{"role": "user", "content": "Sky?"}],
                           "chosen": [{"role": "assistant", "content": "Blue."}],
                           "rejected": [{"role": "assistant", "content": "Green."}]},
                          "<|im_start|>user\nSky?<|im_end|>\n<|im_start|>assistant\n"),
    "implicit messages": ({"chosen": TWO_TURNS, "rejected": TWO_TURNS[:3] + [{"role": "assistant", "content": "No."}]},
                          "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                          "<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\n"),
}


@pytest.mark.parametrize("case", list(PAIR_CASES))
def test_pairs_share_identical_prompt_ids(case):
    record, prompt_text = PAIR_CASES[case]
    tok = make_tokenizer(UNMARKED)
    chosen, rejected = encode_pair({**record, "margin": 2}, "preference", tok, max_tokens=4096)
    assert chosen.prompt_ids == rejected.prompt_ids and tok.decode(chosen.prompt_ids) == prompt_text
    assert chosen.info["preference"] == "chosen" and rejected.info["preference"] == "rejected"
    assert chosen.info["margin"] == 2.0 and chosen.origin is Origin.DATASET
    if case.endswith("strings"):
        assert chosen.text.strip() == "blue" and rejected.text.strip() == "green"
        assert chosen.completion_ids[-1] == tok.eos_token_id and chosen.loss_mask is None
    else:
        assert trained(tok, rejected.completion_ids, rejected.loss_mask).endswith("<|im_end|>")


def test_pairs_with_a_common_start_keep_the_prompt_at_the_prompt():
    tok = make_tokenizer(UNMARKED)
    record = {"prompt": [{"role": "user", "content": "Sky?"}], "chosen": "It is blue.", "rejected": "It is green."}
    chosen, rejected = encode_pair(record, "preference", tok, max_tokens=4096)
    assert tok.decode(chosen.prompt_ids).endswith("assistant\n")
    assert trained(tok, chosen.completion_ids, chosen.loss_mask) == "It is blue.<|im_end|>"
    assert "margin" not in chosen.info


def test_pair_errors_and_truncation():
    tok = make_tokenizer(UNMARKED)
    with pytest.raises(TaskError, match="share no prompt"):
        encode_pair({"chosen": "a", "rejected": "b"}, "preference", tok, 64, where="p.jsonl:4")
    with pytest.raises(TaskError, match="p.jsonl:4: field 'margin'"):
        encode_pair({"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}, "preference", tok, 64,
                    where="p.jsonl:4")
    tight = encode_pair({"prompt": "q: ", "chosen": "a", "rejected": "bbbb"}, "preference", tok, max_tokens=5)
    assert tight[0].finish_reason == "stop" and tight[1].finish_reason == "length"
    assert len(tight[1].input_ids) == 5
    assert encode_pair({"prompt": "q: ", "chosen": "a", "rejected": "b"}, "preference", tok, 3) == Skipped(NOTHING_LEFT)


def test_unpaired_rows_carry_their_label():
    tok = make_tokenizer(UNMARKED)
    good = encode_unpaired({"prompt": "2+2=", "completion": "4", "label": True}, tok, 64)
    bad = encode_unpaired({"prompt": [{"role": "user", "content": "2+2?"}], "completion": "5", "label": 0}, tok, 64)
    assert good.info["desirable"] is True and bad.info["desirable"] is False
    assert trained(tok, bad.completion_ids, bad.loss_mask) == "5<|im_end|>"
    with pytest.raises(TaskError, match="label"):
        encode_unpaired({"prompt": "q", "completion": "a", "label": "yes"}, tok, 64)
    kept, _ = encode_records([{"prompt": "q", "completion": "a", "label": False}], "unpaired", tok, 64)
    assert kept[0].info["desirable"] is False


def test_formats_are_detected_and_unknown_shapes_name_keys_and_formats():
    assert detect_format([{"messages": TWO_TURNS}]) == "messages"
    assert detect_format([{"conversations": TWO_TURNS}]) == "messages"
    assert detect_format([{"prompt": "q", "completion": "a"}]) == "prompt_completion"
    assert detect_format([{"text": "abc"}]) == "text"
    assert detect_format([{"chosen": "a", "rejected": "b"}]) == "preference"
    assert detect_format([{"prompt": "q", "chosen": "a", "rejected": "b"}]) == "preference"
    assert detect_format([{"prompt": "q", "completion": "a", "label": True}]) == "unpaired"
    assert detect_format([{"text": "x", "messages": None}]) == "text"  # None fields (datasets fills them) do not count
    with pytest.raises(TaskError, match=r"row 0: no known dataset format has fields \['input', 'output'\]; "
                                        r"accepted: preference \(chosen, rejected\)"):
        detect_format([{"input": "q", "output": "a"}])
    with pytest.raises(TaskError, match="row 1: fields \\['text'\\] are the text format, but the rows before"):
        detect_format([{"messages": TWO_TURNS}, {"text": "a"}])
    assert detect_format([{"text": "a", "messages": TWO_TURNS}], fmt="messages") == "messages"
    with pytest.raises(TaskError, match="format messages needs field"):
        detect_format([{"text": "a"}], fmt="messages")
    with pytest.raises(TaskError, match="unknown dataset format 'sft'"):
        detect_format([{"text": "a"}], fmt="sft")


def test_sharegpt_conversations_are_read_as_messages():
    tok = make_tokenizer(UNMARKED)
    share = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "Hello!"}]
    a = encode_sft({"conversations": share}, "messages", tok, 4096)
    b = encode_sft({"messages": TWO_TURNS[:2]}, "messages", tok, 4096)
    assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_records_name_their_line_in_errors(tmp_path):
    good = json.dumps({"messages": TWO_TURNS})
    records = read_records(str(write_jsonl(tmp_path / "d.jsonl", [good, "", json.dumps({"conversations": TWO_TURNS})])))
    assert isinstance(records, Records) and len(records) == 2 and records.where(1) == f"{tmp_path / 'd.jsonl'}:3"
    assert records[1] == {"conversations": TWO_TURNS} and detect_format(records) == "messages"
    with pytest.raises(TaskError, match=r"bad\.jsonl:2: not valid JSON"):
        read_records(str(write_jsonl(tmp_path / "bad.jsonl", [good, "{oops"])))
    wrong_role = json.dumps({"messages": [{"role": "bot", "content": "x"}]})
    records = read_records(str(write_jsonl(tmp_path / "role.jsonl", [good, wrong_role])))
    with pytest.raises(TaskError, match=r"role\.jsonl:2 field 'messages': message 0 has role 'bot'"):
        encode_records(records, detect_format(records), make_tokenizer(UNMARKED), 4096)
    with pytest.raises(TaskError, match=r"unknown\.jsonl:1: no known dataset format"):
        detect_format(read_records(str(write_jsonl(tmp_path / "unknown.jsonl", ['{"q": 1}']))))
    with pytest.raises(TaskError, match="no such file"):
        read_records(str(tmp_path / "missing.jsonl"))


def test_parquet_and_save_to_disk_records(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"messages": TOOL_CHAT}, {"messages": TWO_TURNS}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    records = read_records(str(tmp_path / "d.parquet"))
    tok = make_tokenizer(UNMARKED)
    kept, skipped = encode_records(records, detect_format(records), tok, 4096)
    expected = [encode_sft(r, "messages", tok, 4096) for r in rows]
    assert not skipped and [s.input_ids for s in kept] == [s.input_ids for s in expected]
    assert [s.loss_mask for s in kept] == [s.loss_mask for s in expected]
    pairs = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "q", "chosen": "a", "rejected": "b"}]),
                                  "test": datasets.Dataset.from_list([{"prompt": "t", "chosen": "c", "rejected": "d"}])})
    pairs.save_to_disk(str(tmp_path / "pairs"))
    test = read_records(str(tmp_path / "pairs"), {"split": "test"})
    assert list(test) == [{"prompt": "t", "chosen": "c", "rejected": "d"}] and detect_format(test) == "preference"
    assert test.where(0).endswith("(split 'test'): row 0")
    with pytest.raises(TaskError, match="no split 'dev'; it has: train, test"):
        read_records(str(tmp_path / "pairs"), {"split": "dev"})


def test_an_uncached_hub_dataset_offline_is_a_clear_error(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    with pytest.raises(TaskError, match="sft.dataset 'org/chats' is not a local path and could not be loaded as a hub "
                                        "dataset.*HF_HUB_OFFLINE=1"):
        read_records("org/chats", key="sft.dataset")


def test_origin_dataset_is_supervised_only():
    assert not Origin.DATASET.sampled and not Origin.DATASET.in_advantage and not Origin.DATASET.brings_logprobs
    assert Origin("dataset") is Origin.DATASET


def test_bfd_packing_matches_trl():
    assert pack_documents([5, 2, 3, 1], 4) == [[0], [2, 3], [1]]  # TRL's pack_dataset docstring example
    with pytest.raises(ValueError, match="at least one token"):
        pack_documents([3, 0], 4)
    trl_data = pytest.importorskip("trl.data_utils")
    datasets = pytest.importorskip("datasets")
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(200)]
    ds = datasets.Dataset.from_dict({"input_ids": [[i] * n for i, n in enumerate(lengths)]})
    packed = trl_data.pack_dataset(ds, seq_length=32, strategy="bfd")
    trl_bins = [sorted(set(row)) for row in packed["input_ids"]]
    ours = pack_documents(lengths, 32)
    assert sorted(sorted(b) for b in ours) == sorted(trl_bins)
    assert all(sum(min(lengths[i], 32) for i in b) <= 32 for b in ours)
