"""The shipped environments (tool use, bandit, guessing) and per-turn credit (`turn_discounted`), by hand."""
from __future__ import annotations

import pytest
import torch

from lmrl.algos import ADVANTAGES
from lmrl.envs.bandit import BanditEnv, strategy_metrics
from lmrl.inputs.credit import turn_reward_row
from lmrl.envs.tools import ToolError, ToolUseEnv, calculate, parse_call
from lmrl.types import Sample


def test_calculator_evaluates_arithmetic_and_nothing_else():
    assert calculate("123 * 456") == 56088
    assert calculate("(2 + 3) * -4 / 8") == -2.5
    assert calculate("7 // 2 + 7 % 2 + 2 ** 10") == 1028
    for bad in ("__import__('os').system('true')", "x + 1", "[1] * 3", "2 ** 10 ** 10", "1 / 0", "9" * 300):
        with pytest.raises(ToolError):
            calculate(bad)


def test_tool_calls_are_parsed_strictly():
    assert parse_call('{"name": "calculator", "arguments": {"expression": "1+1"}}', ["calculator"]) == \
        ("calculator", {"expression": "1+1"})
    for bad in ('{"name": "calculator"', '{"name": "shell", "arguments": {"cmd": "ls"}}',
                '{"name": "calculator", "arguments": {"expr": "1"}}', '["calculator"]'):
        with pytest.raises(ToolError):
            parse_call(bad, ["calculator"])


def test_tool_env_answers_calls_rewards_format_and_ends_on_a_final_reply():
    env = ToolUseEnv(tools=["calculator"])
    messages, state = env.reset({"question": "What is 12 * 34?"}, 0)
    assert [m["role"] for m in messages] == ["system", "user"] and "<tool_call>" in messages[0]["content"]
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>', state)
    assert step.observation == [{"role": "tool", "content": "408"}] and step.reward == 0.0 and not step.done
    step = env.step("<tool_call>{oops}</tool_call>", state)
    assert step.observation[0]["content"].startswith("error: the call is not valid JSON") and step.reward == -0.1
    step = env.step("<tool_call>never closed", state)
    assert step.reward == -0.1 and not step.done
    step = env.step("12 * 34 = 408. Answer: 408", state)
    assert step.done and step.observation is None and step.reward == 0.1  # the well-formed turn's credit, now
    assert step.info["metrics"] == {"env/tool_calls": 3.0, "env/tool_call_errors": 2.0, "env/tool_timeouts": 0.0}


def test_python_tool_runs_in_the_sandbox_and_a_timeout_is_an_error_observation():
    env = ToolUseEnv(tools=["python"], tool_timeout_s=3.0)  # room for the sandbox's start on a busy machine
    _, state = env.reset({"question": "q"}, 0)
    step = env.step('<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>', state)
    assert step.observation[0]["content"].strip() == "42"
    step = env.step('<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>', state)
    assert step.observation[0]["content"].startswith("error (timeout)") and not step.done
    assert step.info["metrics"]["env/tool_timeouts"] == 1.0


def test_bandit_arms_swap_at_the_reversal_and_pay_per_round():
    env = BanditEnv(rounds=6, p_good=1.0, p_bad=0.0, min_reversal=2)
    _, state = env.reset({}, seed=3)
    good, reversal = state["good"], state["reversal"]
    other = {"a": "b", "b": "a"}[good]
    rewards = [env.step(good, state).reward for _ in range(6)]
    assert rewards == [1.0] * reversal + [0.0] * (6 - reversal)
    _, state = env.reset({}, seed=3)
    steps = [env.step(f"arm {other}", state) for _ in range(6)]
    assert [s.reward for s in steps] == [0.0] * reversal + [1.0] * (6 - reversal)
    assert steps[-1].done and not steps[0].done and steps[0].observation[0]["role"] == "user"


def test_win_stay_and_lose_shift_by_hand():
    history = [("a", True, True), ("a", False, True), ("b", False, False), ("b", True, False), (None, False, False)]
    m = strategy_metrics(history)
    # pairs with both arms valid: (a win -> a: stay), (a loss -> b: shift), (b loss -> b: no shift)
    assert m["env/win_stay"] == 1.0 and m["env/lose_shift"] == 0.5
    assert m["env/better_arm"] == 0.4 and m["env/invalid"] == 0.2


def test_turn_discounted_by_hand_on_three_turns():
    # one row: turns of 2, 1 and 2 policy tokens with environment tokens between them
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 0]], dtype=torch.float)
    mask = torch.cat([mask, mask])
    turn_rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    token_rewards = torch.zeros_like(mask)
    token_rewards[0, 7], token_rewards[1, 7] = 3.5, 1.0  # sequence rewards: env 3 + answer 0.5, env 1 + 0
    adv = ADVANTAGES.get("turn_discounted")(token_rewards, torch.tensor([0, 0]), mask,
                                            turn_rewards=turn_rewards, gamma=0.5, norm_by_std=False)
    # row 0: r = [1, 0, 2.5] -> G = [1 + 0.5*(0 + 0.5*2.5), 0 + 0.5*2.5, 2.5] = [1.625, 1.25, 2.5]
    # row 1: r = [0, 1, 0]   -> G = [0.5, 1, 0]; per-turn group means: [1.0625, 1.125, 1.25]
    expected0 = [0.5625, 0.5625, 0, 0, 0.125, 0, 1.25, 1.25, 0]
    expected1 = [-0.5625, -0.5625, 0, 0, -0.125, 0, -1.25, -1.25, 0]
    assert adv.tolist() == [pytest.approx(expected0), pytest.approx(expected1)]


def test_turn_discounted_is_grpo_when_all_reward_comes_at_the_end():
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.float)
    token_rewards = torch.zeros_like(mask)
    token_rewards[0, 3], token_rewards[1, 3], token_rewards[2, 2] = 1.0, 0.0, 0.5
    group = torch.tensor([0, 0, 0])
    turn = ADVANTAGES.get("turn_discounted")(token_rewards, group, mask, turn_rewards=torch.zeros(3, 2))
    assert torch.allclose(turn, ADVANTAGES.get("grpo")(token_rewards, group, mask))


def test_turn_rewards_skip_turns_without_tokens():
    x = Sample([1], [2], [0.0], info={"turn_rewards": [1.0, 2.0, 3.0], "turn_lengths": [2, 0, 1]})
    assert turn_reward_row(x) == [1.0, 3.0]


def test_guessing_game_by_hand():
    from lmrl.envs.guessing import GuessingEnv

    env = GuessingEnv(low=1, high=100, max_guesses=7)
    messages, state = env.reset({}, seed=3)
    secret = state["secret"]
    assert "1 to 100" in messages[0]["content"] and 1 <= secret <= 100
    first = 50 if secret != 50 else 49
    step = env.step(f"I guess {first}", state)
    assert step.observation[0]["content"].startswith("Higher." if first < secret else "Lower.") and step.reward == 0.0
    wrong_side = 1 if first < secret else 100  # outside what the feedback allows
    assert wrong_side != secret
    step = env.step(str(wrong_side), state)
    assert not step.done and step.info["metrics"]["env/consistent"] == 0.5
    step = env.step("no idea", state)
    assert step.reward == -0.1 and step.info["metrics"]["env/invalid"] == pytest.approx(1 / 3)
    step = env.step(f"{secret}", state)
    assert step.done and step.reward == pytest.approx(1 - 3 / 7)  # found on guess 4 of 7
    assert step.info["metrics"]["env/solved"] == 1.0 and step.info["metrics"]["env/consistent"] == pytest.approx(2 / 3)


def test_guessing_game_ends_unsolved_after_the_last_guess():
    from lmrl.envs.guessing import GuessingEnv

    env = GuessingEnv(low=1, high=10, max_guesses=2)
    _, state = env.reset({}, seed=0)
    wrong = 1 if state["secret"] != 1 else 2
    assert not env.step(str(wrong), state).done
    last = env.step(str(wrong), state)
    assert last.done and last.reward == 0.0 and last.info["metrics"]["env/solved"] == 0.0


def test_reflect_and_revise_by_hand():
    from lmrl.envs.revise import FEEDBACK, MISSING, ReviseEnv

    env = ReviseEnv(max_attempts=3)
    row = {"question": "What is 3 + 4?", "answer": "7"}
    messages, state = env.reset(row, seed=0)
    assert messages == [{"role": "user", "content": "What is 3 + 4?"}]
    assert env.step("Answer: 3 + 4", state).observation[0]["content"] == FEEDBACK  # restating is not answering
    assert env.step("hmm, not sure", state).observation[0]["content"] == MISSING
    done = env.step("I was wrong. Answer: 7", state)
    assert done.done and done.reward == 0.5 and done.info["metrics"] == {
        "env/first_try": 0.0, "env/revised": 1.0, "env/attempts": 3.0}
    _, state = env.reset(row, seed=0)
    first = env.step("Answer: 7", state)
    assert first.done and first.reward == 1.0 and first.info["metrics"]["env/first_try"] == 1.0
    _, state = ReviseEnv(max_attempts=1).reset(row, seed=0)
    last = ReviseEnv(max_attempts=1).step("Answer: 8", state)
    assert last.done and last.reward == 0.0


def test_code_interpreter_runs_blocks_shows_output_and_ends_on_a_plain_reply():
    from lmrl.envs.code_interpreter import CodeInterpreterEnv

    env = CodeInterpreterEnv(timeout_s=2.0)
    messages, state = env.reset({"question": "What is 12 * 34?"}, 0)
    assert [m["role"] for m in messages] == ["system", "user"] and "```python" in messages[0]["content"]
    step = env.step("Let me compute.\n```python\nprint(12 * 34)\n```", state)
    assert step.observation == [{"role": "user", "content": "Output:\n408\n"}] and step.reward == 0.0
    step = env.step("```py\nprint(1 / 0)\n```", state)
    assert step.observation[0]["content"].startswith("Output:\nerror") and step.reward == -0.1 and not step.done
    step = env.step("```\nwhile True: pass\n```", state)
    assert "timeout" in step.observation[0]["content"] and step.reward == -0.1
    step = env.step("So the product is 408. Answer: 408", state)
    assert step.done and step.observation is None and step.reward == 0.1  # the clean turn's credit, with the answer
    assert step.info["metrics"] == {"env/code_runs": 3.0, "env/code_errors": 2.0}


def test_format_credit_is_paid_once_with_the_answer_so_calling_more_earns_nothing():
    from lmrl.envs.code_interpreter import CodeInterpreterEnv

    env = CodeInterpreterEnv(timeout_s=10.0)  # a first sandbox start on a busy machine can take seconds
    _, state = env.reset({"question": "q"}, 0)
    rewards = [env.step("```python\nprint(1)\n```", state).reward for _ in range(3)]
    assert rewards == [0.0, 0.0, 0.0]  # cut off here (max_turns), the episode's return is 0
    assert env.step("Answer: 1", state).reward == pytest.approx(0.1)  # answered: paid once, however many turns
