"""Math-Shepherd step labels (stages §3.2, §6.2): the label rule, the step advantages, where steps end."""
from __future__ import annotations

import pytest

from conftest import make_tokenizer
from lmrl.config import RewardConfig, RewardComponent
from lmrl.algos.mc_step import step_advantages
from lmrl.data.step_labels import step_label
from lmrl.envs.controllers import step_ends
from lmrl.errors import ConfigError
from lmrl.rewards.compute import grader_only


def test_the_spec_label_of_four_outcomes():
    assert step_label([1, 1, 0, 1]) == 0.75
    assert step_label([1, 1, 0, 1], hard=True) == 1.0
    assert step_label([0, 0, 0, 0], hard=True) == 0.0
    assert step_label([0.0, 1.0, 0.0]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        step_label([])


def test_step_advantages_are_differences_of_successive_values():
    assert step_advantages([0.5, 0.75, 1.0]) == pytest.approx([0.25, 0.25])
    assert step_advantages([1.0, 0.25, 0.0]) == pytest.approx([-0.75, -0.25])
    assert step_advantages([0.5]) == []


@pytest.fixture
def chars():
    """The test tokenizer and the ids of a text, one token per character."""
    tok = make_tokenizer(template=None)
    return tok, lambda text: tok.convert_tokens_to_ids(list(text))


def test_a_step_ends_at_the_token_that_completes_the_separator(chars):
    tok, ids = chars
    assert step_ends(ids("ab\ncd\nef"), tok, "\n") == [3, 6, 8]
    # a blank line stays with the step it precedes; the separator ends a step only after some text
    assert step_ends(ids("ab\n\ncd\nef"), tok, "\n") == [3, 7, 9]
    assert step_ends(ids("\n\nab"), tok, "\n") == [4]
    assert step_ends(ids("ab\n\ncd"), tok, "\n\n") == [4, 6]


def test_a_blank_tail_joins_the_last_step(chars):
    tok, ids = chars
    eos = tok.eos_token_id
    assert step_ends([*ids("ab\ncd\n"), eos], tok, "\n") == [3, 7]
    assert step_ends([*ids("ab\ncd\n\n"), eos], tok, "\n") == [3, 8]
    assert step_ends([*ids("ab\ncd"), eos], tok, "\n") == [3, 6]
    assert step_ends([eos], tok, "\n") == [1]
    assert step_ends([], tok, "\n") == [0]


def test_steps_past_the_limit_join_the_last_one(chars):
    tok, ids = chars
    assert step_ends(ids("a\nb\nc\nd"), tok, "\n") == [2, 4, 6, 7]
    assert step_ends(ids("a\nb\nc\nd"), tok, "\n", max_steps=2) == [2, 7]
    assert step_ends(ids("a\nb\nc\nd"), tok, "\n", max_steps=1) == [7]


def test_token_ids_not_text_decide_where_a_step_ends():
    """A token holding the separator with text after it ends the step there: its tokens are the truth."""
    tok = make_tokenizer(["a", "b", "b.\n", "\nc", "\n"], template=None)
    a, b, b_stop, newline_c, newline = (tok.convert_tokens_to_ids(t) for t in ["a", "b", "b.\n", "\nc", "\n"])
    assert step_ends([a, b_stop, a, newline_c, b], tok, "\n") == [2, 4, 5]
    assert step_ends([a, newline, newline, b], tok, "\n") == [2, 4]


def test_the_grader_is_the_accuracy_component_alone():
    cfg = RewardConfig(components=[RewardComponent(name="format", weight=0.2), RewardComponent(name="answer")],
                       aggregation="soft_min", accuracy_component="answer")
    graded = grader_only(cfg)
    assert [c.name for c in graded.components] == ["answer"] and graded.aggregation == "weighted_sum"
    parts = RewardConfig(components=[RewardComponent(name="judge")], accuracy_component="judge/correct")
    assert [c.name for c in grader_only(parts).components] == ["judge"]
    with pytest.raises(ConfigError, match="accuracy_component='answer' is none of the reward components"):
        grader_only(RewardConfig(components=[RewardComponent(name="format")]))
