"""The training loop names no method: no estimator, loss or reward name, and no kind of added sample or
method-specific input, appears in the loop's modules (src/lmrl/loops/*.py, and the provider dispatch it
calls, src/lmrl/inputs/registry.py). What differs between
methods reaches the loop through registries, declarations and input providers (docs/architecture.md)."""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from lmrl.algos import ADVANTAGES, LOSSES
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_FNS

LOOPS = Path(__file__).resolve().parents[2] / "src" / "lmrl" / "loops"
PROVIDER_DISPATCH = LOOPS.parent / "inputs" / "registry.py"
KINDS = ("demonstration", "rescue", "peer", "pmi", "variant", "guided", "hint", "privileged")
# Reward names that are also plain words of the loop: the task row's gold-answer field, the finish
# reason of a rollout cut at max_new_tokens, and the metric of the share of such rollouts.
PLAIN_WORDS = {"answer", "length", "truncated"}


def loop_files() -> list[Path]:
    return sorted(LOOPS.glob("*.py")) + [PROVIDER_DISPATCH]


def words(text: str) -> list[str]:
    """The lower-case words of identifiers and prose: snake_case, camelCase and dotted names split."""
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", text)]


def registered_names() -> set[str]:
    return (set(ADVANTAGES.names()) | set(LOSSES.names()) | set(REWARD_FNS.names())
            | set(GROUP_REWARD_FNS.names())) - PLAIN_WORDS


def named(path: Path, names: set[str]) -> list[str]:
    """Identifiers (not attributes) and identifier-like words in string literals that are in `names`."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    found = []
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string in names and not (i and tokens[i - 1].string == "."):
            found.append(f"{tok.string} (line {tok.start[0]})")
        if tok.type == tokenize.STRING:
            found += [f"{w} (line {tok.start[0]})" for w in re.findall(r"[A-Za-z_]\w*", tok.string) if w in names]
    return found


def test_the_loop_files_are_found():
    assert {"loop.py", "collect.py", "setup.py", "registry.py", "batching.py"} <= {p.name for p in loop_files()}


@pytest.mark.parametrize("path", loop_files(), ids=lambda p: p.name)
def test_no_kind_of_added_sample_or_method_input_in_the_loop(path):
    found = sorted({w for w in words(path.read_text()) if w.startswith(KINDS)})
    assert not found, f"{path.name} names {found}"


@pytest.mark.parametrize("path", loop_files(), ids=lambda p: p.name)
def test_no_estimator_loss_or_reward_name_in_the_loop(path):
    assert not named(path, registered_names()), f"{path.name} names {named(path, registered_names())}"


def test_the_checks_find_what_they_look_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('from x import add_demonstrations\nif cfg.algo.advantage == "grpo":\n    PMI_FIELD = 1\n')
    assert {"demonstrations", "pmi"} <= {w for w in words(bad.read_text()) if w.startswith(KINDS)}
    assert named(bad, registered_names()) == ["grpo (line 2)"]
