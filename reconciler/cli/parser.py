"""The argument tree: every command with a description, examples and its defaults shown.

Light imports only (see the package docstring): handlers are named, not imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn

from reconciler import __version__, constants
from reconciler.cli.common import EXIT_ERROR


class CommandParser(argparse.ArgumentParser):
    """A usage error exits 1 like any other error (argparse's 2 means "changes" here), with a hint:
    the command meant, for a mistyped one. No command at all asks for the help, which is shown."""

    # Whether the command line named commands only, no option: set by `parse`.
    words_only = False

    def error(self, message: str) -> NoReturn:
        missing = message.removeprefix("the following arguments are required: ")
        asked = missing != message and missing.split(",")[0] in {"COMMAND", "ACTION"}
        if asked and CommandParser.words_only and self._commands() is not None:
            self.print_help(sys.stdout)
            self.exit(0)
        self.print_usage(sys.stderr)
        hint = self._did_you_mean(message) or f"`{self.prog} --help` lists the options"
        self.exit(EXIT_ERROR, f"{self.prog}: error: {_plain(message)}\n  hint: {hint}\n")

    def _commands(self) -> list[str] | None:
        """The names of this parser's subcommands (None: it has none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return list(action.choices)
        return None

    def _did_you_mean(self, message: str) -> str | None:
        import difflib
        import re

        typed = re.search(r"invalid choice: '([^']*)'", message)
        commands = self._commands()
        if typed is None or not commands:
            return None
        close = difflib.get_close_matches(typed.group(1), commands, n=3, cutoff=0.6)
        if not close:
            return f"`{self.prog} --help` lists the commands"
        return "did you mean " + " or ".join(f"`{self.prog} {name}`" for name in close) + "?"


def _plain(message: str) -> str:
    """A mistyped command in a few words: not argparse's list of every command (the hint names
    the one meant, `--help` lists them all)."""
    import re

    typed = re.match(r"argument (COMMAND|ACTION): invalid choice: '([^']*)'", message)
    if typed is None:
        return message
    return f"unknown {'command' if typed.group(1) == 'COMMAND' else 'action'} '{typed.group(2)}'"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each option's default appended to its help unless
    the help already says it, or there is none to show (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is False
            or default in (None, "", [], (), argparse.SUPPRESS)
            or (not action.option_strings and action.nargs not in ("?", "*"))
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that an unknown option is reported by the command it was given to
    (`reconciler plan --bogus` shows plan's usage and points at `reconciler plan --help`)."""
    # `reconciler` or `reconciler pi` alone asks for the help; a mistyped option does not.
    CommandParser.words_only = not any(word.startswith("-") for word in argv or [])
    if (argv or [])[:2] == ["bench", "compare"] and {"-h", "--help"} & set(argv or []):
        bench_compare_parser().print_help(sys.stdout)
        raise SystemExit(0)
    args, extra = parser.parse_known_args(argv)
    if extra:
        innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def bench_compare_parser() -> argparse.ArgumentParser:
    """`bench compare`'s own help: it is a mode of `bench` (whose first word may be a URL), so
    argparse would show bench's."""
    parser = CommandParser(
        prog="reconciler bench compare",
        description="Compare two bench reports (ours, or `vllm bench serve --save-result` JSON): each "
        "figure of A beside B, with the change, and a plot of both when both are ours.",
        epilog=_examples(
            "reconciler bench compare before.json after.json", "reconciler bench compare a.json b.json --json"
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("A", help="the baseline report")
    parser.add_argument("B", help="the report compared with it")
    parser.add_argument("--plot", metavar="FILE", help="PNG plot (default: B-vs-A.png beside B; needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    return parser


def innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser that `args` were parsed down to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if isinstance(chosen, str) and chosen in action.choices:
                return innermost(action.choices[chosen], args)
    return parser


# One add_argument call: the flags (or a positional's name) and the keywords.
Arg = tuple[tuple[str, ...], dict[str, Any]]


def arg(*names: str, **settings: Any) -> Arg:
    return names, settings


class Command(NamedTuple):
    """One subcommand: `summary` in the command list, `description` and `examples` in its --help;
    `handler` is "module:function" in reconciler.cli, imported only when the command runs."""

    name: str
    summary: str
    description: str
    examples: list[str]
    handler: str
    args: tuple[Arg, ...] = ()
    actions: tuple[Command, ...] = ()  # its own subcommands, chosen as `<name>_action`
    usage: str | None = None
    defaults: dict[str, Any] | None = None  # set on the namespace beside the handler


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole tree; with `argv`, only the command it starts with (if any) is declared in full.

    The other commands are listed with their summaries (so `--help`, an unknown command's
    error and the choices stay as they are) but their options are not declared: declaring
    twenty commands' options is most of argparse's start-up, and parsing `argv` needs one.
    """
    parser = CommandParser(
        prog="reconciler",
        description="Keep a DeepSeek-V4.1-Flash deployment on DGX Spark nodes converged to a spec.",
        epilog=_examples(
            "reconciler init --worker me@spark2   # write specs/deployment.yaml from what the nodes have",
            "reconciler doctor                    # every prerequisite on every node",
            "reconciler plan                      # what apply would change",
            "reconciler apply                     # converge",
            'sudo "$(command -v reconciler)" install-service   # keep it converged from boot',
        )
        + "\nEach command has its own --help. Exit codes: 0 ok, 1 error, 2 changes (plan) or not"
        " converged (status), 130 interrupted.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _declare(parser, "command", "COMMAND", _commands(), _running(argv))
    return parser


def _declare(
    parser: argparse.ArgumentParser, dest: str, metavar: str, commands: list[Command], running: str | None
) -> None:
    """`commands` as the subcommands of `parser`; when `running` names one, only it in full."""
    action = parser.add_subparsers(dest=dest, required=True, metavar=metavar, parser_class=CommandParser)
    for command in commands:
        if running not in (None, command.name):
            action.add_parser(command.name, help=command.summary)
            continue
        sub: argparse.ArgumentParser = action.add_parser(
            command.name,
            help=command.summary,
            description=command.description,
            epilog=_examples(*command.examples),
            usage=command.usage,
            formatter_class=HelpFormatter,
        )
        for names, settings in command.args:
            sub.add_argument(*names, **settings)
        sub.set_defaults(handler=command.handler, **(command.defaults or {}))
        if command.actions:
            _declare(sub, f"{command.name}_action", "ACTION", list(command.actions), None)


# Options of the top-level parser that end the parse where they stand: what follows is never read.
_ENDING_OPTIONS = ("-h", "--help", "--version")


def _running(argv: Sequence[str] | None) -> str | None:
    """The command `argv` runs, "" for none (help or version), None when it is not plain which
    (an option first: then the whole tree parses it, as before)."""
    if not argv:
        return None
    if argv[0] in _ENDING_OPTIONS:
        return ""
    return None if argv[0].startswith("-") else argv[0]


def _examples(*lines: str) -> str:
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)


# --- what arguments accept ----------------------------------------------------------------------


def _number_within(text: str, low: float, high: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def seconds(text: str) -> float:
    return _number_within(text, 0, 86_400, "a number of seconds from 0 to 86400")


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since(text: str) -> float:
    """How far back, as epoch seconds: an age (90s, 30m, 2h, 7d) or a time as `status` prints
    them (2026-12-03T10:00:00Z)."""
    import time

    from reconciler.clock import parse_utc_iso

    digits, unit = text[:-1], text[-1:]
    if digits.isdigit() and unit in _AGE_UNITS and len(digits) <= 6:
        return time.time() - int(digits) * _AGE_UNITS[unit]
    moment = parse_utc_iso(text)
    if moment is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an age (90s, 30m, 2h, 7d) nor a time like 2026-12-03T10:00:00Z"
        )
    return moment


def refresh_seconds(text: str) -> float:
    """A refresh interval: each refresh asks every node, so not back to back."""
    value = seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is under 1 second: each refresh asks every node")
    return value


def _whole_within(text: str, low: int, high: float, what: str) -> int:
    """Digits only: int() would also take a sign, spaces and underscores."""
    if not text.isdigit() or not low <= int(text) <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return int(text)


def positive(text: str) -> int:
    return _whole_within(text, 1, float("inf"), "a positive integer")


def at_most(limit: int) -> Callable[[str], int]:
    """A positive integer up to `limit`: a bench step holds every stream's bytes until it ends."""

    def parse(text: str) -> int:
        value = positive(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {limit}")
        return value

    return parse


def count(text: str) -> int:
    return _whole_within(text, 0, 1_000_000, "a whole number from 0 to 1000000")


def fraction(text: str) -> float:
    return _number_within(text, 0.0, 1.0, "a number from 0 to 1")


def _port(text: str) -> int:
    return _whole_within(text, 1, 65535, "a port number (1-65535)")


# --- options several commands share ----------------------------------------------------------

SPEC = arg(
    "--spec",
    default=None,
    metavar="PATH",
    help=f"spec file (default: ${constants.SPEC_PATH_ENV}, else {constants.DEFAULT_SPEC_PATH})",
)
JSON = arg("--json", action="store_true", help="machine-readable output on stdout")
UPDATE_REVISION = arg(
    "--update-revision",
    action="store_true",
    help="move a branch or tag in model.revision to where it points on the Hub now (else it stays pinned)",
)
ACCEPT_MEMORY_RISK = arg(
    "--accept-memory-risk",
    action="store_true",
    help=(
        "restart onto a serving edit although the memory record predicts it leaves less than the guard's floor "
        "plus a margin (the guard still stops the ranks if it does)"
    ),
)
YES = arg("-y", "--yes", action="store_true", help="do it without asking (for scripts: there is no terminal to ask)")
WAIT = arg(
    "--wait", type=seconds, default=600, metavar="SECONDS", help="how long to wait for a running loop's pass to finish"
)
# What smoke and bench ask: the API, found from the spec unless given.
API = (
    arg("url", nargs="?", metavar="URL", help="API base URL (default: the spec's head, port serving.port)"),
    arg("--key-file", metavar="PATH", help="API key file (default: $DSV41_API_KEY, else the spec's api.key_file)"),
    arg("--model", help="served model name (default: the spec's serving.served_model_name, else the first listed)"),
    SPEC,
    JSON,
)


def _commands() -> list[Command]:
    """Every command, in the order --help lists them (built per parser: bench's list defaults are
    the namespace's own)."""
    return [
        # --- the spec ---------------------------------------------------------------------------
        Command(
            "validate",
            "check a spec; every problem with file:line:column",
            "Load the spec and check every field; each problem is reported with its file, line, column and "
            "what to do. Touches no node.",
            ["reconciler validate", "reconciler validate --spec specs/testbed.yaml --json"],
            "deploy:validate",
            (SPEC, JSON),
        ),
        Command(
            "schema",
            f"write {constants.SCHEMA_PATH} (or {constants.SPEC_DOC_PATH}) from the spec model",
            "Write the spec's JSON Schema (for editors and CI) or, with --markdown, its reference for people: "
            "every section and field with its type, default and what a change does. --check tells whether the "
            "committed file is current instead.",
            [
                "reconciler schema",
                "reconciler schema --check",
                "reconciler schema --markdown",
                "reconciler schema --out -",
            ],
            "deploy:schema",
            (
                arg(
                    "--out",
                    help=f"where to write (default: {constants.SCHEMA_PATH}, with --markdown "
                    f"{constants.SPEC_DOC_PATH}); - for stdout",
                ),
                arg("--markdown", action="store_true", help="the spec reference in Markdown instead of the schema"),
                arg("--check", action="store_true", help="exit 1 if the file differs instead of writing it"),
                JSON,
            ),
        ),
        # --- converging -------------------------------------------------------------------------
        Command(
            "plan",
            "show what apply would change",
            "Observe every node (over SSH and the Docker API), compare with the spec and print the actions apply "
            "would run, each with its cause. Changes nothing.",
            [
                "reconciler plan",
                "reconciler plan --detailed-exitcode   # 0 nothing to do, 2 changes, 1 error",
                "reconciler plan --out tonight.plan    # then: reconciler apply tonight.plan",
                "reconciler plan --facts facts.json    # offline, from `reconciler facts` output",
            ],
            "deploy:plan",
            (
                SPEC,
                arg("--facts", metavar="FILE", help="plan offline from a facts snapshot (JSON)"),
                arg(
                    "--detailed-exitcode",
                    action="store_true",
                    help="exit 0 when nothing changes, 2 when something does, 1 on error",
                ),
                arg("-v", "--verbose", action="store_true", help="also say why each in-sync part needs nothing"),
                UPDATE_REVISION,
                ACCEPT_MEMORY_RISK,
                arg(
                    "--out",
                    metavar="FILE",
                    help="save the plan (with a fingerprint of the facts) for `reconciler apply FILE`",
                ),
                JSON,
            ),
        ),
        Command(
            "apply",
            "converge: show the plan, execute it with progress, plan again",
            "Plan, then run the plan's actions in order with progress, then plan again to prove nothing is left. "
            "With FILE, run exactly a saved plan, or refuse it when the deployment changed since. On a terminal, "
            "asks before a group restart, a stop or removal, or moving more than 10 GB.",
            ["reconciler apply", "reconciler apply --yes --json", "reconciler apply tonight.plan"],
            "deploy:apply",
            (
                arg(
                    "plan_file",
                    nargs="?",
                    metavar="FILE",
                    help="a plan saved by `reconciler plan --out FILE`: run exactly it, or refuse it when the "
                    "deployment changed",
                ),
                SPEC,
                WAIT,
                UPDATE_REVISION,
                ACCEPT_MEMORY_RISK,
                arg("-y", "--yes", action="store_true", help="do not ask before the disruptive or expensive"),
                arg("--deep-verify", action="store_true", help="rehash every checkpoint file, ignoring the cache"),
                arg(
                    "--events",
                    metavar="FILE",
                    help="also append every event as a JSON line to FILE (passes, steps, restarts, incidents, and "
                    "each step's progress: bytes, rate, ETA), for scripts",
                ),
                JSON,
            ),
        ),
        Command(
            "run",
            "converge, then stay up and heal (the boot-time service)",
            "The reconcile loop: converge, then watch the spec file, Docker events, a periodic resync and the "
            "API's liveness, and converge again on any change. What `install-service` runs at boot.",
            ["reconciler run", "RECONCILER_SPEC=/etc/spark/deployment.yaml reconciler run"],
            "deploy:run",
            (SPEC,),
        ),
        # --- looking ----------------------------------------------------------------------------
        Command(
            "facts",
            "print the observed state of every node (a facts snapshot)",
            "Observe every node and print what was found as JSON: the input `plan --facts` plans from.",
            ["reconciler facts > facts.json"],
            "deploy:facts",
            (SPEC,),
            defaults={"json": True},
        ),
        Command(
            "status",
            "a table per node (containers, memory, guard, sync), the next step of each component, health",
            "What is running where and what still differs from the spec. Exit 0 converged, 2 not converged, 1 error.",
            ["reconciler status", "reconciler status --watch", "reconciler status --probe --json"],
            "observe:status",
            (
                SPEC,
                JSON,
                arg(
                    "--probe",
                    action="store_true",
                    help="also send the liveness probe (keyed one-token completion): /health says 200 while the "
                    "engine is dead",
                ),
                arg(
                    "--watch",
                    nargs="?",
                    type=refresh_seconds,
                    const=5.0,
                    default=None,
                    metavar="SECONDS",
                    help="refresh every SECONDS (5 when not given) until Ctrl-C; with --json one JSON object per line",
                ),
            ),
        ),
        Command(
            "doctor",
            "every prerequisite on every node: PASS/WARN/FAIL with the fix",
            "Check SSH, Docker, the fabric (RoCE interface, HCAs, MTU), disk, memory, the image registry and the "
            "Hub on every node; each FAIL says how to fix it. Exit 1 when anything fails.",
            ["reconciler doctor", "reconciler doctor --json"],
            "observe:doctor",
            (SPEC, JSON),
        ),
        Command(
            "logs",
            "logs of a rank (r0, r1, ...) or of the memory guard",
            "Print a rank container's log, or a node's memory-guard log.",
            ["reconciler logs r0 --tail 50", "reconciler logs r1 -f", "reconciler logs memguard --node spark-worker"],
            "deploy:logs",
            (
                SPEC,
                arg("which", metavar="r0|r1|...|memguard", help="r<N> for rank N's container, or memguard"),
                arg("--node", help="node of the memory guard log (default: the head)"),
                arg("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C"),
                arg("--tail", type=count, default=200, help="lines of history to print first"),
            ),
        ),
        Command(
            "incidents",
            "the records of unplanned failures (rank exits, failed liveness, guard trips, failed starts)",
            "List the incident records the head keeps under its state dir, newest first, or print one with "
            "`show ID`: each rank's last log lines, exit codes and OOMKilled, the guard logs, the facts and the "
            "plan that followed. The newest 50 are kept (64 MiB at most).",
            [
                "reconciler incidents",
                "reconciler incidents show 20261203-101500-001-rank-exit",
                "reconciler incidents --json",
            ],
            "observe:incidents",
            (
                SPEC,
                JSON,
                arg("which", nargs="?", choices=["show"], metavar="show", help="print one record"),
                arg("id", nargs="?", metavar="ID", help="the record to show (as listed)"),
            ),
        ),
        Command(
            "events",
            "what the reconciler did: passes, steps, restarts, trips, drains and incidents",
            "Print the event history this machine keeps under the state dir (events.jsonl, rotated past 4 MiB, "
            "three files): every converge (trigger, duration, outcome), every step (node, cause, duration, "
            "outcome), every unplanned restart counted and every incident recorded, oldest first.",
            [
                "reconciler events --since 1h",
                "reconciler events --follow",
                "reconciler events --since 2026-12-03T10:00:00Z --json",
            ],
            "observe:events",
            (
                SPEC,
                JSON,
                arg(
                    "--since",
                    type=since,
                    default=None,
                    metavar="AGE|TIME",
                    help="from this long ago (30m, 2h, 7d) or this time on",
                ),
                arg("--follow", action="store_true", help="then print each new event as it is written, until Ctrl-C"),
            ),
        ),
        # --- stopping and starting --------------------------------------------------------------
        Command(
            "stop",
            "stop the ranks in order and hold them down until `start`",
            "Stop rank 0 then the workers, and record a hold so neither apply nor the loop starts them again "
            "until `reconciler start`.",
            ["reconciler stop", "reconciler stop --wait 60 --json"],
            "deploy:stop",
            (SPEC, WAIT, JSON),
        ),
        Command(
            "start",
            "clear a hold, a memory-guard trip or the crash-loop breaker, then converge",
            "Release a `stop` hold, any memory-guard trip and the crash-loop breaker (its count starts again), "
            "remove the held ranks' stopped containers, then converge (start the ranks in order).",
            ["reconciler start", "reconciler start --json"],
            "deploy:start",
            (SPEC, WAIT, JSON),
        ),
        # --- the lifecycle: the key, the disks, the way out -------------------------------------
        Command(
            "rotate-key",
            "a new API key: the front takes it in seconds, the ranks keep serving",
            "Write a new random key into api.key_file on the head (the old one stops working at once) and "
            "replace the front so it reads it; the ranks are not touched. Clients need the new key: the "
            "command prints how to give it to Pi. Asks first on a terminal; without one it needs --yes.",
            ["reconciler rotate-key", "reconciler rotate-key --yes --json"],
            "lifecycle:rotate_key",
            (SPEC, YES, JSON),
        ),
        Command(
            "storage",
            "what fills each node's disk, and what is safe to release",
            "Per node: the served checkpoint, older revisions beyond model.keep_revisions, unfinished "
            "downloads and split parts, images (ours in use, ours no longer used, others'), the state dir. "
            "--release removes what is safe to release (never the served revision, a kept one or an image "
            "we did not pull), after showing it.",
            ["reconciler storage", "reconciler storage --release", "reconciler storage --json"],
            "lifecycle:storage",
            (
                SPEC,
                arg("--release", action="store_true", help="remove what is safe to release, after showing it"),
                YES,
                JSON,
            ),
        ),
        Command(
            "uninstall",
            "remove everything the reconciler made, on every node (a plan first)",
            "Show, then remove: the boot service on this machine (through sudo), the ranks, the front and the "
            "memory guards, the images the reconciler pulled, what it wrote in its state dir on every node and "
            "Pi's provider. The checkpoint stays unless --checkpoint is given; a file or an image of yours stays. "
            "Run it as yourself, not under sudo. Asks first on a terminal; without one it needs --yes. Run again, "
            "it finds nothing to do.",
            [
                "reconciler uninstall --dry-run",
                "reconciler uninstall",
                "reconciler uninstall --checkpoint --yes",
            ],
            "lifecycle:uninstall",
            (
                SPEC,
                arg(
                    "--checkpoint",
                    action="store_true",
                    help="also delete the checkpoint (every revision) on every node",
                ),
                arg("--dry-run", action="store_true", help="show what would be removed; remove nothing"),
                YES,
                JSON,
            ),
        ),
        # --- smoke and bench --------------------------------------------------------------------
        Command(
            "smoke",
            "does it work? content checks plus the protocol, PASS/FAIL each",
            "Ask the API what a working model answers (a sum, a tool call, an image) and check the protocol "
            "(models, 401 without the key, streaming with usage). Exit 0 only if every check passes.",
            ["reconciler smoke", "reconciler smoke http://10.10.10.1:8000 --key-file ~/.config/dsv41/api_key"],
            "verify:smoke",
            (
                *API,
                arg(
                    "--checks",
                    choices=("all", "protocol"),
                    default="all",
                    help="protocol: only models, 401 and streaming (for models that cannot answer)",
                ),
                arg(
                    "--max-tokens",
                    type=positive,
                    default=None,
                    help="cap each content answer; default none, so reasoning is never cut short (a model that "
                    "never stops runs to max-model-len)",
                ),
            ),
        ),
        Command(
            "bench",
            "how fast is it? prefill, decode, TTFT/TPOT/ITL, long-context recall; `bench compare A B`",
            "Measure the API (definitions in docs/bench.md), writing a JSON report after "
            "every step and a plot; or compare two reports.",
            [
                "reconciler bench --out bench.json --label tp2",
                "reconciler bench --out quick.json --prefill 8192 --conc 1 --reps 1",
                "reconciler bench compare before.json after.json",
            ],
            "verify:bench",
            (
                *API,
                arg("files", nargs="*", metavar="FILE", help=argparse.SUPPRESS),
                arg("--out", metavar="FILE", help="JSON report, rewritten after every step (required to run)"),
                arg(
                    "--plot",
                    metavar="FILE",
                    help="PNG plot, needs matplotlib (default: --out with .png; for compare, B-vs-A.png beside B)",
                ),
                arg("--label", default="", help="a name for this run in reports and comparisons (default: none)"),
                arg(
                    "--conc",
                    nargs="*",
                    type=at_most(256),
                    default=[1, 2],
                    metavar="N",
                    help="concurrent streams (at most 256)",
                ),
                arg("--prefill", nargs="*", type=positive, default=[8192, 32768], metavar="N", help="prompt tokens"),
                arg(
                    "--kinds",
                    nargs="*",
                    choices=sorted(constants.ALL_DECODE_KINDS),
                    default=list(constants.DECODE_KINDS),
                    metavar="KIND",
                    help=f"decode prompts to measure: {', '.join(sorted(constants.ALL_DECODE_KINDS))} "
                    f"(default: {' '.join(constants.DECODE_KINDS)}; random is vllm bench serve's workload)",
                ),
                arg(
                    "--ctx",
                    nargs="*",
                    type=positive,
                    default=[],
                    metavar="N",
                    help="recall check lengths in tokens (default: none)",
                ),
                arg("--depth", type=fraction, default=0.5, help="where the needle sits: 0 start .. 1 end"),
                arg(
                    "--reps",
                    type=at_most(1000),
                    default=3,
                    help="repetitions of each prefill and decode step (at most 1000)",
                ),
                arg(
                    "--max-tokens",
                    type=positive,
                    default=None,
                    help="cap decode output (default: no cap; the random kind: exactly this many, default 128)",
                ),
                arg(
                    "--input-len",
                    type=positive,
                    default=256,
                    help="prompt tokens of the random kind (default 256)",
                ),
            ),
            usage="reconciler bench [URL] --out FILE [options]\n       reconciler bench compare A.json B.json [--json]",
        ),
        # --- the Pi coding agent on this machine ------------------------------------------------
        Command(
            "pi",
            "the Pi coding agent on this machine: install, uninstall, status",
            "Wire the Pi coding agent to the deployment: a provider, the model and a key extension in Pi's config.",
            ["reconciler pi install", "reconciler pi status", "reconciler pi uninstall"],
            "pi:status",
            actions=(
                Command(
                    "install",
                    "install Pi with npm if missing; add the provider, model and extension to its config",
                    "Install Pi with npm when it is not on PATH, then add the deployment as a provider to Pi's "
                    "config (a backup of each file first; the API key is read from an environment variable, "
                    "never written).",
                    ["reconciler pi install", "reconciler pi install http://10.10.10.1:8000 --set-default"],
                    "pi:install",
                    (
                        arg(
                            "base_url",
                            nargs="?",
                            metavar="BASE_URL",
                            help="the API, e.g. http://10.10.10.10:8000 (default: the spec's)",
                        ),
                        arg(
                            "--set-default",
                            action="store_true",
                            default=None,
                            help="make it Pi's default model (default: pi.set_default)",
                        ),
                        arg(
                            "--key-env",
                            metavar="NAME",
                            help=f"variable Pi reads the API key from (default {constants.PI_KEY_ENV})",
                        ),
                        WAIT,
                        SPEC,
                        JSON,
                    ),
                ),
                Command(
                    "uninstall",
                    "remove exactly what install added to Pi's config",
                    "Remove the provider, model and extension `pi install` added; everything else in Pi's "
                    "config stays.",
                    ["reconciler pi uninstall"],
                    "pi:uninstall",
                    (WAIT, SPEC, JSON),
                ),
                Command(
                    "status",
                    "Pi on PATH, its config for the provider, the key variable's state",
                    "Where Pi is, what its config says about the deployment's provider, and whether the key "
                    "variable is set.",
                    ["reconciler pi status --json"],
                    "pi:status",
                    (SPEC, JSON),
                ),
            ),
        ),
        # --- running at boot, and setting up ----------------------------------------------------
        Command(
            "install-service",
            f"run `reconciler run` at boot: write {constants.UNIT_DIR}/{constants.UNIT_NAME}, enable and start it",
            "Write the systemd unit for this machine (the spec's absolute path, the user, this reconciler), "
            "enable it and start it. Needs root.",
            [
                'sudo "$(command -v reconciler)" install-service --spec /home/me/spark/specs/deployment.yaml',
                "reconciler install-service --dry-run",
            ],
            "boot:install_service",
            (
                SPEC,
                arg("--user", help="the service's user (default: the invoking user, under sudo $SUDO_USER)"),
                arg("--dry-run", action="store_true", help="print the unit for this machine; change nothing"),
                JSON,
            ),
        ),
        Command(
            "init",
            "probe the nodes and write a first spec, each value with the reason it was chosen",
            "Probe every node over SSH (this machine is the head unless --head is given) and write a spec from "
            "what they say: node names, fabric interface, address and HCAs, model dir, each with a comment; "
            "what cannot be decided is marked REVIEW. Never overwrites a file; never adds a host key.",
            [
                "reconciler init --worker me@10.10.10.11",
                "reconciler init --worker me@spark2 --worker me@spark3 --out specs/three.yaml",
                "reconciler init --head me@10.10.10.13 --worker me@10.10.10.11 --ssh-port 2222",
            ],
            "init:cmd_init",
            (
                arg(
                    "--worker",
                    action="append",
                    required=True,
                    metavar="[USER@]HOST",
                    help="a worker, reached over SSH (its fabric address is best); repeat for each, in rank order",
                ),
                arg(
                    "--head",
                    metavar="[USER@]HOST",
                    help="the head over SSH (default: this machine is the head, no ssh:)",
                ),
                arg("--out", default=constants.DEFAULT_SPEC_PATH, metavar="PATH", help="where to write"),
                arg(
                    "--model-dir",
                    metavar="PATH",
                    help="the checkpoint's directory on every node, absolute or under ~ "
                    "(default ~/models/DeepSeek-V4.1-Flash-Spark)",
                ),
                # No argparse defaults below: what is given is written into the spec, where it
                # overrides ~/.ssh/config for good; what is left out keeps coming from the config.
                arg(
                    "--ssh-port",
                    type=_port,
                    metavar="PORT",
                    help="sshd port of the nodes (default: the ssh config's Port for the host, else 22)",
                ),
                arg(
                    "--identity-file",
                    metavar="PATH",
                    help="private key for SSH (default: the ssh config's IdentityFile, else ssh-agent and ~/.ssh)",
                ),
                arg(
                    "--known-hosts",
                    metavar="PATH",
                    help="host keys to check the nodes against; never added to "
                    "(default: the ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts)",
                ),
                JSON,
            ),
        ),
        Command(
            "completion",
            "print a shell completion script (bash or zsh)",
            "Print the completion script for bash or zsh, generated from this command tree.",
            [
                "reconciler completion bash > ~/.local/share/bash-completion/completions/reconciler",
                "reconciler completion zsh > ~/.zfunc/_reconciler   # with fpath+=(~/.zfunc) before compinit",
            ],
            "completion:print_script",
            (arg("shell", choices=("bash", "zsh"), help="the shell to complete for"),),
        ),
    ]
