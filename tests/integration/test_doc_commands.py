"""Every command README.md and docs/ show runs as written (tests/doc_commands.py extracts them).

`lmrl train` and `lmrl eval` forms pass `--dry-run` (names, knobs, model, tokenizer, data rows), with the
placeholders filled from fixture runs of a tiny model; `list`, `--help`, `report`, `compare`, `export`,
`merge` run for real on those runs; `serve` parses and finds its model; `torchrun` forms dry-run the
`lmrl.cli` part; `python` scripts show their `--help` and accept every flag the docs use; a command
marked `[needs: …]` names a known reason. `REAL_RUNS` train for real under a step budget.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import save_tiny_model, write_toy_task
from doc_commands import KNOWN_NEEDS, Command, Script, extract, extract_scripts, fill
from lmrl import cli
from lmrl.models.default import installed_default_gguf

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMANDS = extract(PAGES, ROOT)
SCRIPTS = extract_scripts(PAGES, ROOT)
# trained for real, with this budget appended (the Ray example must fit the documented 2-core machine)
REAL_RUNS = {"lmrl train quickstart dist.backend=ray dist.rollout_workers=2 rollout.max_staleness=1":
             "trainer.steps=1 eval.at_start=false eval.at_end=false rollout.prompts_per_step=2 rollout.group_size=4 "
             "rollout.max_new_tokens=16"}
FILE_BLOCK = re.compile(r"```(?:python|yaml|bash)\n# (\S+\.(?:py|yaml|jsonl|sh))\n(.*?)```", re.S)
# names the docs give to runs and models of their examples: links to the fixture runs in the workspace
RUN_NAMES = {"name": ["a", "a1", "a2", "grpo", "grpo-s0", "grpo-s1", "grpo-x", "math", "instructor"],
             "other": ["b", "b1", "b2", "dapo", "dapo-s0", "dapo-s1", "code"]}
MODEL_NAMES = ["sft", "a", "b", "c"]
SHIM = """#!{python}
import json, os, sys
with open(os.environ["DOC_COMMANDS_RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


def _fixture_run(ws: Path, name: str, model: Path, recipe: str = "quickstart", extra: tuple[str, ...] = ()) -> Path:
    """A real 20-step run of the tiny model (checkpoints at 10 and 20, an evaluation at the end)."""
    argv = ["train", recipe, f"model.path={model}", "task.name=jsonl", f"task.dataset={ws / 'toy.jsonl'}",
            "task.prompt_field=question", "task.num_eval=8", "reward.components=[{name: toy.py:contains_seven}]",
            "reward.accuracy_component=toy.py:contains_seven", "trainer.steps=20", "run.checkpoint_every=10",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "eval.at_start=false",
            "eval.samples=8", "eval.pass_k=[1,4,8]", f"run.name={name}", "run.progress=false", *extra]
    assert cli.main(argv) == 0, argv
    return ws / "runs" / name


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A directory a reader might run the docs from: the files the docs define, fixture runs and data."""
    ws = tmp_path_factory.mktemp("docs_ws")
    old = os.getcwd()
    os.chdir(ws)
    try:
        for page in PAGES:
            for name, body in FILE_BLOCK.findall(page.read_text(encoding="utf-8")):
                (ws / name).write_text(body)
        write_toy_task(ws / "toy.jsonl", 40)
        (ws / "toy.py").write_text("def contains_seven(sample):\n    return float('7' in sample.info['text'])\n")
        rows = [{"question": f"What is {i} + 1?", "prompt": f"What is {i} + 1?", "answer": str(i + 1)}
                for i in range(40)]
        (ws / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        model = save_tiny_model(ws / "tiny_model")
        runs = {"name": _fixture_run(ws, "quickstart-fixture", model),
                "other": _fixture_run(ws, "quickstart-fixture-b", model, extra=("trainer.seed=1",)),
                "gspo": _fixture_run(ws, "gspo-fixture", model, recipe="gspo")}
        for key, names in RUN_NAMES.items():
            for name in names:
                (ws / "runs" / name).symlink_to(runs[key])
        for name in MODEL_NAMES:
            (ws / name).symlink_to(runs["name"] / "checkpoints" / "step-000020" / "model")
        for name, step in (("base.json", 10), ("step10.json", 10), ("step20.json", 20)):
            assert cli.main(["eval", str(runs["name"]), "--step", str(step), "--samples", "2", "--k", "[1,2]",
                             "--out", name]) == 0
        import datasets
        datasets.Dataset.from_list([json.loads(line) for line in (ws / "data.jsonl").read_text().splitlines()]
                                   ).save_to_disk(str(ws / "saved"))
        yield {"ws": ws, "model": model, "runs": runs, "values": _placeholders(ws, model, runs)}
    finally:
        os.chdir(old)


def _placeholders(ws: Path, model: Path, runs: dict[str, Path]) -> dict[str, str]:
    run, other = str(runs["name"]), str(runs["other"])
    ckpt = f"{run}/checkpoints/step-000020"
    return {"runs/<name>": run, "runs/<the run>": run, "RUN": run, "runs/<a>": run, "runs/<b>": other,
            "runs/<sft>": run, "runs/<rl>": other, "MODEL": str(model), "DIR": str(model),
            "OUT_DIR": "out_dir", "/path/to/hf_model_dir": str(model), "path/to/model": str(model),
            # the task-arithmetic example's base is the model its runs started from: here the tiny model
            "--base default": f"--base {model}",
            "--merge DIR": "--merge exported", "RUN/checkpoints/step-NNNNNN": ckpt, "<name>": "quickstart",
            "runs/my-run/checkpoints/step-000020/model": f"{ckpt}/model", "<recipe>": "quickstart",
            "/path/saved_with_save_to_disk": str(ws / "saved"), "S": "0", "N": "2",
            "/path/to/an/instruct/model": str(model), "/path/to/model.Q8_0.gguf": str(installed_default_gguf()),
            "<F_{T-1}>": str(model), "runs/<instructor run>": run}


def _run_cli(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def check(cmd: Command, workspace: dict, cwd: Path) -> None:
    """Run or dry-run one documented command from `cwd`, a fresh directory holding links to the workspace's
    files and runs (so outputs never meet an earlier command's); fail with the command and what it printed."""
    for entry in workspace["ws"].iterdir():
        (cwd / entry.name).symlink_to(entry)
    os.chdir(cwd)
    try:
        _check(cmd, workspace)
    finally:
        os.chdir(workspace["ws"])


def _check(cmd: Command, workspace: dict) -> None:
    text = fill(cmd.text, workspace["values"])
    argv = shlex.split(text)
    kind = cmd.kind
    if kind in ("train", "eval"):
        args = argv[1:] if len(argv) > 1 else ["train"]
        assert _run_cli([*args, *([] if "--dry-run" in args else ["--dry-run"])]) == 0, text
    elif kind == "torchrun":
        at = argv.index("lmrl.cli")
        assert _run_cli([*argv[at + 1:], "--dry-run"]) == 0, text
    elif kind in ("list", "help", "report", "compare", "export", "merge", "models"):
        assert _run_cli(argv[1:]) == 0, text
    elif kind == "serve":
        args = cli.parser().parse_args(argv[1:])
        from lmrl.models import resolve_model_path
        assert Path(resolve_model_path(args.model)).exists(), text
    elif kind == "python":
        target = ("-m", argv[2]) if argv[1] == "-m" else (str(ROOT / argv[1]),)
        returncode, stdout, stderr = _help(target)
        assert returncode == 0, f"{text}\n{stderr[-2000:]}"
        flags = {w.split("=")[0] for w in argv[2:] if w.startswith("--")}
        assert all(f in stdout for f in flags), f"{text}: flags {flags} not all in its --help"
    else:
        assert (ROOT / argv[1]).exists() or (workspace["ws"] / argv[1]).exists(), text


@functools.lru_cache(maxsize=None)
def _help(target: tuple[str, ...]) -> tuple[int, str, str]:
    """A script's or module's `--help` (once per target: several documented commands run the same script)."""
    done = subprocess.run([sys.executable, *target, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    return done.returncode, done.stdout, done.stderr


def script_commands(script: Script, tmp_path: Path) -> list[Command]:
    """The commands a documented script runs, as its shell expands them (programs replaced by recorders)."""
    shims, record = tmp_path / "bin", tmp_path / "record.jsonl"
    shims.mkdir(parents=True)
    for program in ("lmrl", "python", "torchrun"):
        (shims / program).write_text(SHIM.format(python=sys.executable))
        (shims / program).chmod(0o755)
    (tmp_path / "out").mkdir()
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "DOC_COMMANDS_RECORD": str(record)}
    done = subprocess.run(["bash", "-c", script.text], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"{script.path}:{script.line}: the script fails under bash: {done.stderr[-2000:]}"
    argvs = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return [Command(script.path, script.line, shlex.join(argv)) for argv in argvs]


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if not c.needs], ids=lambda c: f"{c.id} {c.text[:60]}")
def test_documented_command_runs_as_written(cmd, workspace, tmp_path):
    check(cmd, workspace, tmp_path)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: f"{s.path}:{s.line}")
def test_documented_script_runs_as_written(script, workspace, tmp_path):
    commands = script_commands(script, tmp_path / "shell")
    assert commands, f"{script.path}:{script.line}: the script runs no command"
    for i, cmd in enumerate(commands):
        (tmp_path / str(i)).mkdir()
        check(cmd, workspace, tmp_path / str(i))


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.needs], ids=lambda c: f"{c.id} {c.text[:60]}")
def test_a_command_that_cannot_run_here_says_why(cmd):
    assert set(cmd.needs) <= KNOWN_NEEDS, f"{cmd.id}: unknown mark {cmd.needs}; known: {sorted(KNOWN_NEEDS)}"
    assert cmd.argv


def test_the_extraction_finds_every_kind_of_command():
    kinds = {c.kind for c in COMMANDS}
    assert {"train", "eval", "compare", "report", "export", "merge", "serve", "list", "torchrun", "python"} <= kinds
    assert len(COMMANDS) > 100


def test_every_result_page_names_the_commands_behind_its_numbers():
    """A page of measurements (`*_result.md`) says how to reproduce them, with a command this test checks."""
    pages = {str(p.relative_to(ROOT)) for p in PAGES if p.name.endswith("_result.md")}
    named = {c.path for c in COMMANDS} | {s.path for s in SCRIPTS}
    assert pages and pages <= named, f"result pages naming no command: {sorted(pages - named)}"


def test_a_broken_documented_command_fails(workspace, tmp_path):
    """The check is not a formality: a doc page with a misspelt key, an unknown recipe or a missing run fails."""
    page = tmp_path / "broken.md"
    page.write_text("```bash\nlmrl train quickstart trainer.lrr=1e-5\nlmrl train no_such_recipe\n"
                    "lmrl report runs/missing\nlmrl list rewardz\n```\n")
    broken = extract([page], tmp_path)
    assert len(broken) == 4
    for i, cmd in enumerate(broken):
        (tmp_path / str(i)).mkdir()
        with pytest.raises(AssertionError):
            check(cmd, workspace, tmp_path / str(i))


@pytest.mark.parametrize("text", list(REAL_RUNS))
def test_documented_training_runs_for_real(text, workspace, tmp_path):
    assert any(c.text == text for c in COMMANDS), f"{text!r} is no longer documented"
    argv = [*shlex.split(text)[1:], *shlex.split(REAL_RUNS[text]), f"run.output_dir={tmp_path}", "run.progress=false"]
    done = subprocess.run([sys.executable, "-m", "lmrl.cli", *argv], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = [json.loads(line) for line in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    assert any(row.get("step") == 1 for row in metrics)
