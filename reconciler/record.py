"""Records: value classes like dataclasses, which cost next to nothing to define.

A frozen dataclass writes out and compiles its methods (`__init__`, `__eq__`, `__hash__`,
`__setattr__`, ...) every time the program starts, about 1.7 ms a class here, and a pydantic
model costs as much; `plan` defines some forty such classes (its payloads, the rendered
containers, the components' views), which was about 50 ms of its start-up. A record's methods
are written once, here, and a class only lists its fields.

Type checkers see a `Record` as a frozen dataclass, a `KeywordRecord` as a frozen keyword-only
one and a `MutableRecord` as a plain one (`dataclass_transform`). Pydantic validates a record
from a dict (`__get_pydantic_core_schema__`): its fields, typed as declared, and no other key.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar, cast, dataclass_transform

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

T = TypeVar("T")


class _Factory(NamedTuple):
    make: Callable[[], object]
    compare: bool


def field(*, default_factory: Callable[[], T], compare: bool = True) -> T:
    """A default made afresh for each record: `files: list[str] = field(default_factory=list)`;
    `compare=False` leaves the field out of equality and the hash, as a dataclass field's does."""
    return cast(T, _Factory(default_factory, compare))


_NO_DEFAULT = object()


class _Record:
    """What every record does; `Record` and `KeywordRecord` only tell type checkers how it is built."""

    # The fields in declaration order (a base's first) and the defaults of those that have one.
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, object]] = {}
    # The fields that equality and the hash look at.
    _compared: ClassVar[tuple[str, ...]] = ()
    _positional: ClassVar[bool] = True

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        declared = inspect.get_annotations(cls)
        own = [name for name, kind in declared.items() if not str(kind).startswith(("ClassVar", "typing.ClassVar"))]
        defaults = dict(cls._defaults)
        for name in own:
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
                # An instance always holds every field; a class attribute would only hide a typo.
                type.__delattr__(cls, name)
        cls._fields = (*cls._fields, *(name for name in own if name not in cls._fields))
        cls._defaults = defaults
        ignored = {name for name, default in defaults.items() if isinstance(default, _Factory) and not default.compare}
        cls._compared = tuple(name for name in cls._fields if name not in ignored)

    def __init__(self, *args: object, **values: object) -> None:
        if args:
            if not self._positional or len(args) > len(self._fields):
                raise TypeError(
                    f"{type(self).__name__}() takes {len(self._fields) if self._positional else 0} positional arguments"
                )
            for name, value in zip(self._fields, args, strict=False):
                if name in values:
                    raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
                values[name] = value
        for name in self._fields:
            if name in values:
                value = values.pop(name)
            else:
                default = self._defaults.get(name, _NO_DEFAULT)
                if default is _NO_DEFAULT:
                    raise TypeError(f"{type(self).__name__}() missing argument {name!r}")
                value = default.make() if isinstance(default, _Factory) else default
            object.__setattr__(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments: {', '.join(values)}")

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({shown})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """A dict of exactly the declared fields (those with a default may be left out), each
        validated as its annotation says, then the record built from it; or a record already."""
        from pydantic_core import core_schema

        # include_extras: a field's Annotated constraints (a pattern, a bound) are checked too.
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = {
            name: core_schema.typed_dict_field(handler.generate_schema(hints[name]), required=name not in cls._defaults)
            for name in cls._fields
        }
        from_dict = core_schema.no_info_after_validator_function(
            lambda data: cls(**data),
            core_schema.typed_dict_schema(fields, cls_name=cls.__name__, extra_behavior="forbid"),
        )
        # A record the program built is checked as its fields, the same way as a dict.
        return core_schema.no_info_before_validator_function(
            lambda value: {name: getattr(value, name) for name in cls._fields} if isinstance(value, cls) else value,
            from_dict,
        )


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
class Record(_Record):
    """A value built like a `@dataclass(frozen=True)`: fields by position or by keyword."""


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field,))
class KeywordRecord(_Record):
    """A value built like a `@dataclass(frozen=True, kw_only=True)`: fields by keyword only, so a
    field with a default may come before one without (a payload's `kind` comes first)."""

    _positional = False


@dataclass_transform(field_specifiers=(field,))
class MutableRecord(_Record):
    """A value built like a plain `@dataclass`: fields by position or by keyword, and assignable
    (so, like such a dataclass, not hashable)."""

    __hash__ = None  # type: ignore[assignment]

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)


def record_fields(value: object) -> tuple[str, ...] | None:
    """The fields of a record in declaration order; None when `value` is not a record."""
    return value._fields if isinstance(value, _Record) else None


R = TypeVar("R", bound=_Record)


def replace(record: R, /, **changes: object) -> R:
    """A copy of `record` with these fields changed, as `dataclasses.replace` makes one."""
    values = {name: getattr(record, name) for name in record._fields}
    values.update(changes)
    return type(record)(**values)
