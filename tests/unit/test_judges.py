"""Judge rewards with a scripted judge: the spec's hand-computed values, parsing, and failure handling."""
import math

import pytest

from conftest import ScriptedJudge
from lmrl.config import RewardComponent, RewardConfig
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_FNS, RewardScorer
from lmrl.rewards.judge_client import JudgeClient, JudgeError, JudgeResponseError
from lmrl.rewards.judge_scoring import (break_preference_cycles, evolm_generator_reward, grrm_ranking_reward, grrm_rm_reward,
                                        grrm_score_reward, majority, overlong_penalty, parse_criteria, rubric_score,
                                        token_f1)
from lmrl.types import Group, Sample


def sample(text, question="Explain tides.", n_tokens=4, **row):
    return Sample(prompt_ids=[1], completion_ids=[0] * n_tokens, behaviour_logprobs=[0.0] * n_tokens,
                  text=text, row={"question": question, "answer": "", **row})


SPEC_CRITERIA = [{"criterion": "mentions c5", "weight": 5}, {"criterion": "mentions c3", "weight": 3},
                 {"criterion": "mentions c1", "category": "optional"}]
PITFALL = {"criterion": "makes mistake p2", "category": "pitfall"}


def per_criterion_judge(met: set[str]):
    return ScriptedJudge(lambda text, _: "Verdict: " + ("yes" if any(f"Criterion: mentions {m}" in text or
                                                                     f"Criterion: makes mistake {m}" in text
                                                                     for m in met) else "no"))


def test_explicit_rubric_spec_values_per_criterion():
    judge = per_criterion_judge({"c5", "c1"})
    assert REWARD_FNS.get("judge_rubric")(criteria=SPEC_CRITERIA, judge=judge)(sample("r")) == pytest.approx(6 / 9)
    assert len(judge.calls) == 3  # one call per criterion
    with_pitfall = REWARD_FNS.get("judge_rubric")(criteria=SPEC_CRITERIA + [PITFALL], judge=per_criterion_judge({"c5", "c1", "p2"}))
    assert with_pitfall(sample("r")) == pytest.approx(6 / 9 - 2 / 9) == pytest.approx(0.444, abs=1e-3)
    untriggered = REWARD_FNS.get("judge_rubric")(criteria=SPEC_CRITERIA + [PITFALL], judge=per_criterion_judge({"c5", "c1"}))
    assert untriggered(sample("r")) == pytest.approx(6 / 9)


def test_explicit_rubric_all_at_once():
    judge = ScriptedJudge(lambda text, _: "Reasoning...\n1: yes\n2: no\n3: yes\n4: yes")
    reward = REWARD_FNS.get("judge_rubric")(criteria=SPEC_CRITERIA + [PITFALL], judge=judge, ask="all_at_once")
    assert reward(sample("r")) == pytest.approx(4 / 9)
    assert len(judge.calls) == 1 and "4. makes mistake p2" in judge.calls[0][0] and "Explain tides." in judge.calls[0][0]


def test_variance_aware_variants():
    weights, hits = [5, 3, 1, -2], [1, 0, 1, 1]
    p = (5 + 1 - 2) / 11
    assert rubric_score(weights, hits, "complexity", beta=0.5) == pytest.approx(p * (1 + 0.5 * math.log(4)))
    assert rubric_score(weights, hits, "hybrid", eta=0.5) == pytest.approx(0.5 * p)
    assert rubric_score([5, 3, -2], [1, 1, 0], "hybrid", eta=0.5) == pytest.approx(0.5 * 8 / 10 + 0.5)
    reward = REWARD_FNS.get("judge_rubric")(criteria=SPEC_CRITERIA + [PITFALL], judge=per_criterion_judge({"c5", "c1", "p2"}),
                                            variant="complexity", beta=0.5)
    assert reward(sample("r")) == pytest.approx(0.6157, abs=1e-4)


def test_criteria_parsing_and_errors():
    parsed = parse_criteria(["plain", {"criterion": "e", "category": "Essential"},
                             {"criterion": "written as success", "weight": -1, "satisfied_is_bad": False}])
    assert [(c.weight, c.satisfied_is_bad) for c in parsed] == [(1.0, False), (5.0, False), (-1.0, False)]
    for bad in ([], [{"weight": 2}], [{"criterion": "x", "category": "vital"}], [{"criterion": "x", "weight": -1}]):
        with pytest.raises(ValueError):
            parse_criteria(bad)
    with pytest.raises(ValueError, match="variant"):
        REWARD_FNS.get("judge_rubric")(criteria=["x"], judge=per_criterion_judge(set()), variant="fancy")


def test_pitfall_written_as_success_counts_when_unmet():
    crit = [{"criterion": "mentions c5", "weight": 5}, {"criterion": "mentions safety", "weight": -2, "satisfied_is_bad": False}]
    reward = REWARD_FNS.get("judge_rubric")(criteria=crit, judge=per_criterion_judge({"c5"}))
    assert reward(sample("r")) == pytest.approx((5 - 2) / 5)


def test_implicit_rubric_normalises_likert():
    judge = ScriptedJudge(lambda text, _: "Good but thin. Score: 7")
    reward = REWARD_FNS.get("judge_rubric_implicit")(rubric="accurate and brief", judge=judge)
    assert reward(sample("r")) == pytest.approx(6 / 9)
    assert "accurate and brief" in judge.calls[0][0]
    listed = REWARD_FNS.get("judge_rubric_implicit")(rubric=["is accurate", "is brief"], judge=judge, low=0, high=10)
    assert listed(sample("r")) == pytest.approx(0.7)
    assert "- is accurate\n- is brief" in judge.calls[-1][0]


def test_self_rubric_generates_once_per_prompt():
    generator = ScriptedJudge(lambda text, _: "<think>hmm</think>- cites the moon")
    judge = ScriptedJudge(lambda text, _: "Score: 8" if "cites the moon" in text else "Score: 1")
    reward = REWARD_FNS.get("judge_self_rubric")(judge=judge, generator=generator)
    assert [reward(sample(t)) for t in ("a", "b")] == [pytest.approx(7 / 9)] * 2
    assert len(generator.calls) == 1 and reward.rubrics["Explain tides."] == "- cites the moon"
    assert evolm_generator_reward(0.8, 0.5) == 1.0
    assert evolm_generator_reward(0.8, 0.5, margin=True) == pytest.approx(0.3)
    assert evolm_generator_reward(0.5, 0.8) == 0.0


def test_flip_token_f1_spec_value():
    assert token_f1("Write a haiku about the sea.", "Write a short poem about the sea") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("a b", "c") == 0.0
    reply = ('<think>It is a poem.</think>```json\n{"REASONING": "a haiku", '
             '"INFERRED INSTRUCTION": "Write a haiku about the sea."}\n```')
    judge = ScriptedJudge(lambda text, _: reply)
    reward = REWARD_FNS.get("judge_flip")(judge=judge)
    s = sample("Waves fold on the shore", question="Write a short poem about the sea",
               messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "Write a short poem about the sea"}])
    assert reward(s) == pytest.approx(2 / 3)
    shown = judge.calls[0][0]
    assert "user: hi\nassistant: hello" in shown and "Write a short poem" not in shown and "Waves fold" in shown


def test_flip_falls_back_to_raw_text_when_json_fails():
    reward = REWARD_FNS.get("judge_flip")(judge=ScriptedJudge(lambda text, _: "Write a haiku about the sea."))
    assert reward(sample("w", question="Write a short poem about the sea")) == pytest.approx(2 / 3)


def test_dynamic_rubric_spec_values():
    items = '[{"criterion": "item one", "weight": 3}, {"criterion": "item two", "weight": 1}]'

    def respond(text, _):
        if "Write at most" in text:
            return "Here you go:\n" + items
        return "1: yes\n2: yes" if "Response:\nAAA" in text else "1: no\n2: yes"

    judge = ScriptedJudge(respond)
    rewards = GROUP_REWARD_FNS.get("judge_dynamic_rubric")(judge=judge)([sample("AAA"), sample("BBB")])
    assert rewards == [pytest.approx(1.0), pytest.approx(0.25)]
    assert rewards[0] - rewards[1] == pytest.approx(0.75)
    assert "Response A:\nAAA" in judge.calls[0][0] and "Response B:\nBBB" in judge.calls[0][0]
    bad = GROUP_REWARD_FNS.get("judge_dynamic_rubric")(judge=ScriptedJudge(lambda t, _: "no list here"))
    with pytest.raises(JudgeResponseError, match="criteria"):
        bad([sample("a"), sample("b")])


def test_grrm_joint_scoring():
    judge = ScriptedJudge(lambda text, _: "A is best, then C.\nRanking: A > C > B\nA: 8, B: 3, C: 5")
    reward = GROUP_REWARD_FNS.get("judge_grrm")(judge=judge)
    group = [sample("x"), sample("y"), sample("x"), sample("z", n_tokens=3072), sample("  ")]
    assert reward(group) == pytest.approx([0.08, 0.03, 0.08, 0.05 - 0.02, -0.04])
    assert len(judge.calls) == 1 and judge.calls[0][0].count("Response ") == 3  # duplicates and blanks dropped
    assert reward([sample("x"), sample("x")]) == [-0.04, -0.04]  # < 2 unique candidates: default reward
    assert len(judge.calls) == 1
    garbled = ScriptedJudge(lambda text, _: "A is better")
    with pytest.raises(JudgeResponseError):
        GROUP_REWARD_FNS.get("judge_grrm")(judge=garbled)([sample("x"), sample("y")])
    lenient = GROUP_REWARD_FNS.get("judge_grrm")(judge=garbled, on_parse_error="default")
    assert lenient([sample("x"), sample("y")]) == [-0.04, -0.04]


def test_grrm_rm_reward_spec_values():
    assert grrm_ranking_reward("A > B = C", {"A": 9, "B": 5, "C": 4}) == pytest.approx(2 / 3)
    pred, ref = {"A": 8, "B": 5, "C": 5}, {"A": 9, "B": 5, "C": 4}
    assert grrm_score_reward(pred, ref) == pytest.approx((0.6 + 0.2 + 0.6) / 3)
    assert grrm_rm_reward("A > B = C", pred, ref) == pytest.approx(2 / 3 + 1.4 / 3)
    assert grrm_rm_reward("A > B > C", pred, ref) == 0.0  # score line contradicts the ranking line
    assert overlong_penalty(2048, 4096, 2048, 0.04) == 0.0 and overlong_penalty(5000, 4096, 2048, 0.04) == 0.04


def pairwise_judge(order: str, calls_log=None):
    """Prefers the response whose text comes first in `order`."""

    def respond(text, _):
        a = text.split("Response A:\n")[1].split("\n\n")[0]
        b = text.split("Response B:\n")[1].split("\n\n")[0]
        return "Winner: " + ("A" if order.index(a) < order.index(b) else "B")

    return ScriptedJudge(respond)


def test_rrc_self_competitive_spec_values():
    judge = pairwise_judge("ABC")
    reward = GROUP_REWARD_FNS.get("judge_rrc")(judge=judge, alpha=0.5)
    assert reward([sample("A"), sample("B"), sample("C")]) == [1.0, 0.5, 0.0]  # (2, 1, 0)·α
    assert len(judge.calls) == 3
    assert majority(["A", "A", "B"]) == "A" and majority(["A", "B"]) is None


def test_rrc_votes_swap_positions_and_cancel_position_bias():
    biased = ScriptedJudge(lambda text, _: "Winner: A")
    reward = GROUP_REWARD_FNS.get("judge_rrc")(judge=biased, votes=2)
    assert reward([sample("A"), sample("B"), sample("C")]) == [0.0, 0.0, 0.0]
    assert [f.get("seed") for _, f in biased.calls] == [0, 1] * 3
    fair = GROUP_REWARD_FNS.get("judge_rrc")(judge=pairwise_judge("CBA"), votes=3)
    assert fair([sample("A"), sample("B"), sample("C")]) == [0.0, 1.0, 2.0]


def test_rrc_anchor_guided_spec_value():
    judge = pairwise_judge("a1 A a2 a3 B")
    reward = GROUP_REWARD_FNS.get("judge_rrc")(judge=judge, mode="agr", alpha=2.0)
    rows = {"anchors": ["a1", "a2", "a3"]}
    assert reward([sample("A", **rows), sample("B", **rows)]) == [2 * 2.0, 0.0]  # A beats 2 of 3 anchors
    policy = ScriptedJudge(lambda text, f: f"a{f['seed'] + 1}")
    from_policy = GROUP_REWARD_FNS.get("judge_rrc")(judge=pairwise_judge("a1 A a2 a3 B"), mode="agr",
                                                    anchor_policy=policy, num_anchors=3)
    assert from_policy([sample("A"), sample("B")]) == [2.0, 0.0]
    from_policy([sample("B"), sample("A")])
    assert len(policy.calls) == 3  # anchors written once per prompt
    with pytest.raises(ValueError, match="anchors"):
        GROUP_REWARD_FNS.get("judge_rrc")(judge=judge, mode="agr")([sample("A"), sample("B")])


def test_preference_cycles_lose_their_weakest_edge():
    margin = [[0, 3, -1], [-3, 0, 3], [1, -3, 0]]  # A≻B (3), B≻C (3), C≻A (1): a cycle
    fixed = break_preference_cycles(margin)
    assert fixed[2][0] == fixed[0][2] == 0 and fixed[0][1] == 3 and fixed[1][2] == 3
    assert break_preference_cycles([[0, 1], [-1, 0]]) == [[0, 1], [-1, 0]]


def scorer(component, retries=0, on_error="exclude"):
    return RewardScorer(RewardConfig(components=[component], retries=retries, on_error=on_error,
                                     accuracy_component=component.name))


def test_failed_judge_is_retried_then_excluded_and_counted():
    replies = iter(["I cannot tell", "Verdict: yes"])
    flaky = ScriptedJudge(lambda text, _: next(replies))
    comp = RewardComponent(name="judge_rubric", params={"criteria": ["x"], "judge": flaky})
    group = Group(uid="g", row={}, samples=[sample("r")])
    metrics = scorer(comp, retries=1).score([group])
    assert group.samples[0].reward == 1.0 and metrics["reward_errors"] == 0

    def down(text, _):
        raise JudgeError("judge http://x failed after 4 attempt(s): HTTP 503")

    comp = RewardComponent(name="judge_rubric", params={"criteria": ["x"], "judge": ScriptedJudge(down)})
    groups = [Group(uid="g", row={}, samples=[sample("r"), sample("s")])]
    metrics = scorer(comp).score(groups)
    assert all(s.excluded and "HTTP 503" in s.excluded for s in groups[0].samples)
    assert metrics["excluded"] == 1.0 and metrics["reward_errors/error"] == 2
    comp = RewardComponent(name="judge_grrm", params={"judge": ScriptedJudge(lambda t, _: "garbage")})
    groups = [Group(uid="g", row={}, samples=[sample("r"), sample("s")])]
    scorer(comp, on_error="zero").score(groups)
    assert [s.rewards["judge_grrm"] for s in groups[0].samples] == [0.0, 0.0] and groups[0].samples[0].excluded is None


def test_built_from_recipe_params_without_touching_the_network():
    reward = REWARD_FNS.get("judge_flip")(judge={"base_url": "http://127.0.0.1:9/v1", "model": "m", "retries": 0})
    assert isinstance(reward.client, JudgeClient) and reward.client.url == "http://127.0.0.1:9/v1/chat/completions"
    with pytest.raises(ValueError, match="unknown judge client option"):
        REWARD_FNS.get("judge_flip")(judge={"url": "x"})
    with pytest.raises(KeyError, match="'prompt'"):
        REWARD_FNS.get("judge_flip")(judge=ScriptedJudge(lambda t, _: "x"), prompt_field="prompt")(sample("r"))


def test_shipped_recipe_builds_its_judge():
    from lmrl.loading import load_config

    judge = RewardScorer(load_config("judge_rubric").reward).components[0].call
    assert judge.client.url == "http://127.0.0.1:8000/v1/chat/completions" and not judge.per_criterion
    assert [c.weight for c in judge.criteria] == [5.0, 3.0, -2.0]
