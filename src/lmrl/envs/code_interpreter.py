"""Tool use by code: the policy writes a ```python block, the environment runs it and shows what it printed.

The code-interpreter convention (tool-integrated reasoning): no schemas, no JSON; any fenced Python
block in a reply is run in lmrl's sandbox (`rewards.sandbox`: separate process, time and memory
limits, no network) and its output (or error) comes back as the next user message, `Output:\n…`.
A reply without a code block is the final answer and ends the episode; the task's answer reward
grades it. Format reward (`tools.format_credit`): −`format_reward` at once for a turn whose code
failed, +`format_reward` once for an episode with a clean turn, paid with the final answer (paid per
turn, it taught a policy to run code until the episode was cut off, never answering; per clean turn,
to run its code twice). Small models that never emit `<tool_call>` JSON (SmolLM2-135M) often
write code blocks unprompted, which is why this convention exists beside `tool_use`.
"""
from __future__ import annotations

import re
from typing import Any

from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.single_turn import prompt_messages
from lmrl.envs.tools import format_credit, run_python_tool

CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
SYSTEM_PROMPT = ("Solve the problem. You can run Python: write a ```python code block that prints the result, "
                 "and you will see its output. Then end your reply with 'Answer: <number>'.")


@ENVIRONMENTS.register("code_interpreter", "fenced Python blocks run in the sandbox, their output shown; "
                                           "per-turn format reward, the answer graded by the task's reward")
class CodeInterpreterEnv:
    """Runs each reply's code blocks until a reply without one; counts runs and errors for the metrics."""

    def __init__(self, system_prompt: str = SYSTEM_PROMPT, format_reward: float = 0.1, timeout_s: float = 5.0,
                 max_blocks_per_turn: int = 2, max_output_chars: int = 500):
        self.system_prompt, self.format_reward, self.timeout_s = system_prompt, format_reward, timeout_s
        self.max_blocks, self.max_chars = max_blocks_per_turn, max_output_chars

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
        return prompt_messages(row, self.system_prompt), {"runs": 0, "errors": 0, "credit": 0.0}

    def step(self, reply: str, state: dict[str, float]) -> Step:
        blocks = CODE.findall(reply)[: self.max_blocks]
        if not blocks:
            return Step(None, state["credit"], True, {"metrics": self._metrics(state)})
        outputs = []
        for code in blocks:
            state["runs"] += 1
            out = run_python_tool(code, self.timeout_s, self.max_chars)
            state["errors"] += out.startswith("error")
            outputs.append(out)
        ok = not any(o.startswith("error") for o in outputs)
        observation = [{"role": "user", "content": "Output:\n" + "\n".join(outputs)}]
        return Step(observation, format_credit(state, ok, self.format_reward), False, {"metrics": self._metrics(state)})

    @staticmethod
    def _metrics(state: dict[str, float]) -> dict[str, float]:
        return {"env/code_runs": float(state["runs"]), "env/code_errors": float(state["errors"])}
