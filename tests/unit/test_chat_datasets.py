"""Chat-format prompts (a list of {role, content} messages, TRL / verl style) in jsonl and HF datasets."""
from __future__ import annotations

import json

import pytest

from conftest import make_tokenizer
from lmrl.config import TaskConfig
from lmrl.envs import TaskError, load_task, prepare_data, prompt_messages
from lmrl.envs.single_turn import add_prompt_variants
from lmrl.loading import build_config

SYSTEM = "be brief."
WITH_SYSTEM = [{"role": "system", "content": "you are a calculator."},
               {"role": "user", "content": "what is 2+2?"}]
MULTI_TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello."},
              {"role": "user", "content": "what is 3+3?"}]


def chat_records(n: int = 6) -> list[dict]:
    """Alternating chats with and without a system message; gold answers as numbers (stringified on load)."""
    return [{"prompt": WITH_SYSTEM if i % 2 == 0 else MULTI_TURN, "answer": 4 if i % 2 == 0 else 6, "id": f"r{i}"}
            for i in range(n)]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def expected_ids(tok, messages):
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def check_encoded(tok, rows):
    """Each row's prompt ids are the chat template over its own messages; the system prompt only when absent."""
    assert rows
    for row in rows:
        if row["uid"] in ("r0", "r2", "r4"):
            assert row["prompt_messages"] == WITH_SYSTEM and row["question"] == "what is 2+2?"
            messages = WITH_SYSTEM  # has its own system message: task.system_prompt is not added
        else:
            assert row["prompt_messages"] == MULTI_TURN and row["question"] == "what is 3+3?"
            messages = [{"role": "system", "content": SYSTEM}] + MULTI_TURN
        assert row["prompt_ids"] == expected_ids(tok, messages)
        assert row["answer"] in ("4", "6")
    text = tok.decode(rows[0]["prompt_ids"])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in text


def test_jsonl_chat_prompts_go_through_the_chat_template(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", chat_records())
    cfg = build_config({"task": {"name": "jsonl", "dataset": str(path), "prompt_field": "prompt",
                                 "system_prompt": SYSTEM, "num_eval": 2}, "rollout": {"prompts_per_step": 4}})
    tok = make_tokenizer()
    train, held, _ = prepare_data(cfg, tok)
    assert len(train) == 4 and len(held) == 2
    check_encoded(tok, train + held)


def test_hf_dataset_chat_prompts_from_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = chat_records()
    records[1] = {**records[1], "prompt": [{**MULTI_TURN[0], "name": "ann"}] + MULTI_TURN[1:]}
    datasets.Dataset.from_list(records).save_to_disk(tmp_path / "ds")
    data = load_task(TaskConfig(name="hf_dataset", dataset=str(tmp_path / "ds"), prompt_field="prompt", num_eval=2))
    by_uid = {r["uid"]: r for r in data.train + data.eval}
    # Arrow stores the messages as structs: keys missing from a message come back as None and are dropped
    assert by_uid["r1"]["prompt_messages"][0] == {"role": "user", "content": "hi", "name": "ann"}
    assert by_uid["r3"]["prompt_messages"] == MULTI_TURN

    datasets.Dataset.from_list(chat_records()).save_to_disk(tmp_path / "ds2")
    cfg = build_config({"task": {"name": "hf_dataset", "dataset": str(tmp_path / "ds2"), "prompt_field": "prompt",
                                 "system_prompt": SYSTEM, "num_eval": 2}, "rollout": {"prompts_per_step": 4}})
    tok = make_tokenizer()
    train, held, _ = prepare_data(cfg, tok)
    assert len(train) == 4 and len(held) == 2
    check_encoded(tok, train + held)


def test_text_prompts_are_unchanged():
    row = {"question": "what is 1+1?"}
    assert prompt_messages(row, SYSTEM) == [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": "what is 1+1?"}]
    assert prompt_messages(row, None) == [{"role": "user", "content": "what is 1+1?"}]


def test_chat_prompt_without_chat_template_falls_back_to_plain_text():
    tok = make_tokenizer()
    tok.chat_template = None
    from lmrl.envs import encode_prompt

    ids = encode_prompt(tok, {"question": "what is 3+3?", "prompt_messages": MULTI_TURN}, None)
    assert tok.decode(ids) == "hi\nhello.\nwhat is 3+3?\n"


def test_prompt_variants_append_to_the_last_user_message(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", chat_records(2))
    data = load_task(TaskConfig(name="jsonl", dataset=str(path), prompt_field="prompt", num_eval=0))
    tok = make_tokenizer()
    [row] = [r for r in data.train if r["uid"] == "r1"]
    [out] = add_prompt_variants(tok, [row], ["think."], None)
    [variant] = out["variants"]
    assert variant["question"] == "what is 3+3?\n\nthink."
    assert variant["prompt_messages"][-1] == {"role": "user", "content": "what is 3+3?\n\nthink."}
    assert variant["prompt_messages"][:2] == MULTI_TURN[:2] and row["prompt_messages"] == MULTI_TURN
    assert variant["prompt_ids"] == expected_ids(tok, variant["prompt_messages"])


@pytest.mark.parametrize("prompt,match", [
    ([], r"record 1 field 'prompt': a chat prompt must be a non-empty list"),
    (["what is 2+2?"], r"record 1 field 'prompt': message 0 is str, not a \{role, content\} object"),
    ([{"role": "human", "content": "hi"}],
     r"message 0 has role 'human'; expected one of system, user, assistant, tool"),
    ([{"content": "hi"}], r"message 0 has role None"),
    ([{"role": "user", "content": None}], r"message 0 \(user\) content is missing, not a string"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
     r"message 0 \(user\) content is a list, not a string \(content parts and images are not supported\)"),
    ([{"role": "system", "content": "be brief."}], r"record 1 field 'prompt': the chat prompt has no user message"),
    (MULTI_TURN[:2], r"ends with an assistant message"),
    ({"role": "user", "content": "hi"}, r"record 1 field 'prompt' is a dict; expected prompt text or a list"),
])
def test_malformed_chat_prompts_are_rejected_naming_the_row(tmp_path, prompt, match):
    records = [{"prompt": WITH_SYSTEM, "answer": "4"}, {"prompt": prompt, "answer": "4"}]
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(TaskError, match=match) as err:
        load_task(TaskConfig(name="jsonl", dataset=str(path), prompt_field="prompt", num_eval=0))
    assert str(path) in str(err.value)


def test_missing_prompt_field_suggests_the_field_present(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", chat_records(2))
    with pytest.raises(TaskError, match=r"record 0 lacks field\(s\) \['question'\]; present: \['answer', 'id', "
                                         r"'prompt'\] \(set task.prompt_field=prompt\)"):
        load_task(TaskConfig(name="jsonl", dataset=str(path), num_eval=0))


def test_reserved_field_name_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "hi", "answer": "1", "prompt_messages": []}])
    with pytest.raises(TaskError, match="reserves for chat prompts"):
        load_task(TaskConfig(name="jsonl", dataset=str(path), num_eval=0))
