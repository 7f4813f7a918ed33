"""JSONC as Pi reads it: `//` comments and trailing commas, and surgical edits that keep the rest."""

from __future__ import annotations

import json

import pytest

from reconciler.errors import JsoncError
from reconciler.pi import jsonc

PI_LIKE = """{
  // providers for pi; docs at https://example.com//pi (a comment with a URL)
  "providers": {
    "other-local": {
      "baseUrl": "http://127.0.0.1:9//v1", // a URL with // inside a string
      "apiKey": "quote \\" then // not a comment",
      "models": [{"id": "other-model"},],
    },
  },
}
"""

LAYOUTS = {
    "two spaces": '{\n  "providers": {\n    "a": {"x": 1}\n  }\n}\n',
    "tabs": '{\n\t"providers": {\n\t\t"a": 1\n\t}\n}\n',
    "compact": '{"providers": {"a": 1}}',
    "trailing commas and comments": PI_LIKE,
    "comment after the last member": '{\n  "providers": {\n    "a": 1 // note\n  }\n}\n',
    "empty": '{\n  "providers": {}\n}\n',
    "only a comment inside": '{\n  "providers": {\n    // nothing yet\n  }\n}\n',
    "closing brace on the member's line": '{\n  "providers": {\n    "a": 1 }\n}\n',
}


def test_comments_and_trailing_commas_parse_like_pi() -> None:
    data = jsonc.loads(PI_LIKE)
    other = data["providers"]["other-local"]
    assert other["baseUrl"] == "http://127.0.0.1:9//v1"
    assert other["apiKey"] == 'quote " then // not a comment'
    assert other["models"] == [{"id": "other-model"}]


def test_plain_json_parses_like_json() -> None:
    text = json.dumps({"a": [1, 2.5, -3e2, True, False, None, "é\n"], "b": {}}, indent=2)
    assert jsonc.loads(text) == json.loads(text)


def test_duplicate_keys_keep_the_last_like_json_parse() -> None:
    assert jsonc.loads('{"a": 1, "a": 2}') == {"a": 2}


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{\n  "a": 1\n  "b": 2\n}', 3, "expected ',' or '}'"),
        ('{\n  /* block */ "a": 1\n}', 2, "block comments"),
        ('{\n  "a": "unterminated\n}', 2, "invalid or unterminated string"),
        ("{}\n}", 2, "unexpected text after"),
        ("", 1, "unexpected end of the file"),
        ("{,}", 1, "expected a key"),
        ('{"a": [1,,2]}', 1, "expected a value"),
    ],
)
def test_errors_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(JsoncError) as caught:
        jsonc.loads(text)
    assert caught.value.line == line
    assert message in caught.value.message


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_adding_then_removing_a_member_gives_back_the_same_bytes(layout: str) -> None:
    text = LAYOUTS[layout]
    entry = {"baseUrl": "http://h:8000/v1", "models": [{"id": "m"}]}
    added = jsonc.set_member(text, ["providers"], "dsv41-sparks", entry)
    providers = jsonc.loads(added)["providers"]
    assert providers.pop("dsv41-sparks") == entry
    assert providers == jsonc.loads(text)["providers"]
    removed = jsonc.remove_member(added, ["providers"], "dsv41-sparks")
    assert removed == text


def test_an_added_member_follows_the_file_layout() -> None:
    added = jsonc.set_member(LAYOUTS["tabs"], ["providers"], "b", {"x": 1})
    assert '\t\t"b": {\n\t\t\t"x": 1\n\t\t}' in added
    compact = jsonc.set_member(LAYOUTS["compact"], ["providers"], "b", {"x": 1})
    assert compact == '{"providers": {"a": 1, "b": {"x": 1}}}'


def test_a_comment_on_the_last_members_line_stays_there() -> None:
    added = jsonc.set_member(LAYOUTS["comment after the last member"], ["providers"], "b", 2)
    assert '"a": 1, // note\n    "b": 2\n' in added


def test_replacing_a_member_changes_only_its_value() -> None:
    text = jsonc.set_member(PI_LIKE, ["providers"], "dsv41-sparks", {"v": 1})
    replaced = jsonc.set_member(text, ["providers"], "dsv41-sparks", {"v": 2})
    start = text.index('"dsv41-sparks": ') + len('"dsv41-sparks": ')
    assert replaced[:start] == text[:start]
    assert jsonc.loads(replaced)["providers"]["dsv41-sparks"] == {"v": 2}
    assert replaced.endswith(text[text.index("}", start) + 1 :])


@pytest.mark.parametrize("key", ["first", "middle", "last"])
def test_removing_any_member_keeps_the_others_and_valid_json(key: str) -> None:
    text = '{\n  "first": 1,\n  "middle": 2,\n  "last": 3\n}\n'
    removed = jsonc.remove_member(text, [], key)
    expected = {name: value for name, value in {"first": 1, "middle": 2, "last": 3}.items() if name != key}
    assert json.loads(removed) == expected  # strict JSON stays strict (settings.json)


def test_removing_a_member_leaves_neighbouring_comments() -> None:
    text = '{\n  "a": 1, // about a\n  // about b\n  "b": 2,\n  "c": 3\n}\n'
    removed = jsonc.remove_member(text, [], "b")
    assert "// about a" in removed
    assert "// about b" in removed
    assert jsonc.loads(removed) == {"a": 1, "c": 3}


@pytest.mark.parametrize(
    "text",
    [
        '{"enabledModels": ["a/b", "c/d"]}',
        '{\n  "enabledModels": [\n    "a/b"\n  ]\n}\n',
        '{\n  "enabledModels": [\n    "a/b",\n  ],\n}\n',
    ],
)
def test_appending_then_removing_an_item_gives_back_the_same_bytes(text: str) -> None:
    appended = jsonc.append_item(text, ["enabledModels"], "dsv41-sparks/m")
    assert jsonc.loads(appended)["enabledModels"][-1] == "dsv41-sparks/m"
    assert jsonc.remove_item(appended, ["enabledModels"], "dsv41-sparks/m") == text


def test_set_member_on_the_root_adds_keys_to_an_empty_file() -> None:
    text = jsonc.set_member("{}\n", [], "defaultProvider", "dsv41-sparks")
    text = jsonc.set_member(text, [], "defaultModel", "m")
    assert json.loads(text) == {"defaultProvider": "dsv41-sparks", "defaultModel": "m"}
    assert text == '{\n  "defaultProvider": "dsv41-sparks",\n  "defaultModel": "m"\n}\n'


def test_edits_refuse_a_path_that_is_not_a_container() -> None:
    with pytest.raises(ValueError, match="not a JSON list"):
        jsonc.append_item('{"enabledModels": "x"}', ["enabledModels"], "y")
    with pytest.raises(ValueError, match="no object member"):
        jsonc.set_member("{}", ["providers"], "x", 1)


# --- odd input: CRLF, a byte-order mark, and text that would trip Python's own limits -------------


def _bare_lf(text: str) -> int:
    return text.count("\n") - text.count("\r\n")


@pytest.mark.parametrize("layout", sorted(name for name in LAYOUTS if "\n" in LAYOUTS[name]))
def test_a_crlf_file_stays_crlf_through_add_and_remove(layout: str) -> None:
    text = LAYOUTS[layout].replace("\n", "\r\n")
    entry = {"baseUrl": "http://h:8000/v1", "models": [{"id": "m"}]}
    added = jsonc.set_member(text, ["providers"], "dsv41-sparks", entry)
    assert _bare_lf(added) == 0
    assert jsonc.loads(added)["providers"]["dsv41-sparks"] == entry
    assert jsonc.remove_member(added, ["providers"], "dsv41-sparks") == text


def test_a_crlf_member_is_replaced_in_crlf() -> None:
    text = jsonc.set_member(PI_LIKE.replace("\n", "\r\n"), ["providers"], "dsv41-sparks", {"v": 1})
    replaced = jsonc.set_member(text, ["providers"], "dsv41-sparks", {"v": [1, 2]})
    assert _bare_lf(replaced) == 0
    assert jsonc.loads(replaced)["providers"]["dsv41-sparks"] == {"v": [1, 2]}


@pytest.mark.parametrize(
    "text",
    [
        '{\r\n  "enabledModels": [\r\n    "a/b"\r\n  ]\r\n}\r\n',
        '{\r\n  "enabledModels": [\r\n    "a/b", // x\r\n  ],\r\n}\r\n',
    ],
)
def test_a_crlf_array_item_round_trips(text: str) -> None:
    appended = jsonc.append_item(text, ["enabledModels"], "dsv41-sparks/m")
    assert _bare_lf(appended) == 0
    assert jsonc.remove_item(appended, ["enabledModels"], "dsv41-sparks/m") == text


def test_a_byte_order_mark_is_skipped_and_kept_like_pi_1_6() -> None:
    text = "\ufeff" + LAYOUTS["two spaces"]
    assert jsonc.loads(text) == jsonc.loads(LAYOUTS["two spaces"])
    added = jsonc.set_member(text, ["providers"], "b", 2)
    assert added.startswith("\ufeff{\n")
    assert jsonc.remove_member(added, ["providers"], "b") == text
    with pytest.raises(JsoncError) as caught:
        jsonc.loads("\ufeff{,}")
    assert (caught.value.line, caught.value.column) == (1, 2)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{\n  "a": 1\x00\n}', 2, "a NUL byte"),
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", 1, f"nested more than {jsonc.MAX_DEPTH} levels deep"),
        ('{\n  "a": ' + "9" * 5000 + "\n}", 2, "an integer of 5000 digits"),
    ],
)
def test_input_past_pythons_limits_is_a_located_error(text: str, line: int, message: str) -> None:
    with pytest.raises(JsoncError) as caught:
        jsonc.loads(text)
    assert caught.value.line == line
    assert message in caught.value.message


def test_nesting_up_to_the_limit_parses() -> None:
    depth = jsonc.MAX_DEPTH
    assert jsonc.loads("[" * depth + "]" * depth) is not None
