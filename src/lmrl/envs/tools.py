"""Tool use: the policy calls a calculator or a sandboxed Python tool, then answers.

Convention (Hermes / Qwen style, docs/environments.md): the tool schemas go to the chat template's
`tools=` when it supports tools, else into the system prompt (`lmrl.envs.chat.with_tool_schemas`); a
call is a JSON object in tags, any number per turn:

    <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>

Each call is answered by one `tool` message holding its result (or an error). A reply without a
`<tool_call>` tag is the final answer and ends the episode; the task's answer reward grades it
(`Sample.text` is the last reply). The environment's reward is an R2IF-style format reward
(`format_credit`): −`format_reward` at once for a turn with a malformed call, +`format_reward` once
for an episode with a turn whose calls are all well-formed (valid JSON, a known tool, the arguments
it declares), paid with the final answer. A tool call that exceeds `tool_timeout_s` is
answered with an error message (the episode goes on).
"""
from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.single_turn import prompt_messages

SYSTEM_PROMPT = ("Solve the problem. You may call a tool: write <tool_call>{\"name\": ..., \"arguments\": {...}}"
                 "</tool_call> and wait for its result. When you know the result, reply without a tool call "
                 "and end with 'Answer: <number>'.")

SCHEMAS = {
    "calculator": {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    "python": {"type": "function", "function": {
        "name": "python", "description": "Run Python code in a sandbox and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
}

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
SIGNS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ToolError(ValueError):
    """A tool call that cannot run (bad expression, unknown tool, bad arguments)."""


def calculate(expression: str, max_chars: int = 200, max_digits: int = 1000) -> int | float:
    """The value of an arithmetic expression: numbers, + - * / // % **, unary signs, parentheses. No names,
    calls or attributes are evaluated (the expression is walked as a syntax tree, never `eval`ed)."""
    if len(expression) > max_chars:
        raise ToolError(f"expression longer than {max_chars} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"not an arithmetic expression: {err.msg}") from None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in SIGNS:
            return SIGNS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
                raise ToolError("power too large")
            try:
                out = OPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            if isinstance(out, int) and out.bit_length() > max_digits * 3.33:
                raise ToolError("result too large")
            return out
        raise ToolError(f"unsupported syntax: {type(node).__name__}")

    result = value(tree.body)
    return int(result) if isinstance(result, float) and result.is_integer() and abs(result) < 2**53 else result


def run_python_tool(code: str, timeout_s: float, max_chars: int) -> str:
    """What `code` prints, run in the sandbox (lmrl.rewards.sandbox); an error or timeout as a message."""
    from lmrl.rewards.sandbox import run_python

    result = run_python(code, timeout_s=timeout_s, memory_mb=256)
    if result.status == "ok":
        return result.stdout[-max_chars:] or "(no output)"
    detail = result.reason or result.stderr.strip().splitlines()[-1:] or [""]
    return f"error ({result.status}): {detail if isinstance(detail, str) else detail[0]}"[:max_chars]


def parse_call(text: str, tools: list[str],
               schemas: dict[str, dict[str, Any]] = SCHEMAS) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of one call's JSON, checked against the tools' `schemas`; ToolError when it is
    not a well-formed call."""
    try:
        call = json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolError(f"the call is not valid JSON: {err.msg}") from None
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        raise ToolError('a call is {"name": ..., "arguments": {...}}')
    name = call.get("name")
    if name not in tools:
        raise ToolError(f"unknown tool {name!r}; tools: {', '.join(tools)}")
    spec = schemas[name]["function"]["parameters"]
    args = call["arguments"]
    if set(args) != set(spec["required"]) or not all(isinstance(v, str) for v in args.values()):
        raise ToolError(f"{name} takes {{{', '.join(repr(k) + ': string' for k in spec['required'])}}}")
    return name, args


def format_credit(state: dict[str, Any], well_formed: bool, weight: float) -> float:
    """This turn's format reward: −`weight` now for a malformed turn; a well-formed one sets the episode's
    credit `state["credit"]` to `weight`, paid once with the final answer. Both choices close exploits
    seen in training: a credit paid per turn paid a policy for calling tools until the episode was cut
    off, never answering; a credit per well-formed turn, even deferred, paid it for running the same
    code twice before answering."""
    if well_formed:
        state["credit"] = weight
        return 0.0
    return -weight


@ENVIRONMENTS.register("tool_use", "calculator and sandboxed Python tools called in <tool_call> JSON tags; "
                                   "per-turn format reward, the answer graded by the task's reward")
class ToolUseEnv:
    """Tool calls until a reply without one; the state counts calls, errors and timeouts for the metrics."""

    def __init__(self, tools: list[str] | tuple[str, ...] = ("calculator", "python"),
                 system_prompt: str = SYSTEM_PROMPT, format_reward: float = 0.1, tool_timeout_s: float = 5.0, max_calls_per_turn: int = 4,
                 max_output_chars: int = 500, observation_role: str = "tool"):
        unknown = sorted(set(tools) - set(SCHEMAS))
        if unknown:
            raise ValueError(f"tool_use: unknown tools {unknown}; available: {sorted(SCHEMAS)}")
        self.names = list(tools)
        self.tools = [SCHEMAS[t] for t in self.names]
        self.system_prompt, self.format_reward = system_prompt, format_reward
        self.tool_timeout_s, self.max_calls = tool_timeout_s, max_calls_per_turn
        self.max_chars, self.role = max_output_chars, observation_role

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
        return prompt_messages(row, self.system_prompt), {"calls": 0, "bad_calls": 0, "timeouts": 0, "credit": 0.0}

    def step(self, reply: str, state: dict[str, float]) -> Step:
        blocks = CALL.findall(reply)
        if not blocks and "<tool_call>" not in reply:
            return Step(None, state["credit"], True, {"metrics": self._metrics(state)})
        results, well_formed = [], bool(blocks)
        for text in blocks[: self.max_calls] or [reply.split("<tool_call>", 1)[1]]:
            state["calls"] += 1
            try:
                results.append(self.call(*parse_call(text.strip(), self.names), state))
            except ToolError as err:
                state["bad_calls"] += 1
                well_formed = False
                results.append(f"error: {err}")
        reward = format_credit(state, well_formed and len(blocks) <= self.max_calls, self.format_reward)
        observation = [{"role": self.role, "content": r} for r in results]
        return Step(observation, reward, False, {"metrics": self._metrics(state)})

    def call(self, name: str, args: dict[str, str], state: dict[str, float]) -> str:
        if name == "calculator":
            return str(calculate(args["expression"]))
        out = run_python_tool(args["code"], self.tool_timeout_s, self.max_chars)
        if out.startswith("error (timeout)"):
            state["timeouts"] += 1
        return out

    @staticmethod
    def _metrics(state: dict[str, float]) -> dict[str, float]:
        return {"env/tool_calls": float(state["calls"]), "env/tool_call_errors": float(state["bad_calls"]),
                "env/tool_timeouts": float(state["timeouts"])}
