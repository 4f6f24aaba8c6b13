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
KNOWN_NEEDS = {"cuda", "hub", "several gpus", "an endpoint", "your data", "the runs above"}


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


REDIRECTION = re.compile(r"\s+(?:\d?>>?\s*\S+|\d>&\d)(?=\s|$)")


def _without_redirections(text: str) -> str:
    """The command without the shell's output redirections (`> log 2>&1`): where output goes is not its part."""
    return REDIRECTION.sub("", text).strip()


def _commands_of_line(path: str, number: int, line: str, in_table: bool) -> list[Command]:
    if in_table:
        found = []
        for cell in re.findall(r"`([^`]+)`", line):
            if _starts_with_program(cell) and len(cell.split()) > 2 and "|" not in cell:
                found.append(Command(path, number, cell.strip(), MARK.findall(line), in_table=True))
        return found
    text, comment = _split_comment(line.strip())
    parts = [_without_redirections(part.strip().removesuffix(" &")) for part in text.split(" && ")]
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
        rel = str(path.relative_to(root))
        found = _fenced_and_tabled(path, rel, {script.line for script in extract_scripts([path], root)})
        commands += sorted(found + _prose_commands(path, rel), key=lambda c: c.line)
    return commands


def _fenced_and_tabled(path: Path, rel: str, scripts: set[int]) -> list[Command]:
    """The commands of one page's shell blocks (not its scripts) and table rows."""
    commands: list[Command] = []
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
            if raw.lstrip().startswith("|"):
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


ENV_PREFIX = re.compile(r"^(?:[A-Z_]+=\S+\s+)+")


def _prose_commands(path: Path, rel: str) -> list[Command]:
    """Backticked commands in running text (outside fences and tables), a span may wrap a line: those that
    name a script or module (`python benchmarks/x.py …`, `python -m lmrl.…`) or an `lmrl` subcommand with
    arguments, which is how a page names the command behind its numbers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fence = False
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            fence = not fence
            lines[i] = ""
        elif fence or line.lstrip().startswith("|"):
            lines[i] = ""
    text = "\n".join(lines)
    found = []
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = _without_redirections(ENV_PREFIX.sub("", " ".join(match.group(1).split())))
        words = span.split()
        if not _starts_with_program(span) or len(words) < 3 or words[0] == "bash":
            continue
        if words[0] == "python" and words[1] != "-m" and not words[1].endswith(".py"):
            continue  # the interpreter's own flags, not a command
        found.append(Command(rel, text.count("\n", 0, match.start()) + 1, span, MARK.findall(span)))
    return found


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
