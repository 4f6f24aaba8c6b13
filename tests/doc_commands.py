"""The shell commands README.md and docs/ show, as the reader sees them: extracted, classified, filled in.

A command is a line of a fenced shell block (``bash``, ``sh``, ``console`` or unlabelled) that starts
with a program this project ships or documents (`lmrl`, `torchrun`, `python`, `bash`), continued over
trailing backslashes, or a backticked command in a table row. Its trailing `# comment` is prose for the
reader, except for a mark in square brackets that says why the command cannot run on the machine the
docs are written for (a 2-core CPU, no GPU, no model hub): `[needs: cuda]`, `[needs: hub]`,
`[needs: <what>]`. A marked command is still parsed and its mark checked (`needs_are_real`).

Placeholders stand for the reader's own things: `runs/<name>` and `RUN` for a run directory, `<...>`
in general, `MODEL`, `DIR`, `OUT_DIR`, `S` for a seed, `N` for a count, `…` for "the rest".
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("lmrl", ".venv/bin/lmrl", "torchrun", "python", "bash")
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
MARK = re.compile(r"\[needs: ([^\]]+)\]")
KINDS = ("train", "eval", "compare", "report", "export", "merge", "serve", "list", "models")
KNOWN_NEEDS = {"cuda", "hub", "several gpus", "an endpoint", "your data"}


@dataclass
class Command:
    """One documented command: where it is, its text (comment removed), its words and marks."""

    path: str
    line: int
    text: str
    needs: list[str] = field(default_factory=list)
    in_table: bool = False

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def kind(self) -> str:
        """train | eval | … (an `lmrl` subcommand), help, torchrun, python, setup."""
        words = self.argv
        program = words[0]
        if program.endswith("lmrl"):
            if len(words) == 1 or words[1] in ("-h", "--help", "--version"):
                return "help" if len(words) > 1 else "train"
            return words[1]
        if program == "torchrun":
            return "torchrun"
        if program == "python":
            return "python"
        return "setup"

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def _split_comment(line: str) -> tuple[str, str]:
    """(the command, its trailing comment): a `#` outside quotes that follows a space starts the comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:]
    return line.rstrip(), ""


def _starts_with_program(text: str) -> bool:
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    return first in PROGRAMS


def _commands_of_line(path: str, number: int, line: str, in_table: bool) -> list[Command]:
    if in_table:
        found = []
        for cell in re.findall(r"`([^`]+)`", line):
            if (_starts_with_program(cell) and len(cell.split()) > 2 and "|" not in cell
                    and line.lstrip().startswith("|")):
                found.append(Command(path, number, cell.strip(), MARK.findall(line), in_table=True))
        return found
    text, comment = _split_comment(line.strip())
    parts = [part.strip().removesuffix(" &").strip() for part in text.split(" && ")]
    return [Command(path, number, part, MARK.findall(comment)) for part in parts if _starts_with_program(part)]


SCRIPT = re.compile(r"\$\(|\$\{|\$[A-Za-z_]|^\s*for |\(\) \{", re.M)


@dataclass
class Script:
    """A shell block with variables, loops or functions: its commands exist only once the shell expands it."""

    path: str
    line: int
    text: str


def _blocks(path: Path):
    """(first line number, language, text) of each fenced block."""
    start, lang, body = 0, None, []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if raw.strip().startswith("```"):
            if lang is None:
                start, lang, body = number + 1, raw.strip()[3:].strip(), []
            else:
                yield start, lang, "\n".join(body) + "\n"
                lang = None
        elif lang is not None:
            body.append(raw)


def extract_scripts(paths: list[Path], root: Path) -> list[Script]:
    """The documented shell blocks that are scripts (run by the test under a shell that records commands)."""
    return [Script(str(path.relative_to(root)), start, text) for path in paths for start, lang, text in _blocks(path)
            if lang in SHELL_LANGS and SCRIPT.search(text)]


def extract(paths: list[Path], root: Path) -> list[Command]:
    """Every documented command of these markdown files, in order (scripts apart: `extract_scripts`)."""
    commands: list[Command] = []
    for path in paths:
        scripts = {script.line for script in extract_scripts([path], root)}
        rel = str(path.relative_to(root))
        fence: str | None = None
        pending = ""
        pending_line = 0
        for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stripped = raw.strip()
            if stripped.startswith("```"):
                fence = None if fence is not None else stripped[3:].strip()
                if fence is not None and number + 1 in scripts:
                    fence = "script"
                continue
            if fence is None:
                commands += _commands_of_line(rel, number, raw, in_table=True)
                continue
            if fence not in SHELL_LANGS:
                continue
            body, comment = _split_comment(stripped)
            if pending:
                body = f"{pending} {body}"
            else:
                pending_line = number
            if body.endswith("\\"):
                pending = body[:-1].strip()
                continue
            pending = ""
            line = body + (f"  # {comment}" if comment else "")
            commands += _commands_of_line(rel, pending_line, line, in_table=False)
    return commands


PLACEHOLDERS = [
    (re.compile(r"\[needs: [^\]]+\]"), ""),
    (re.compile(r"…"), ""),
]


def fill(text: str, values: dict[str, str]) -> str:
    """The command with its placeholders replaced: `values` maps a placeholder (as written) to a path."""
    for pattern, repl in PLACEHOLDERS:
        text = pattern.sub(repl, text)
    for placeholder in sorted(values, key=len, reverse=True):
        text = re.sub(rf"(?<![\w/.-]){re.escape(placeholder)}(?![\w<>-])", values[placeholder], text)
    return text.strip()
