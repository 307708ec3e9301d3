"""One text for a setting's value that is the same in every process holding
an equal value, and differs wherever the values differ.

`str()` is neither: a set prints in hash order (which PYTHONHASHSEED changes
per process), an object without `__repr__` prints only its address, and a
function prints its name, which two different functions can share. Here
sets are sorted, dicts go by key, objects by their type and fields, and
functions by their bytecode, constants, defaults, closure and the globals
they name. What cannot be rendered so (an object whose text is an address)
raises Unidentifiable instead of being guessed at.
"""

import dataclasses
import enum
import functools
import hashlib
import json
import re
import types
from typing import Any

_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{8,}")  # what CPython prints for an address
_MAX_DEPTH = 48  # deeper than any config; stops runaway object graphs


class Unidentifiable(ValueError):
    """The value has no rendering that is the same in every process."""


def canonical_text(value: Any) -> str:
    """The canonical text of `value`: compact JSON in which every JSON object
    is a tag (`{"set": [...]}`, `{"dict": [...]}`, `{"object": ...}`), so no
    two kinds of value share a text."""
    return _dumps(_Renderer().render(value, 0))


def _dumps(form: Any) -> str:
    return json.dumps(form, ensure_ascii=False, separators=(",", ":"))


def _qualified(kind: Any) -> str:
    return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', getattr(kind, '__name__', '?'))}"


class _Renderer:
    def __init__(self) -> None:
        self._open: set[int] = set()  # ids of the containers being rendered: cycles only, never output

    def render(self, value: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise Unidentifiable(f"nested deeper than {_MAX_DEPTH} levels")
        # Enums first: IntEnum and StrEnum members are ints and strs too.
        if isinstance(value, enum.Enum):
            return {"enum": f"{_qualified(type(value))}.{value.name}"}
        if value is None or isinstance(value, (bool, int, str)):
            return value if type(value) in (bool, int, str, type(None)) else self._plain(value)
        if isinstance(value, float):
            return value if value == value and abs(value) != float("inf") else {"float": repr(value)}
        if isinstance(value, (bytes, bytearray)):
            return {"bytes": bytes(value).hex()}
        if isinstance(value, type):
            return {"type": _qualified(value)}
        if isinstance(value, types.ModuleType):
            return {"module": value.__name__}
        if isinstance(value, types.CodeType):
            return self._code(value, depth)
        marker = id(value)
        if marker in self._open:
            return {"cycle": _qualified(type(value))}
        self._open.add(marker)
        try:
            return self._composite(value, depth + 1)
        finally:
            self._open.discard(marker)

    def _plain(self, value: Any) -> Any:
        """A subclass of bool, int or str: its plain value."""
        for base in (bool, int, str):
            if isinstance(value, base):
                return base(value)
        raise AssertionError(value)

    def _composite(self, value: Any, depth: int) -> Any:
        if isinstance(value, (list, tuple)):
            return [self.render(item, depth) for item in value]
        if isinstance(value, (set, frozenset)):
            return {"set": sorted((self.render(item, depth) for item in value), key=_dumps)}
        if isinstance(value, dict):
            pairs = [[self.render(k, depth), self.render(v, depth)] for k, v in value.items()]
            return {"dict": sorted(pairs, key=lambda pair: _dumps(pair[0]))}
        if isinstance(value, types.FunctionType):
            return self._function(value, depth)
        if isinstance(value, types.MethodType):
            return {"method": self.render(value.__func__, depth), "self": self.render(value.__self__, depth)}
        if isinstance(value, functools.partial):
            return {
                "partial": self.render(value.func, depth),
                "args": self.render(value.args, depth),
                "keywords": self.render(value.keywords, depth),
            }
        if isinstance(value, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
            # C code: its qualified name is all there is, and is fixed by the
            # library version. A bound builtin also names its receiver.
            owner = getattr(value, "__self__", None)
            name = f"{getattr(value, '__module__', None) or ''}.{value.__qualname__}"
            if owner is None or isinstance(owner, types.ModuleType):
                return {"builtin": name}
            return {"builtin": name, "self": self.render(owner, depth)}
        return self._object(value, depth)

    def _object(self, value: Any, depth: int) -> Any:
        kind = _qualified(type(value))
        if hasattr(value, "model_dump"):  # pydantic models: their dump is their state
            fields = dict(value.model_dump())
        elif dataclasses.is_dataclass(value):
            fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        else:
            fields = _instance_fields(value)
        if hasattr(value, "tolist") and not fields:  # tensors, arrays: the state is the data
            return {
                "array": kind,
                "dtype": str(getattr(value, "dtype", "")),
                "data": self.render(value.tolist(), depth),
            }
        if not fields:
            return self._text_of(value)
        form: dict[str, Any] = {
            "object": kind,
            "fields": sorted(([name, self.render(field, depth)] for name, field in fields.items()), key=lambda p: p[0]),
        }
        call = next((kind.__dict__["__call__"] for kind in type(value).__mro__ if "__call__" in kind.__dict__), None)
        if isinstance(call, types.FunctionType):  # a callable object behaves as its class's __call__ says
            form["call"] = self._function(call, depth)
        return form

    def _text_of(self, value: Any) -> str:
        """A field-less object by its text (torch.bfloat16 -> "torch.bfloat16"),
        unless that text is only an address."""
        text = str(value)
        if _ADDRESS.search(text) or text == object.__repr__(value):
            raise Unidentifiable(f"{_qualified(type(value))} prints as its memory address")
        return text

    def _function(self, function: types.FunctionType, depth: int) -> Any:
        code = function.__code__
        cells = [
            cell.cell_contents if _cell_full(cell) else {"empty_cell": True} for cell in function.__closure__ or ()
        ]
        scope = function.__globals__
        named = sorted(name for name in _global_names(code) if name in scope)
        behaviour = [
            self._code(code, depth),
            self.render(function.__defaults__, depth),
            self.render(function.__kwdefaults__, depth),
            [self.render(cell, depth) for cell in cells],
            [[name, self.render(scope[name], depth)] for name in named],
        ]
        # A digest of it keeps log lines short; 128 bits, so equal only when equal.
        digest = hashlib.blake2b(_dumps(behaviour).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        return {"function": f"{function.__module__}.{function.__qualname__}", "behaviour": digest}

    def _code(self, code: types.CodeType, depth: int) -> Any:
        # Not the file name or line numbers: moving a function does not change it.
        return {
            "code": code.co_code.hex(),
            "consts": [self.render(const, depth + 1) for const in code.co_consts],
            "names": list(code.co_names),
            "varnames": list(code.co_varnames),
            "freevars": list(code.co_freevars),
            "cellvars": list(code.co_cellvars),
            "args": [code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags],
        }


def _instance_fields(value: Any) -> dict[str, Any]:
    fields = dict(getattr(value, "__dict__", None) or {})
    for kind in type(value).__mro__:
        slots = kind.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                fields[name] = getattr(value, name)
    return fields


def _cell_full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (raises ValueError when empty)
    except ValueError:
        return False
    return True


def _global_names(code: types.CodeType) -> set[str]:
    """Names the code (and the code nested in it) may look up as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
