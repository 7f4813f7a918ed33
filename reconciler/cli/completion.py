"""Shell completion for bash and zsh, generated from the argument tree itself.

Generated rather than hand-written so it can never fall behind the commands; static (the script
holds the whole tree) so completing a word never starts Python, and so `reconciler completion`
needs no completion library. Both scripts share one shape. They walk the words typed so far as
argparse would: subcommand names extend the command path ("", "plan", "pi install"); an option
that takes one value consumes the next word, one that takes several (`--conc 1 2`) the words up
to the next option; every other word fills the command's next positional slot. Then they offer
what the word being typed can be: the option's value (its choices or file names, also after
`--option=`), the command's options, its subcommands, or what its next positional slot takes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from reconciler.cli.common import EXIT_OK

FILE = "@file"  # file names
ANY = "@any"  # a free value: offer nothing
END = "@end"  # the command takes no more positionals: offer its options
FILE_METAVARS = {"PATH", "FILE"}
# Positional slots whose words argparse does not know (no choices): by command path and dest.
SLOT_WORDS = {("logs", "which"): "r0 r1 memguard", ("bench", "url"): "compare"}


@dataclass
class Option:
    flags: list[str]
    help: str
    value: str | None  # None: a flag; FILE, ANY, or the choices separated by spaces
    many: bool = False  # takes several values (nargs * or +)


@dataclass
class Command:
    help: str = ""
    options: list[Option] = field(default_factory=list)
    slots: list[str] = field(default_factory=list)  # what each positional takes, in order
    last_repeats: bool = False  # the last slot takes any number of words
    children: dict[str, Command] = field(default_factory=dict)


def tree(parser: argparse.ArgumentParser, path: str = "") -> Command:
    node = Command()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                node.children[name] = tree(child, f"{path} {name}".strip())
                node.children[name].help = helps.get(name, "")
        elif action.option_strings:
            many = action.nargs in ("*", "+")
            node.options.append(Option(list(action.option_strings), _one_line(action.help), _kind(action), many))
        else:
            node.slots.append(SLOT_WORDS.get((path, action.dest)) or _kind(action) or ANY)
            node.last_repeats = action.nargs in ("*", "+")
    return node


def _kind(action: argparse.Action) -> str | None:
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


def _function(name: str, arms: list[tuple[str, str]], default: str = "", about: str = "") -> str:
    """A shell function that is one `case` on "$1", one arm per pattern; the same syntax in bash
    and zsh. Patterns are quoted (literal in both shells) except a trailing `*`, which stays a glob."""
    lines = [f"{name}() {{{f'  # {about}' if about else ''}", '    case "$1" in']
    for pattern, body in arms:
        glob = pattern.endswith("*")
        lines.append(f"        {_quote(pattern[:-1] if glob else pattern)}{'*' if glob else ''}) {body} ;;")
    if default:
        lines.append(f"        *) {default} ;;")
    return "\n".join([*lines, "    esac", "}"])


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _words(words: list[str]) -> str:
    return "echo " + _quote(" ".join(words))


def _common_functions(root: Command) -> list[str]:
    items = paths(root)
    flags = [
        (f"{path}|{flag}", option) for path, command in items for option in command.options for flag in option.flags
    ]
    slots = [
        (f"{path}|{'*' if command.last_repeats and index == len(command.slots) - 1 else index}", _words([kind]))
        for path, command in items
        for index, kind in enumerate(command.slots)
    ]
    return [
        _function("_reconciler_children", [(path, _words(list(c.children))) for path, c in items if c.children]),
        _function(
            "_reconciler_options", [(path, _words([f for o in c.options for f in o.flags])) for path, c in items]
        ),
        _function(
            "_reconciler_value",
            [(key, _words([option.value])) for key, option in flags if option.value is not None],
            about="$1: 'path|--flag'; what its value is",
        ),
        _function(
            "_reconciler_nargs",
            [(key, _words(["*" if option.many else "1" if option.value else "0"])) for key, option in flags],
            default="echo 0",
            about="$1: 'path|--flag'; 0, 1 or * values",
        ),
        _function("_reconciler_slot", slots, default=f"echo {END}", about="$1: 'path|N'; what positional N takes"),
    ]


# The walk, in the syntax both shells share ([[ ]], (( )), case, local); each script binds
# `words_typed` (the words before the cursor, the command name first) and `cur` before it.
WALK = r"""
    local cmdpath="" word pending="" many="" kind
    local -i npos=0 i
    for ((i = 2; i <= ${#words_typed[@]}; i++)); do
        word="${words_typed[$((i - 1 + _reconciler_base))]}"
        if [[ -n $pending ]]; then pending=""; continue; fi
        if [[ $word == -* ]]; then
            many=""
            [[ $word == *=* ]] && continue
            case "$(_reconciler_nargs "$cmdpath|$word")" in
                1) pending="$word" ;;
                '*') many="$word" ;;
            esac
            continue
        fi
        [[ -n $many ]] && continue
        if (( npos == 0 )) && [[ " $(_reconciler_children "$cmdpath") " == *" $word "* ]]; then
            cmdpath="${cmdpath:+$cmdpath }$word"
            continue
        fi
        npos=$((npos + 1))
    done
    local prefix=""
    if [[ $cur == --*=* ]]; then
        pending="${cur%%=*}"; prefix="${cur%%=*}="; cur="${cur#*=}"
    elif [[ -z $pending && -n $many && $cur != -* ]]; then
        pending="$many"
    fi
    if [[ -n $pending ]]; then
        kind="$(_reconciler_value "$cmdpath|$pending")"
    elif [[ $cur == -* ]]; then
        kind="@options"
    else
        kind="$(_reconciler_slot "$cmdpath|$npos")"
        (( npos == 0 )) && [[ -n $(_reconciler_children "$cmdpath") ]] && kind="@commands"
        [[ $kind == @end ]] && kind="@options"
    fi
"""

BASH_MAIN = (
    r"""
_reconciler() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    local -a words_typed=("${COMP_WORDS[@]:0:COMP_CWORD}")
    local -i _reconciler_base=0
"""
    + WALK
    + r"""
    case "$kind" in
        @file) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
        @any) COMPREPLY=() ;;
        @options) mapfile -t COMPREPLY < <(compgen -W "$(_reconciler_options "$cmdpath")" -- "$cur") ;;
        @commands) mapfile -t COMPREPLY < <(compgen -W "$(_reconciler_children "$cmdpath")" -- "$cur") ;;
        *) mapfile -t COMPREPLY < <(compgen -W "$kind" -- "$cur") ;;
    esac
    if [[ -n $prefix && $kind != @file ]]; then
        COMPREPLY=("${COMPREPLY[@]/#/$prefix}")
    fi
}
complete -F _reconciler reconciler
"""
)


def bash_script(root: Command) -> str:
    header = "# bash completion for reconciler; generated by `reconciler completion bash`\n"
    return header + "\n".join(_common_functions(root)) + "\n" + BASH_MAIN.lstrip("\n")


ZSH_MAIN = (
    r"""
_reconciler() {
    local cur="${words[CURRENT]}"
    local -a words_typed=("${(@)words[1,CURRENT-1]}")
    local -i _reconciler_base=1
"""
    + WALK
    + r"""
    local -a described
    case "$kind" in
        @file) _files ;;
        @any) return 1 ;;
        @options)
            described=("${(@f)$(_reconciler_option_help "$cmdpath")}")
            _describe -t options 'option' described ;;
        @commands)
            described=("${(@f)$(_reconciler_command_help "$cmdpath")}")
            _describe -t commands 'command' described ;;
        *) compadd -P "$prefix" -- ${=kind} ;;
    esac
}
_reconciler "$@"
"""
)


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
            *_common_functions(root),
            _function("_reconciler_command_help", command_help),
            _function("_reconciler_option_help", option_help),
            ZSH_MAIN.lstrip("\n"),
        ]
    )


def print_script(args: argparse.Namespace) -> int:
    from reconciler.cli.parser import build_parser

    root = tree(build_parser())
    sys.stdout.write(bash_script(root) if args.shell == "bash" else zsh_script(root))
    return EXIT_OK
