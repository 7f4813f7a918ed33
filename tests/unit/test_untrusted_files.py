"""Spec and facts files are untrusted input: every bad one is a located error, never a traceback,
a hang or a memory blow-up, and YAML 1.1 guesses never reach the model as coerced values."""

from __future__ import annotations

import math
import os
import random
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler import spec, yamlpos
from reconciler.errors import FactsError, SpecError, SpecProblem, YamlError
from reconciler.facts import node as facts_node
from reconciler.facts.node import load_facts
from reconciler.spec import load_spec, parse_spec
from reconciler.yamlpos import load_located
from tests.scenarios import EMPTY_FACTS, ROOT, SPEC_PATH

MINIMAL = """\
nodes:
  - name: spark-head
    role: head
  - name: spark-worker
    ssh: {host: 10.10.10.11, user: nvidia}
"""
AFTER_MINIMAL = 6  # the first line of text appended to MINIMAL


def problems_of(text: str) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "spec.yaml")
    return caught.value.problems


def only_problem(text: str) -> SpecProblem:
    problems = problems_of(text)
    assert len(problems) == 1, [p.render() for p in problems]
    return problems[0]


def file_problem(path: Path | str) -> SpecProblem:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    [problem] = caught.value.problems
    return problem


def facts_error(path: Path | str) -> str:
    with pytest.raises(FactsError) as caught:
        load_facts(path)
    assert str(path) in caught.value.message
    assert caught.value.hint
    return caught.value.message


def _limit_memory() -> None:
    # A regression that reads /dev/zero to the end must fail in the child, not take the machine.
    two_gib = 2 * 1024**3
    resource.setrlimit(resource.RLIMIT_AS, (two_gib, two_gib))


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,  # the CLI answers in about a second; a read that blocks never does
        preexec_fn=_limit_memory,
    )


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Socket paths are limited to ~108 bytes; tmp_path (named after the test) can be longer,
    # the run's base directory with a short name is not.
    with socket.socket(socket.AF_UNIX) as listener:
        path = tmp_path_factory.mktemp("sock") / "s.yaml"
        listener.bind(str(path))
        yield path


# ---- the before-stop probe, through the real CLI ---------------------------------------------


PROBE_FILES: dict[str, tuple[bytes, str]] = {
    "binary": (b"\x00\xff\xfe garbage", ":1:1: the spec contains a NUL byte"),
    "deep": (b"a: " + b"[" * 2000 + b"]" * 2000 + b"\n", ":1:67: nested deeper than 64 levels"),
    "bigint": (b"name: " + b"9" * 5000 + b"\n", ":1:7: name: an integer of 5000 digits"),
    "yes": (b"name: dsv41\nserving:\n  port: yes\n", ":3:3: serving.port:"),
    "empty": (b"", ":1:1: the spec is empty"),
}


@pytest.mark.parametrize("name", sorted(PROBE_FILES))
def test_probe_files_give_a_located_error_from_the_cli(tmp_path: Path, name: str) -> None:
    content, expected = PROBE_FILES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    result = run_cli("validate", "--spec", str(path))
    assert result.returncode == 1
    assert "internal error" not in result.stderr
    assert "Traceback" not in result.stderr
    assert f"{path}{expected}" in result.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_specials_are_refused_by_the_cli_without_blocking(tmp_path: Path, kind: str) -> None:
    path = {"fifo": tmp_path / "fifo.yaml", "dev-zero": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    for argv in (["validate", "--spec", str(path)], ["plan", "--spec", str(SPEC_PATH), "--facts", str(path)]):
        result = run_cli(*argv)
        assert result.returncode == 1
        assert "internal error" not in result.stderr
        assert f"{path}:1:1: cannot read the " in result.stderr


# ---- reading the spec file ------------------------------------------------------------------


def test_a_fifo_spec_is_refused_without_blocking(fifo: Path) -> None:
    problem = file_problem(fifo)
    assert (problem.line, problem.column) == (1, 1)
    assert "cannot read the spec" in problem.message
    assert "FIFO" in problem.message


def test_a_character_device_spec_is_refused_without_reading_it() -> None:
    problem = file_problem("/dev/zero")
    assert "character device, not a regular file" in problem.message


def test_a_directory_spec_is_refused(tmp_path: Path) -> None:
    problem = file_problem(tmp_path)
    assert "cannot read the spec" in problem.message
    assert "directory" in problem.message.lower()


def test_a_socket_spec_is_refused(unix_socket: Path) -> None:
    problem = file_problem(unix_socket)
    assert "cannot read the spec" in problem.message
    assert problem.hint


def test_a_symlink_to_a_spec_is_read(tmp_path: Path) -> None:
    link = tmp_path / "link.yaml"
    link.symlink_to(SPEC_PATH)
    assert load_spec(link).deployment.name == "dsv41"


def test_read_spec_text_returns_the_text_the_loop_compares(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    assert spec.read_spec_text(path) == MINIMAL
    with pytest.raises(SpecError):
        spec.read_spec_text(tmp_path / "missing.yaml")


def test_a_spec_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (spec.loading.MAX_SPEC_BYTES + 1))
    problem = file_problem(path)
    assert "larger than 1 MiB" in problem.message


def test_a_spec_at_the_size_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "comments.yaml"
    path.write_bytes((b"#" * 1023 + b"\n") * (spec.loading.MAX_SPEC_BYTES // 1024))
    assert file_problem(path).message == "the spec is empty"


@pytest.mark.parametrize(
    ("content", "line", "column"),
    [
        (b"name: dsv41\nstate_dir: caf\xe9\n", 2, 15),
        (b"name: \xc3\xa9\xff\n", 1, 8),  # columns count characters, like YAML's own errors
        (b"name: \xed\xa0\x80\n", 1, 7),  # an encoded surrogate is not UTF-8
        (b"\xef\xbb", 1, 1),  # a truncated byte-order mark
    ],
)
def test_invalid_utf8_is_located_at_its_first_bad_byte(tmp_path: Path, content: bytes, line: int, column: int) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(content)
    problem = file_problem(path)
    assert (problem.line, problem.column) == (line, column)
    assert "not valid UTF-8" in problem.message


def test_a_nul_byte_is_located(tmp_path: Path) -> None:
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"name: dsv41\nstate_dir: /a\x00b\n")
    problem = file_problem(path)
    assert (problem.line, problem.column, problem.path) == (2, 14, "")
    assert "NUL byte" in problem.message


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load_spec(path).deployment.nodes[0].name == "spark-head"


# ---- YAML 1.2 core schema, not YAML 1.1 guesses ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("serving:\n  port: yes\n", "serving.port"),
        ("serving:\n  master_port: 12:30:00\n", "serving.master_port"),
        ("model:\n  keep_parts: yes\n", "model.keep_parts"),
        ("model:\n  keep_parts: on\n", "model.keep_parts"),
        ("serving:\n  port: 0x1F40\n  master_port: 1_000\n", "serving.master_port"),
    ],
)
def test_yaml_1_1_surprises_are_located_errors_not_coerced_values(text: str, path: str) -> None:
    problem = only_problem(MINIMAL + text)
    assert problem.path == path
    assert problem.line == AFTER_MINIMAL + text.count("\n") - 1


@pytest.mark.parametrize(
    ("scalar", "value"),
    [
        ("yes", "yes"),
        ("No", "No"),
        ("on", "on"),
        ("y", "y"),
        ("12:30:00", "12:30:00"),
        ("2001-12-14", "2001-12-14"),
        ("1_000", "1_000"),
        ("tRue", "tRue"),
        ("NuLL", "NuLL"),
        ("0b101", "0b101"),
        ("-0x1F", "-0x1F"),
        ("0777", 777),
        ("+12", 12),
        ("-0", 0),
        ("0o777", 0o777),
        ("0x1F", 31),
        ("1e3", 1000.0),
        ("-1.5", -1.5),
        (".5", 0.5),
        ("5.", 5.0),
        ("+.inf", math.inf),
        ("-.Inf", -math.inf),
        ("true", True),
        ("True", True),
        ("FALSE", False),
        ("null", None),
        ("~", None),
        ("", None),
        ("'yes'", "yes"),
        ('"8000"', "8000"),
        ("'null'", "null"),
    ],
)
def test_plain_scalars_resolve_by_the_yaml_1_2_core_schema(scalar: str, value: Any) -> None:
    data = load_located(f"a: {scalar}\n").data
    assert data == {"a": value}
    assert type(data["a"]) is type(value)


def test_nan_resolves_to_a_float() -> None:
    assert math.isnan(load_located("a: .NaN\n").data["a"])


def test_marks_point_at_keys_and_list_items() -> None:
    document = load_located("a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n")
    assert document.data == {"a": {"b": 1, "c": ["x", {"d": 2}]}}
    assert document.mark_for(("a", "b")) == yamlpos.Mark(2, 3)
    assert document.mark_for(("a", "c", 1)) == yamlpos.Mark(5, 7)
    assert document.mark_for(("a", "c", 1, "d")) == yamlpos.Mark(5, 8)
    assert document.mark_for(("a", "c", 1, "missing")) == yamlpos.Mark(5, 7)


def test_the_first_of_duplicate_keys_is_kept_and_the_second_is_located() -> None:
    document = load_located("a: {x: 1}\nb: 2\na: {y: 3}\n")
    assert document.data == {"a": {"x": 1}, "b": 2}
    assert document.duplicates == [(("a",), yamlpos.Mark(3, 1))]
    assert document.mark_for(("a", "x")) == yamlpos.Mark(1, 5)


# ---- YAML features a spec refuses -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "column", "shown"),
    [
        ("serving: !!python/object:os.system {}\n", 10, "!!python/object:os.system"),
        ("name: !!str 5\n", 7, "!!str"),
        ("name: !foo x\n", 7, "!foo"),
        ("name: ! x\n", 7, "(!)"),
        ("nodes: !!seq []\n", 8, "!!seq"),
    ],
)
def test_explicit_tags_are_refused(text: str, column: int, shown: str) -> None:
    problem = only_problem(MINIMAL + text)
    assert (problem.line, problem.column) == (AFTER_MINIMAL, column)
    assert "tags are not supported" in problem.message
    assert shown in problem.message


def test_an_alias_bomb_is_refused_at_its_first_anchor() -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    problem = only_problem("\n".join(lines) + "\n")
    assert (problem.line, problem.column) == (1, 5)
    assert "anchors are not supported (&a0)" in problem.message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [*a]\n", "anchors are not supported (&a)"),
        ("a: *nowhere\n", "aliases are not supported (*nowhere)"),
        ("&top {a: 1}\n", "anchors are not supported (&top)"),
    ],
)
def test_anchors_and_aliases_are_refused(text: str, message: str) -> None:
    problem = only_problem(text)
    assert problem.line == 1
    assert message in problem.message


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 2000 + "]" * 2000 + "\n",
        "a: " + "{a: " * 2000 + "}" * 2000 + "\n",
        "".join(f"{'  ' * depth}k:\n" for depth in range(200)),
        "".join(f"{'  ' * depth}- \n" for depth in range(200)),
    ],
)
def test_deep_nesting_is_refused_before_anything_recurses(text: str) -> None:
    problem = only_problem(text)
    assert problem.message == f"nested deeper than {yamlpos.MAX_DEPTH} levels"
    assert problem.line >= 1


def test_nesting_up_to_the_limit_is_loaded() -> None:
    depth = yamlpos.MAX_DEPTH
    assert load_located("[" * depth + "]" * depth).data is not None
    with pytest.raises(YamlError):
        load_located("[" * (depth + 1) + "]" * (depth + 1))


def test_more_values_than_the_budget_are_refused() -> None:
    text = "[" + ", ".join(["1"] * yamlpos.MAX_NODES) + "]\n"
    with pytest.raises(YamlError) as caught:
        load_located(text)
    assert f"more than {yamlpos.MAX_NODES}" in caught.value.message


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("? [a, b]\n: c\n", 1, 3),
        ("{[a]: 1}\n", 1, 2),
        ("[a, b]: c\n", 1, 1),
        ("? {a: 1}\n: c\n", 1, 3),
    ],
)
def test_complex_keys_are_refused(text: str, line: int, column: int) -> None:
    problem = only_problem(text)
    assert (problem.line, problem.column) == (line, column)
    assert "a key must be a name" in problem.message


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("1", "a number"),
        ("1.5", "a number"),
        ("0x10", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
        ("~", "null"),
    ],
)
def test_keys_that_are_not_strings_are_refused(key: str, kind: str) -> None:
    problem = only_problem(MINIMAL + f"serving:\n  {key}: x\n")
    assert (problem.line, problem.column, problem.path) == (AFTER_MINIMAL + 1, 3, "serving")
    assert f"reads as {kind}; keys must be strings" in problem.message


def test_a_quoted_number_key_reaches_the_model_as_a_string() -> None:
    problem = only_problem(MINIMAL + 'serving:\n  "1": x\n')
    assert (problem.line, problem.path, problem.message) == (AFTER_MINIMAL + 1, "serving.1", "unknown key '1'")


@pytest.mark.parametrize(
    "digits",
    ["9" * 5000, "-" + "9" * 5000, "0x" + "f" * 5000, "0o" + "7" * 5000, "1" * (yamlpos.MAX_INT_DIGITS + 1)],
)
def test_huge_integers_are_refused(digits: str) -> None:
    problem = only_problem(MINIMAL + f"serving:\n  port: {digits}\n")
    assert (problem.line, problem.column, problem.path) == (AFTER_MINIMAL + 1, 9, "serving.port")
    assert "digits is too large" in problem.message
    assert len(problem.message) < 200


def test_the_longest_allowed_integer_reaches_the_model() -> None:
    problem = only_problem(MINIMAL + f"serving:\n  port: {'9' * yamlpos.MAX_INT_DIGITS}\n")
    assert "out of range" in problem.message


@pytest.mark.parametrize(
    ("value", "described"),
    [
        ('"\\ud800"', "a lone surrogate (U+D800"),
        ('"\\udfff"', "a lone surrogate (U+DFFF"),
        ('"\\0"', "a NUL character"),
        ('"a\\x01b"', "the control character U+0001"),
        ('"\\e"', "the control character U+001B"),
        ('"\\x7f"', "the control character U+007F"),
        ('"\\x9b"', "the control character U+009B"),
        ('"a\\nb"', "a line break"),
        ('"a\\rb"', "a line break"),
        ('"\\N"', "a line break"),
        ('"\\L"', "a line break"),
        ('"a\n\n  b"', "a line break"),
        ("|\n  one line\n", "a line break"),
    ],
)
def test_strings_with_control_characters_or_line_breaks_are_refused(value: str, described: str) -> None:
    problem = only_problem(MINIMAL + f"name: {value}\n")
    assert (problem.line, problem.column, problem.path) == (AFTER_MINIMAL, 7, "name")
    assert f"the string contains {described}" in problem.message


def test_keys_with_control_characters_are_refused() -> None:
    problem = only_problem(MINIMAL + 'serving:\n  env:\n    "A\\nB": x\n')
    assert (problem.line, problem.column, problem.path) == (AFTER_MINIMAL + 2, 5, "serving.env")
    assert "a line break" in problem.message


def test_tabs_and_folded_lines_are_kept() -> None:
    data = load_located('a: "x\\ty"\nb: >-\n  one\n  two\nc: one\n  two\n').data
    assert data == {"a": "x\ty", "b": "one two", "c": "one two"}


@pytest.mark.parametrize(
    ("raw", "column", "described"),
    [("\x01", 9, "U+0001"), ("\x7f", 9, "U+007F"), ("\x9b", 9, "U+009B"), ("\ufffe", 9, "U+FFFE")],
)
def test_raw_control_characters_are_located(raw: str, column: int, described: str) -> None:
    problem = only_problem(MINIMAL + f"name: ab{raw}\n")
    assert (problem.line, problem.column) == (AFTER_MINIMAL, column)
    assert described in problem.message


def test_a_nul_character_in_text_is_located() -> None:
    problem = only_problem("name: a\nx: a\x00b\n")
    assert (problem.line, problem.column) == (2, 5)
    assert "NUL character is not allowed" in problem.message


def test_a_lone_surrogate_in_text_is_located() -> None:
    problem = only_problem("name: a\nx: a\ud800b\n")
    assert (problem.line, problem.column) == (2, 5)
    assert "lone surrogate" in problem.message


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (MINIMAL + "---\nname: x\n", AFTER_MINIMAL, "a second YAML document starts here"),
        ("---\n" + MINIMAL + "...\n---\n", AFTER_MINIMAL + 2, "a second YAML document starts here"),
        ("%YAML 1.1\n---\n" + MINIMAL, 1, "YAML directives (%YAML, %TAG) are not supported"),
        ("%TAG !e! tag:example.com,2000:\n---\n" + MINIMAL, 1, "YAML directives (%YAML, %TAG) are not supported"),
    ],
)
def test_documents_and_directives_are_refused(text: str, line: int, message: str) -> None:
    problem = only_problem(text)
    assert (problem.line, problem.message) == (line, message)


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [("", 1, 1), ("\n\n", 1, 1), ("# a comment\n# and another\n", 1, 1), ("---\n", 2, 1), ("--- ~\n", 1, 5)],
)
def test_an_empty_spec_is_a_located_problem(text: str, line: int, column: int) -> None:
    problem = only_problem(text)
    assert (problem.line, problem.column, problem.message) == (line, column, "the spec is empty")


def test_a_scalar_spec_is_located_where_it_starts() -> None:
    problem = only_problem("# comment\n\nhello\n")
    assert (problem.line, problem.column, problem.message) == (3, 1, "the spec must be a mapping of keys")


@pytest.mark.parametrize(
    "text",
    ['name: "\\UFFFFFFFF"\n', 'name: "\\U7FFFFFFF"\n', "%YAML 1." + "9" * 5000 + "\n---\na: 1\n"],
)
def test_out_of_range_escapes_and_versions_are_malformed_yaml(text: str) -> None:
    problem = only_problem(text)
    assert problem.message.startswith("malformed YAML")
    assert problem.line == 1


@pytest.mark.parametrize(
    ("text", "path", "key"),
    [('"api[": 1\n', "api[", "api["), ("int: 1\n", "int", "int"), ("serving:\n  list: 1\n", "serving.list", "list")],
)
def test_unknown_keys_named_like_pydantic_union_tags_are_located(text: str, path: str, key: str) -> None:
    problem = only_problem(MINIMAL + text)
    assert (problem.line, problem.path, problem.message) == (
        AFTER_MINIMAL + text.count("\n") - 1,
        path,
        f"unknown key '{key}'",
    )


def test_the_shipped_specs_still_load() -> None:
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        assert load_spec(path).deployment.nodes, path


def _mutations(seed: int, count: int) -> Iterator[str]:
    text = SPEC_PATH.read_text(encoding="utf-8")
    alphabet = "[]{}&*!|>%@`\"'\\:-?#,~\t\n \x00\x85\u2028\ud800é0yes"
    generator = random.Random(seed)
    for _ in range(count):
        chars = list(text)
        for _ in range(generator.randint(1, 8)):
            at = generator.randrange(len(chars))
            if generator.random() < 0.3:
                del chars[at]
            else:
                chars.insert(at, generator.choice(alphabet))
        yield "".join(chars)


def _spec_problems(text: str) -> list[SpecProblem]:
    """The problems of a spec text; any exception but SpecError fails the calling test."""
    try:
        parse_spec(text, "spec.yaml")
    except SpecError as error:
        return error.problems
    return []


def test_mutated_specs_give_spec_errors_and_nothing_else() -> None:
    problems = [problem for text in _mutations(seed=20261201, count=400) for problem in _spec_problems(text)]
    assert problems
    assert all(problem.line >= 1 and problem.column >= 1 and problem.hint for problem in problems)


# ---- facts files ------------------------------------------------------------------------------


def write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "facts.json"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


def test_facts_that_are_not_regular_files_are_refused(tmp_path: Path, fifo: Path, unix_socket: Path) -> None:
    for path in (fifo, Path("/dev/zero"), tmp_path, unix_socket):
        assert f"{path}:1:1: cannot read the facts" in facts_error(path)


def test_missing_facts_name_the_path(tmp_path: Path) -> None:
    message = facts_error(tmp_path / "absent.json")
    assert "No such file or directory" in message


def test_facts_over_the_size_cap_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, b" " * (facts_node.MAX_FACTS_BYTES + 1))
    assert "larger than" in facts_error(path)


@pytest.mark.parametrize(
    ("content", "where"),
    [(b'{"nodes": {"a": {"home": "caf\xe9"}}}', ":1:30: "), (b'{"nodes":\n {"\x00": {}}}', ":2:4: ")],
)
def test_facts_bytes_are_strict_utf8_without_nul(tmp_path: Path, content: bytes, where: str) -> None:
    path = write(tmp_path, content)
    assert f"{path}{where}" in facts_error(path)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_facts_refuse_non_json_constants(tmp_path: Path, constant: str) -> None:
    path = write(tmp_path, f'{{"nodes": {{}}, "liveness": {{"failures": {constant}}}}}')
    assert f"{constant} is not a number JSON allows" in facts_error(path)


def test_facts_refuse_duplicate_keys(tmp_path: Path) -> None:
    path = write(tmp_path, '{"nodes": {"spark-head": {}, "spark-head": {"reachable": false}}}')
    assert "duplicate key 'spark-head'" in facts_error(path)


@pytest.mark.parametrize("opening", ["[", '{"a": '])
def test_facts_refuse_deep_nesting(tmp_path: Path, opening: str) -> None:
    path = write(tmp_path, '{"nodes": {}, "x": ' + opening * 100_000)
    assert "nested too deeply" in facts_error(path)


def test_facts_refuse_huge_integers(tmp_path: Path) -> None:
    path = write(tmp_path, '{"nodes": {}, "liveness": {"failures": ' + "9" * 5000 + "}}")
    message = facts_error(path)
    assert "digits" in message
    assert len(message) < 300


def test_facts_refuse_lone_surrogates_and_accept_pairs(tmp_path: Path) -> None:
    path = write(tmp_path, '{"nodes": {"a": {"hostname": "x\\ud800"}}}')
    assert "lone surrogate" in facts_error(path)
    path = write(tmp_path, '{"nodes": {"a": {"hostname": "x\\ud83d\\ude00"}}}')
    assert load_facts(path).nodes["a"].hostname == "x\U0001f600"


def test_malformed_facts_are_located(tmp_path: Path) -> None:
    path = write(tmp_path, '{"nodes": {}\n  "x": 1}')
    assert f"{path}:2:3: malformed JSON" in facts_error(path)


def test_valid_facts_still_load() -> None:
    assert load_facts(EMPTY_FACTS).version == 1


def _facts_message(path: Path) -> str | None:
    """The FactsError message for a file, None if it loads; any other exception fails the test."""
    try:
        load_facts(path)
    except FactsError as error:
        return error.message
    return None


def test_garbage_facts_give_facts_errors_and_nothing_else(tmp_path: Path) -> None:
    base = EMPTY_FACTS.read_bytes()
    generator = random.Random(20261201)
    messages = []
    for _ in range(300):
        data = bytearray(base)
        for _ in range(generator.randint(1, 6)):
            at = generator.randrange(len(data))
            data[at : at + generator.randint(0, 3)] = bytes(generator.choice(b'[]{}",:\\0-eE.\x00\xff') for _ in "ab")
        messages.append(_facts_message(write(tmp_path, bytes(data))))
    errors = [message for message in messages if message is not None]
    assert errors
    assert all(message.startswith(str(tmp_path)) for message in errors)
