"""Records: built, compared and copied like frozen dataclasses; validated by pydantic as declared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import FrozenInstanceError
from typing import Literal

import pytest
from pydantic import TypeAdapter, ValidationError

from reconciler.record import KeywordRecord, MutableRecord, Record, field, record_fields, replace


class Point(Record):
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
    note: str = field(default_factory=str, compare=False)


class Label(Record):
    text: str
    note: str = field(default_factory=str, compare=False)


class Part(KeywordRecord):
    name: str
    size: int | None = None


class Tally(MutableRecord):
    name: str
    seen: list[str] = field(default_factory=list)


class Whole(KeywordRecord):
    kind: Literal["whole"] = "whole"
    parts: tuple[Part, ...]
    where: Point


def test_fields_by_position_or_keyword_with_defaults_in_declared_order() -> None:
    assert Point(1, 2) == Point(x=1, y=2)
    assert Point(1).y == 0
    assert record_fields(Point(1)) == ("x", "y", "tags", "note")
    assert record_fields("not a record") is None


def test_a_default_factory_makes_a_new_value_for_each_record() -> None:
    first, second = Point(1), Point(2)
    first.tags.append("a")
    assert second.tags == []


@pytest.mark.parametrize(
    ("build", "message"),
    [
        # The type checker refuses each of these too (the records are dataclass-like to it).
        (lambda: Point(), "missing argument 'x'"),  # type: ignore[call-arg]
        (lambda: Point(1, 2, [], "", 5), "takes 4 positional arguments"),  # type: ignore[call-arg]
        (lambda: Point(1, x=1), "multiple values for argument 'x'"),  # type: ignore[misc]
        (lambda: Point(1, z=3), "unexpected keyword arguments: z"),  # type: ignore[call-arg]
        (lambda: Part("a"), "takes 0 positional arguments"),  # type: ignore[call-arg]
    ],
)
def test_wrong_arguments_are_refused_as_a_dataclass_refuses_them(build: Callable[[], object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        build()


def test_a_record_cannot_be_changed() -> None:
    point = Point(1)
    with pytest.raises(FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        del point.x


def test_a_mutable_record_can_be_changed_and_so_has_no_hash() -> None:
    tally = Tally("a")
    tally.seen += ["x"]
    tally.name = "b"
    assert tally == Tally("b", ["x"])
    with pytest.raises(TypeError, match="unhashable"):
        hash(tally)


def test_equality_and_hash_follow_the_compared_fields_and_the_class() -> None:
    assert Point(1, note="a") == Point(1, note="b")
    assert hash(Label("a", "b")) == hash(Label("a", "c"))
    assert hash(Label("a")) != hash(Label("b"))
    assert Point(1) != Point(2)
    assert Part(name="a") != Whole(parts=(), where=Point(1))
    assert repr(Part(name="a")) == "Part(name='a', size=None)"


def test_replace_copies_with_changes_and_refuses_an_unknown_field() -> None:
    point = Point(1, 2, ["t"])
    assert replace(point, y=5) == Point(1, 5, ["t"])
    assert point.y == 2
    with pytest.raises(TypeError, match="unexpected"):
        replace(point, z=1)


def test_pydantic_builds_records_from_dicts_with_nested_records_and_defaults() -> None:
    whole = TypeAdapter(Whole).validate_python({"kind": "whole", "parts": [{"name": "a"}], "where": {"x": 1}})
    assert whole == Whole(parts=(Part(name="a"),), where=Point(1))
    assert isinstance(whole.parts[0], Part)


@pytest.mark.parametrize(
    ("data", "location", "error"),
    [
        ({"parts": [], "where": {"x": 1}, "extra": 1}, ("extra",), "extra_forbidden"),
        ({"parts": [{"name": "a", "sha": "0"}], "where": {"x": 1}}, ("parts", 0, "sha"), "extra_forbidden"),
        ({"parts": [], "where": {"y": 1}}, ("where", "x"), "missing"),
        ({"parts": [{"name": 5}], "where": {"x": 1}}, ("parts", 0, "name"), "string_type"),
        ({"parts": [], "where": {"x": 1}, "kind": "half"}, ("kind",), "literal_error"),
        ({"parts": "a", "where": {"x": 1}}, ("parts",), "tuple_type"),
    ],
)
def test_pydantic_refuses_what_the_record_does_not_declare_naming_where(
    data: dict[str, object], location: tuple[str | int, ...], error: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        TypeAdapter(Whole).validate_python(data)
    (problem,) = refused.value.errors()
    assert (problem["loc"], problem["type"]) == (location, error)
