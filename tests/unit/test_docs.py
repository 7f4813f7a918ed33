"""The README and docs/ stay true: every `reconciler ...` command line in their code blocks parses
with the real parser, every relative link and `#anchor` leads somewhere, the README stays short,
and docs/commands.md is what the parser generates."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from reconciler.cli import reference
from reconciler.cli.parser import build_parser, parse

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# Code blocks in these languages are shell; untagged ones may hold a shell session too.
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console", "zsh"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
# `<head>`, `<name>`: a placeholder stands for one word; it is parsed as one.
PLACEHOLDER = re.compile(r"<[A-Za-z][\w .-]*>")
REDIRECTIONS = {">", ">>", "<", "<<", ">&", "&>", ">|", "<&", "&>>"}
SEPARATORS = {"|", "||", "&&", ";", "&", "|&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
RECONCILER = {"reconciler", "$(command -v reconciler)"}


def code_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of each fenced code block."""
    blocks: list[tuple[int, str, list[str]]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, language, body, start = opening.group(2), opening.group(3).lower(), [], index + 2
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index])
            index += 1
        blocks.append((start, language, body))
        index += 1
    return blocks


def shell_lines(body: list[str], start: int) -> list[tuple[int, str]]:
    """(line number, text) of each logical line: backslash continuations joined, `$ ` prompts off."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, raw in enumerate(body):
        number = start + offset
        line = raw.strip()
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line
            pending = None
        if line.endswith("\\"):
            pending = (number, line[:-1])
            continue
        joined.append((number, line.removeprefix("$ ")))
    if pending is not None:
        joined.append(pending)
    return joined


def reconciler_argvs(line: str) -> list[list[str]]:
    """The arguments of every `reconciler` command on a shell line: comments, pipes, `&&`,
    redirections, `sudo` and leading `VAR=value` assignments taken off. [] when the line runs
    no reconciler (or is no shell at all)."""
    if not re.search(r"\breconciler\b", line) or line.startswith("#"):
        return []
    line = re.sub(r"(?<![\w-])\d+(?=>)", "", PLACEHOLDER.sub("placeholder", line))  # 2>&1, 2>file: the fd off
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: prose or output, not a command
        return []
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
        elif token in SEPARATORS:
            commands.append([])
        elif token in REDIRECTIONS:
            skip_next = True  # the file redirected to
        else:
            commands[-1].append(token)
    found = []
    for words in commands:
        while words and (ASSIGNMENT.match(words[0]) or words[0] in {"sudo", "exec", "time"}):
            words = words[1:]
        if words and words[0] in RECONCILER:
            found.append(words[1:])
    return found


def documented_commands() -> list[tuple[str, list[str]]]:
    """("file:line", argv) of every reconciler command in the shell blocks of the README and docs/."""
    commands = []
    for document in DOCUMENTS:
        for start, language, body in code_blocks(document.read_text(encoding="utf-8")):
            if language not in SHELL_BLOCKS:
                continue
            for number, line in shell_lines(body, start):
                for argv in reconciler_argvs(line):
                    commands.append((f"{document.relative_to(ROOT)}:{number}", argv))
    return commands


def parse_error(argv: list[str]) -> str | None:
    """What the real parser says against `argv` (None: it parses)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            parse(build_parser(argv), argv)
    except SystemExit as exit:
        if exit.code not in (0, None):  # 0: --help or --version
            return stderr.getvalue().strip() or f"exit {exit.code}"
    return None


def test_the_documents_show_commands_at_all() -> None:
    """The search finds what it looks for (a parser change that found nothing would pass everything)."""
    found = {argv[0] for _, argv in documented_commands() if argv}
    assert {"init", "doctor", "plan", "apply", "status", "rotate-key", "uninstall", "pi"} <= found


def test_every_documented_command_parses() -> None:
    problems = [
        f"{where}: reconciler {shlex.join(argv)}\n    {error}"
        for where, argv in documented_commands()
        if (error := parse_error(argv)) is not None
    ]
    assert not problems, "commands in the docs the parser refuses:\n" + "\n".join(problems)


def test_a_wrong_command_is_caught() -> None:
    """The check itself: a mistyped option and a removed command fail to parse."""
    assert reconciler_argvs('sudo "$(command -v reconciler)" plan --bogus | tee x  # c') == [["plan", "--bogus"]]
    assert parse_error(["plan", "--bogus"]) is not None
    assert parse_error(["nonesuch"]) is not None
    assert parse_error(["logs", "r0", "--tail", "50"]) is None


def test_shell_lines_are_read_as_a_shell_reads_them() -> None:
    assert reconciler_argvs("RECONCILER_SPEC=/etc/x.yaml reconciler run") == [["run"]]
    assert reconciler_argvs("reconciler completion zsh > ~/.zfunc/_reconciler  # fpath") == [["completion", "zsh"]]
    assert reconciler_argvs("cd ~/spark && reconciler init --worker me@<worker>") == [
        ["init", "--worker", "me@placeholder"]
    ]
    assert reconciler_argvs("reconciler logs r0 --tail 50 2>&1 > out.txt") == [["logs", "r0", "--tail", "50"]]
    assert reconciler_argvs("journalctl -u spark-reconciler -f") == []


# --- links -------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str, spans: bool = False) -> str:
    """The text without its fenced code blocks and, unless `spans`, its inline code spans (a link
    there is code; a heading keeps its spans)."""
    kept, fence = [], None
    for line in text.splitlines():
        opening = FENCE.match(line)
        if fence is None and opening is not None:
            fence = opening.group(2)
            kept.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            kept.append("")
        else:
            kept.append(line if spans else re.sub(r"(`+).*?\1", "", line))
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as shown (links and emphasis marks off), lowercase,
    punctuation dropped but '-' and '_', each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in `path`, a repeated one with GitHub's -1, -2 suffixes."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8"), spans=True).splitlines():
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(document: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `document` to a missing file or heading, as "file:line: target: why"."""
    problems = []
    text = prose(document.read_text(encoding="utf-8"))
    for number, line in enumerate(text.splitlines(), start=1):
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            linked = (document.parent / path_part).resolve() if path_part else document
            where = f"{document.relative_to(root)}:{number}: {target}"
            if not linked.exists():
                problems.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}: no heading #{anchor} in {linked.relative_to(root)}")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_and_anchor_leads_somewhere(document: Path) -> None:
    problems = broken_links(document)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## The `run` loop: day two\n")
    page.write_text(
        "# Page\n\n[ok](other.md#the-run-loop-day-two) [self](#page) [gone](missing.md) "
        "[bad anchor](other.md#nonesuch)\n\n```sh\n[not a link](nowhere.md)\n```\n"
    )
    problems = broken_links(page, root=tmp_path)
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "missing.md: no such file",
        "other.md#nonesuch: no heading #nonesuch in other.md",
    ]


def test_slugs_follow_github() -> None:
    assert slug("A first spec: `reconciler init`") == "a-first-spec-reconciler-init"
    assert slug("Our bench against vLLM's, on real vLLM: `make bench-vllm`") == (
        "our-bench-against-vllms-on-real-vllm-make-bench-vllm"
    )
    assert slug("TLS (`api.tls`)") == "tls-apitls"


# --- the README's size, the generated command reference ----------------------------------------


def test_the_readme_stays_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < 400, f"README.md has {lines} lines: move detail into docs/ (it is the owner's first read)"


def test_the_command_reference_is_current() -> None:
    committed = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert committed == reference.reference(), f"docs/commands.md is out of date: run `{reference.REGENERATE}`"
