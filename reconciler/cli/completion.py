"""Shell completion for bash and zsh, generated from the argument tree itself.

Generated rather than hand-written so it can never fall behind the commands; static (the script
holds the whole tree) so completing a word never starts Python, and so `reconciler completion`
needs no completion library. Both scripts share one shape: walk the words typed so far to find
the command path ("", "plan", "pi install"), then offer that path's subcommands, its options, the
values an option takes (choices or file names), or its positional words.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from reconciler.cli.common import EXIT_OK

FILE = "@file"  # the option takes a path: complete file names
ANY = "@any"  # the option takes a free value: offer nothing
FILE_METAVARS = {"PATH", "FILE"}
# Positionals whose words are known though argparse has no choices for them.
POSITIONAL_WORDS = {"logs": ["r0", "r1", "memguard"], "bench": ["compare"]}


@dataclass
class Option:
    flags: list[str]
    help: str
    value: str | None  # None: a flag; FILE, ANY, or the choices separated by spaces


@dataclass
class Command:
    help: str = ""
    options: list[Option] = field(default_factory=list)
    positional: list[str] = field(default_factory=list)
    children: dict[str, Command] = field(default_factory=dict)


def tree(parser: argparse.ArgumentParser, path: str = "") -> Command:
    node = Command(positional=list(POSITIONAL_WORDS.get(path, [])))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                node.children[name] = tree(child, f"{path} {name}".strip())
                node.children[name].help = helps.get(name, "")
        elif action.option_strings:
            node.options.append(Option(list(action.option_strings), _one_line(action.help), _value_kind(action)))
        elif action.choices:
            node.positional += [str(choice) for choice in action.choices]
    return node


def _value_kind(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return None
    if action.choices:
        return " ".join(str(choice) for choice in action.choices)
    return FILE if action.metavar in FILE_METAVARS else ANY


def _one_line(text: str | None) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    return " ".join(text.replace("%(default)s", "").replace("%%", "%").split())


def paths(root: Command) -> list[tuple[str, Command]]:
    """Every command path, the root first: ("", root), ("plan", ...), ("pi install", ...).
    The shell scripts call it their `cmdpath` (zsh's `path` is the PATH array)."""
    found = [("", root)]
    for name, child in root.children.items():
        found += [(f"{name} {sub}".strip(), command) for sub, command in paths(child)]
    return found


def _case(arms: list[tuple[str, str]]) -> str:
    """A `case` on "$1", one arm per command path; the same syntax in bash and zsh, and a quoted
    pattern matches literally in both."""
    lines = ['    case "$1" in']
    lines += [f"        {_quote(pattern)}) {body} ;;" for pattern, body in arms]
    lines.append("    esac")
    return "\n".join(lines)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _words(words: list[str]) -> str:
    return "echo " + _quote(" ".join(words))


def _value_arms(items: list[tuple[str, Command]]) -> list[tuple[str, str]]:
    return [
        (f"{path}|{flag}", _words([option.value]))
        for path, command in items
        for option in command.options
        if option.value is not None
        for flag in option.flags
    ]


def _common_functions(root: Command) -> str:
    items = paths(root)
    children = [(path, _words(list(command.children))) for path, command in items if command.children]
    options = [(path, _words([f for o in command.options for f in o.flags])) for path, command in items]
    positional = [(path, _words(command.positional)) for path, command in items if command.positional]
    return "\n".join(
        [
            "_reconciler_children() {",
            _case(children),
            "}",
            "_reconciler_options() {",
            _case(options),
            "}",
            "_reconciler_value() {  # $1: command path and option, as 'plan|--spec'",
            _case(_value_arms(items)),
            "}",
            "_reconciler_positional() {",
            _case(positional),
            "}",
        ]
    )


BASH_MAIN = r"""
_reconciler() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local cmdpath="" word i kind
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        [[ $word == -* ]] && continue
        [[ " $(_reconciler_children "$cmdpath") " == *" $word "* ]] && cmdpath="${cmdpath:+$cmdpath }$word"
    done
    if [[ $prev == -* ]]; then
        kind="$(_reconciler_value "$cmdpath|$prev")"
        case "$kind" in
            @file) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
            @any) COMPREPLY=(); return ;;
            ?*) mapfile -t COMPREPLY < <(compgen -W "$kind" -- "$cur"); return ;;
        esac
    fi
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_reconciler_options "$cmdpath")" -- "$cur")
        return
    fi
    local words="$(_reconciler_children "$cmdpath") $(_reconciler_positional "$cmdpath")"
    if [[ -n ${words// /} ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
    else
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
}
complete -F _reconciler reconciler
"""


def bash_script(root: Command) -> str:
    header = "# bash completion for reconciler; generated by `reconciler completion bash`\n"
    return header + _common_functions(root) + "\n" + BASH_MAIN.lstrip("\n")


ZSH_MAIN = r"""
_reconciler() {
    local cur="${words[CURRENT]}" prev="${words[CURRENT-1]}"
    local cmdpath="" word kind i
    local -a found
    for ((i = 2; i < CURRENT; i++)); do
        word="${words[i]}"
        [[ $word == -* ]] && continue
        found=(${=$(_reconciler_children "$cmdpath")})
        (( ${found[(Ie)$word]} )) && cmdpath="${cmdpath:+$cmdpath }$word"
    done
    if [[ $prev == -* ]]; then
        kind="$(_reconciler_value "$cmdpath|$prev")"
        case "$kind" in
            @file) _files; return ;;
            @any) return ;;
            ?*) compadd -- ${=kind}; return ;;
        esac
    fi
    local -a described
    if [[ $cur == -* ]]; then
        described=("${(@f)$(_reconciler_option_help "$cmdpath")}")
        _describe -t options 'option' described
        return
    fi
    described=("${(@f)$(_reconciler_command_help "$cmdpath")}")
    found=(${=$(_reconciler_positional "$cmdpath")})
    if (( ${#described} )) && [[ -n ${described[1]} ]]; then
        _describe -t commands 'command' described
    elif (( ${#found} )); then
        compadd -- $found
    else
        _files
    fi
}
_reconciler "$@"
"""


def _described(pairs: list[tuple[str, str]]) -> str:
    """Lines "name:description" for zsh's _describe, whose separator is an unescaped colon."""
    return "printf '%s\\n' " + " ".join(_quote(f"{n.replace(':', chr(92) + ':')}:{d}") for n, d in pairs)


def zsh_script(root: Command) -> str:
    items = paths(root)
    command_help = [
        (path, _described([(name, child.help) for name, child in command.children.items()]))
        for path, command in items
        if command.children
    ]
    option_help = [
        (path, _described([(flag, option.help) for option in command.options for flag in option.flags]))
        for path, command in items
    ]
    return "\n".join(
        [
            "#compdef reconciler",
            "# zsh completion for reconciler; generated by `reconciler completion zsh`",
            _common_functions(root),
            "_reconciler_command_help() {",
            _case(command_help),
            "}",
            "_reconciler_option_help() {",
            _case(option_help),
            "}",
            ZSH_MAIN.lstrip("\n"),
        ]
    )


def print_script(args: argparse.Namespace) -> int:
    from reconciler.cli.parser import build_parser

    root = tree(build_parser())
    sys.stdout.write(bash_script(root) if args.shell == "bash" else zsh_script(root))
    return EXIT_OK
