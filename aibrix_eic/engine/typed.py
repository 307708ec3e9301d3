"""Option structs as strict as a pybind11 binding's.

A field bound with pybind11's `def_readwrite` takes only values its C++ type
converts from: a `std::string` field refuses None and ints, an enum field
refuses plain ints, and a bound class has no room for attributes it does not
declare. Code that passes on the engine therefore does not lean on Python's
leniency where the vendor binding would raise TypeError.
"""

import enum
from typing import Any


class Field:
    """One typed attribute of a Struct, with its default."""

    def __init__(self, kind: type, default: Any) -> None:
        self.kind = kind
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.where = f"{owner.__name__}.{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.__dict__.get(self.name, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.accepts(value):
            raise TypeError(
                f"{self.where}: incompatible value {value!r} of type {type(value).__name__}; "
                f"the binding takes {self.kind.__name__}"
            )
        obj.__dict__[self.name] = value

    def accepts(self, value: Any) -> bool:
        if issubclass(self.kind, enum.Enum):
            return type(value) is self.kind  # no implicit int -> enum
        if self.kind is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, self.kind)


class Struct:
    """A bound class: only its declared Fields can be set."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not isinstance(getattr(type(self), name, None), Field):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        fields = [name for name in dir(type(self)) if isinstance(getattr(type(self), name), Field)]
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in fields)})"
