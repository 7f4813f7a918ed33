"""docs/commands.md, generated from the argument tree: every command's summary, description,
usage, options (with the defaults `--help` shows) and examples, as `--help` prints them.

    .venv/bin/python -m reconciler.cli.reference > docs/commands.md

tests/unit/test_docs.py fails when the committed file differs from what this prints.
"""

from __future__ import annotations

import argparse
import re
import sys

from reconciler.cli.parser import HelpFormatter, bench_compare_parser, build_parser

REGENERATE = ".venv/bin/python -m reconciler.cli.reference > docs/commands.md"
# Usage lines are wrapped at this width whatever the terminal, so the file is the same everywhere.
WIDTH = 100


def reference() -> str:
    """The whole command reference as Markdown."""
    top = build_parser()
    lines = [
        "# Command reference",
        "",
        f"<!-- Generated from reconciler/cli/parser.py by `{REGENERATE}`; do not edit by hand. -->",
        "",
        f"{top.description}",
        "",
        "Each section below is what that command's `--help` says. Conventions shared by every command "
        "(exit codes, `--json`, errors, completion) are in [operations.md](operations.md#the-command-line).",
        "",
        "```text",
        _usage(top),
        "```",
        "",
        "| argument | meaning |",
        "| --- | --- |",
        *(_row(top.prog, action) for action in top._actions if _shown(action)),
        "",
        *_examples_block(top.epilog),
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    sections: list[str] = []
    for name, summary in _subcommands(top):
        full = _subparser(build_parser([name]), name)
        lines.append(f"| [`reconciler {name}`](#{_slug('reconciler ' + name)}) | {_cell(summary)} |")
        sections += _section(full, summary)
        for action, action_summary in _subcommands(full):
            sections += _section(_subparser(full, action), action_summary, level="###")
        if name == "bench":
            compare = bench_compare_parser()
            sections += _section(compare, "compare two bench reports", level="###")
    return "\n".join([*lines, "", *sections]).rstrip("\n") + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(name, summary) of each subcommand, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return [(choice.dest, choice.help or "") for choice in action._choices_actions]
    return []


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    raise KeyError(name)


def _section(parser: argparse.ArgumentParser, summary: str, level: str = "##") -> list[str]:
    lines = [f"{level} `{parser.prog}`", "", f"*{_escape(summary)}*", ""]
    if parser.description:
        lines += [_escape(parser.description), ""]
    lines += ["```text", _usage(parser), "```", ""]
    rows = [_row(parser.prog, action) for action in parser._actions if _shown(action)]
    if rows:
        lines += ["| argument | meaning |", "| --- | --- |", *rows, ""]
    if parser.epilog:
        lines += [*_examples_block(parser.epilog), ""]
    return lines


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = HelpFormatter(prog=parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip("\n")


def _shown(action: argparse.Action) -> bool:
    return (
        not isinstance(action, argparse._HelpAction | argparse._SubParsersAction) and action.help != argparse.SUPPRESS
    )


def _row(prog: str, action: argparse.Action) -> str:
    formatter = HelpFormatter(prog=prog, width=WIDTH)
    invocation = formatter._format_action_invocation(action)
    meaning = formatter._expand_help(action) if action.help else ""
    if action.required and action.option_strings:
        meaning = f"required; {meaning}"
    return f"| `{_cell(invocation)}` | {_cell(_escape(meaning))} |"


def _examples_block(epilog: str | None) -> list[str]:
    """The epilog's `examples:` lines as a shell block; any text after them as a paragraph."""
    if not epilog:
        return []
    text = epilog.removeprefix("examples:\n")
    examples = [line[2:] for line in text.splitlines() if line.startswith("  ")]
    rest = " ".join(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("  "))
    lines = ["Examples:", "", "```sh", *examples, "```"] if examples else []
    return [*lines, *(["", _escape(rest)] if rest else [])]


def _escape(text: str) -> str:
    """`<` and `>` outside code spans would read as HTML in Markdown."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _cell(text: str) -> str:
    """Text inside a table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


if __name__ == "__main__":
    sys.stdout.write(reference())
