"""Help on hard prompts (`lmrl.data.guidance`): KnowRL's hint subsets and hinted re-rolls, TaoSR-AGRL's guided
replay into the group, RISE-RL's privileged trajectories; the spec's hand cases and the config checks."""
from __future__ import annotations

import pytest

from conftest import make_tokenizer
from lmrl.algos import Algorithm
from lmrl.config import ConfigError
from lmrl.data import SAMPLE_SOURCES
from lmrl.data.demonstrations import load_source_state, source_state
from lmrl.data.guidance import search_hints, select_hints
from lmrl.loading import build_config
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.types import Group, Origin, Sample
from lmrl.validation import check_row_fields

if "graded_text" not in REWARD_FNS:
    REWARD_FNS.register("graded_text", "test reward: the completion text read as a number")(
        lambda sample, **_: float(sample.text))


def row(uid: str, question: str = "q", **fields) -> dict:
    return {"uid": uid, "question": question, "answer": "7", "prompt_ids": [1, 2], **fields}


def group(r: dict, texts: list[str]) -> Group:
    return Group(uid=r["uid"], row=r, samples=[Sample([1, 2], [3], [-1.0], text=t, row=r) for t in texts])


class FakeEngine:
    """`generate(rows, n, temperature)`: the given texts as rollouts of each row, recording what it was asked."""

    def __init__(self, tok, texts: list[str]):
        self.tok, self.texts, self.calls, self.temperatures = tok, texts, [], []

    def __call__(self, rows: list[dict], n: int, temperature: float | None = None) -> list[Group]:
        self.calls.append((rows, n))
        self.temperatures.append(temperature)
        out = []
        for r in rows:
            ids = [self.tok(t, add_special_tokens=False)["input_ids"] for t in self.texts[:n]]
            out.append(Group(uid=r["uid"], row=r, samples=[
                Sample(list(r["prompt_ids"]), i, [-0.5] * len(i), text=t, row=r)
                for t, i in zip(self.texts[:n], ids)]))
        return out


def built(tree: dict, groups: list[Group]):
    """The config's scorer (which scores `groups`) and sample source."""
    cfg = build_config(tree)
    scorer = RewardScorer(cfg.reward)
    scorer.score(groups)
    return cfg, SAMPLE_SOURCES.get(cfg.data.demonstrations)(cfg, make_tokenizer(), scorer)


# --- KnowRL -------------------------------------------------------------------------------------


def test_css_picks_the_smallest_subset_within_delta_of_all_points():
    """Spec: acc(all) = 0.6, acc({k1,k3}) = 0.58, acc({k1}) = 0.40, δ = 0.03 → {k1, k3}."""
    assert select_hints({(0, 1, 2): 0.6, (0, 2): 0.58, (0,): 0.40}, 0.03) == (0, 2)
    assert select_hints({(0, 1, 2): 0.6, (0, 2): 0.56, (0,): 0.40}, 0.03) == (0, 1, 2)


def test_css_search_judges_joint_removals_as_wholes():
    """Removing k2 alone or k3 alone keeps the accuracy, removing both does not (the pruning interaction
    paradox): the search measures {k1} itself, so it keeps a pair."""
    table = {(0, 1, 2): 0.6, (0, 1): 0.6, (0, 2): 0.59, (1, 2): 0.2, (0,): 0.3, (1,): 0.1, (2,): 0.1}
    measured = []

    def measure(subsets):
        measured.append(subsets)
        return [table[s] for s in subsets]

    assert search_hints(3, measure, 0.03) == (0, 1)
    assert measured == [[(0, 1, 2)], [(0,), (1,), (2,)], [(0, 1), (0, 2), (1, 2)]]
    assert search_hints(1, lambda subsets: [0.5], 0.03) == (0,)


def test_hints_roll_a_failed_group_again_with_its_chosen_points():
    tok = make_tokenizer()
    hard = row("a", "q1", hints=["k one", "k two", "k three"], hint_index=[0, 2])
    easy = row("b", "q2", hints=["k"], hint_index=[0])
    groups = [group(hard, ["Answer: 1", "Answer: 2"]), group(easy, ["Answer: 7", "Answer: 3"])]
    cfg, add = built({"data": {"demonstrations": "hints"}, "rollout": {"group_size": 2}}, groups)
    engine = FakeEngine(tok, ["Answer: 7", "Answer: 4"])
    out, metrics = add(groups, engine)
    (rows, n), = engine.calls
    assert n == 2 and len(rows) == 1
    assert rows[0]["question"] == "q1\n\n## Hint\n1. k one\n2. k three" and rows[0]["uid"] == "a#hint"
    assert rows[0]["prompt_ids"] != hard["prompt_ids"]
    assert out[1] is groups[1] and out[0].uid == "a#hint"
    assert [x.reward for x in out[0].samples] == [1.0, 0.0]
    assert all(x.origin is Origin.SAMPLED and x.prompt_ids == rows[0]["prompt_ids"] for x in out[0].samples)
    assert metrics == {"hints/groups": 1.0, "hints/accuracy": 0.5}


# --- TaoSR-AGRL ---------------------------------------------------------------------------------


def test_guided_replay_replaces_the_worst_members_of_a_failed_group():
    """Spec: τ = 0.25, group accuracy 0/8 → 2 guided rollouts replace 2 failures; 2/8 is not below τ."""
    tok = make_tokenizer()
    failed = group(row("a", "q1"), [f"Answer: {i}" for i in range(8)])
    failed.samples[3].excluded = "reward answer: timeout"
    fine = group(row("b", "q2"), ["Answer: 7", "Answer: 7"] + ["Answer: 1"] * 6)
    groups = [failed, fine]
    cfg, add = built({"data": {"demonstrations": "guided_replay", "source_params": {"tau": 0.25, "count": 2}}},
                     groups)
    engine = FakeEngine(tok, ["Answer: 7", "Answer: 5"])
    out, metrics = add(groups, engine)
    (rows, n), = engine.calls
    assert n == 2 and [r["question"] for r in rows] == ["q1\n\nThe correct answer is 7."]
    assert out[1] is fine and len(out[0].samples) == 8 and failed.samples[0].origin is Origin.SAMPLED
    origins = [x.origin for x in out[0].samples]
    assert [i for i, o in enumerate(origins) if o is Origin.GUIDED] == [0, 3]  # the excluded one, then the first 0
    guided = [out[0].samples[3], out[0].samples[0]]
    assert [x.reward for x in guided] == [1.0, 0.0]
    assert all(x.prompt_ids == [1, 2] and x.row is failed.row and x.behaviour_logprobs == [0.0] * 9
               for x in guided)
    assert guided[0].info["guided_prompt"] == rows[0]["question"]
    assert metrics == {"guided/groups": 1.0, "guided/replaced": 2.0, "guided/reward": 0.5}
    assert engine.temperatures == [None]  # the run's sampling temperature

    cfg, add = built({"data": {"demonstrations": "guided_replay",
                               "source_params": {"tau": 0.25, "count": 2, "temperature": 0.3}}}, groups)
    engine = FakeEngine(tok, ["Answer: 7", "Answer: 5"])
    add(groups, engine)
    assert engine.temperatures == [0.3]  # guided rollouts at their own temperature


def test_guided_rows_enter_the_advantage_and_bring_no_logprobs():
    assert Origin.GUIDED.in_advantage and not Origin.GUIDED.brings_logprobs and not Origin.GUIDED.sampled
    assert not Origin.PRIVILEGED.in_advantage and not Origin.PRIVILEGED.brings_logprobs


# --- RISE-RL ------------------------------------------------------------------------------------


def rise_tree(**knobs) -> dict:
    return {"reward": {"components": [{"name": "graded_text"}], "accuracy_component": "graded_text"},
            "algo": {"demo_nll_coef": 0.1},
            "data": {"demonstrations": "privileged",
                     "source_params": {"criteria": {"graded_text": "Reach the full grade."}, "min_misses": 2,
                                       **knobs}}}


def test_privileged_trajectories_are_kept_only_above_the_natural_mean():
    """Spec: natural rewards [0.4, 0.6] (mean 0.5); privileged 0.7 kept, 0.45 dropped."""
    tok = make_tokenizer()
    r = row("a", "q1")
    groups = [group(r, ["0.4", "0.6"])]
    cfg, add = built(rise_tree(count=2), groups)
    engine = FakeEngine(tok, ["0.7", "0.45"])
    out, metrics = add(groups, engine)
    (rows, n), = engine.calls
    assert n == 2 and rows[0]["question"] == "q1\n\nMake sure your reply meets these criteria:\n- Reach the full grade."
    assert out[0] is groups[0] and len(out) == 2
    kept = out[1].samples
    assert [x.reward for x in kept] == [0.7] and kept[0].origin is Origin.PRIVILEGED
    assert kept[0].prompt_ids == [1, 2] and kept[0].row is r
    assert metrics == {"privileged/active": 1.0, "privileged/prompts": 1.0, "privileged/sampled": 2.0,
                       "privileged/kept": 1.0}


def test_a_criterion_is_due_after_repeated_misses_and_a_clean_visit_resets_it():
    tok = make_tokenizer()
    r = row("a")
    cfg, add = built(rise_tree(min_misses=3), [])
    engine = FakeEngine(tok, ["0.9"])
    scorer = add.scorer
    for texts, due in ((["0.4", "0.6"], False), (["0.5", "1.0"], True), (["1.0", "1.0"], False), (["0.2"], False)):
        g = group(r, texts)
        scorer.score([g])
        out, metrics = add([g], engine)
        assert metrics["privileged/prompts"] == float(due), texts
    assert add.misses == {"a": {"graded_text": 1}}


def test_privileged_source_turns_off_once_the_reward_plateaus_and_resumes_its_state():
    tok = make_tokenizer()
    cfg, add = built(rise_tree(plateau_window=2, plateau_tol=0.01), [])
    engine = FakeEngine(tok, ["0.99"])
    active = []
    for mean_reward in (0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.9):
        g = group(row("a"), [str(mean_reward)] * 2)
        add.scorer.score([g])
        active.append(add([g], engine)[1]["privileged/active"])
    # mean of the last 2 steps against the 2 before: 0.7 vs 0.55, 0.7 vs 0.65 (on), 0.7 vs 0.7 (off for good)
    assert active == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    calls = len(engine.calls)
    fresh = SAMPLE_SOURCES.get("privileged")(cfg, tok, add.scorer)
    load_source_state(fresh, source_state(add))
    assert (fresh.active, fresh.history, fresh.misses) == (False, add.history, add.misses)
    g = group(row("a"), ["0.1", "0.1"])
    add.scorer.score([g])
    assert fresh([g], engine)[0] == [g] and len(engine.calls) == calls


def test_privileged_rows_stay_out_of_the_advantage_and_train_by_the_supervised_term():
    """The kept row (0.7) is apart from its group: advantage 0, flagged for λ_aux = algo.demo_nll_coef."""
    from lmrl.inputs import InputContext
    from lmrl.loops.batching import to_batch

    groups = [group(row("a"), ["0.4", "0.6"])]
    cfg, add = built(rise_tree(), groups)
    out, _ = add(groups, FakeEngine(make_tokenizer(), ["0.7"]))
    batch = to_batch(InputContext(cfg, out, step=1), pad_id=0)
    assert batch.group_index.tolist() == [0, 0, 1]
    assert batch.row_extras["in_advantage"].tolist() == [True, True, False]
    assert batch.row_extras["demonstration"].tolist() == [0.0, 0.0, 1.0]
    algo = Algorithm(cfg.algo, max_new_tokens=4)
    algo.prepare(batch)
    rows = (batch.advantages * batch.completion_mask).sum(1)
    assert rows[0] < 0 < rows[1] and rows[2] == 0
    assert algo.inert_rows(batch).tolist() == [False, False, False]


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize("tree, match", [
    ({"data": {"demonstrations": "privileged", "source_params": {"criteria": {"answer": "x"}}}}, "add one to algo.terms"),
    ({"data": {"demonstrations": "privileged", "source_params": {"criteria": {"nope": "x"}}},
      "algo": {"demo_nll_coef": 0.1}}, "name no reward component"),
    ({"data": {"demonstrations": "privileged"}, "algo": {"demo_nll_coef": 0.1}}, "criteria"),
    ({"data": {"demonstrations": "guided_replay", "source_params": {"taus": 0.3}}}, "taus"),
    ({"data": {"demonstrations": "hints", "group_filter": "nonzero_std"}}, "group_filter"),
    ({"data": {"demonstrations": "none", "source_params": {"tau": 0.3}}}, "takes no knobs"),
])
def test_bad_source_settings_are_refused_at_config_time(tree, match):
    with pytest.raises(ConfigError, match=match):
        build_config(tree)


def test_rows_without_the_fields_a_source_reads_are_refused():
    hints = build_config({"data": {"demonstrations": "hints"}})
    with pytest.raises(ConfigError, match="'hints'"):
        check_row_fields(hints, [row("a", hints=["k"]), row("b")])
    guided = build_config({"data": {"demonstrations": "guided_replay",
                                    "source_params": {"guidance": "Label {label}; rules {rules}"}}})
    with pytest.raises(ConfigError, match="'label'"):
        check_row_fields(guided, [row("a", rules="r")])
    check_row_fields(guided, [row("a", rules="r", label="x")])
