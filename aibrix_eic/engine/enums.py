"""The enums of the EIC SDK surface, with the numbers this engine gives them.

Only the member names are known from public callers (the ones surface.py
names); the numbers are our choice and are documented in
docs/engine.md. Members above 100 are engine-only per-key codes: callers of
the real SDK must treat any code they do not know as a failure, so adding
them keeps the surface compatible while making failures diagnosable.
"""

import enum
from collections.abc import Sequence


class _PybindStyleEnum(enum.Enum):
    """An enum that behaves like pybind11's `py::enum_` without
    `py::arithmetic`: the constructor casts any int (one without a name
    prints as `TransportType.???`), a member equals only a member of its own
    type with the same value and never a plain int, and there is no
    ordering. Code that compares codes with ints therefore fails here as it
    would on the vendor binding."""

    @classmethod
    def _missing_(cls, value: object) -> "_PybindStyleEnum | None":
        if isinstance(value, int) and not isinstance(value, bool):
            unnamed = object.__new__(cls)
            unnamed._value_ = value
            unnamed._name_ = "???"
            return unnamed
        return None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._value_ == other._value_

    def __hash__(self) -> int:
        return hash(self._value_)

    def __int__(self) -> int:
        return self._value_

    def __index__(self) -> int:
        return self._value_

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self._name_}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self._name_}: {self._value_}>"


class StatusCode(_PybindStyleEnum):
    SUCCESS = 0
    FAILED = 1
    PARTIAL_FAILED = 2
    TIMEOUT = 3
    KEY_NOT_EXIST = 5
    GDR_TRANSFER_ERROR = 6
    # Engine-only per-key codes.
    VALUE_TOO_LARGE = 101
    BUFFER_SIZE_MISMATCH = 102
    MEMORY_NOT_REGISTERED = 103
    OUT_OF_CAPACITY = 104
    NAMESPACE_NOT_FOUND = 105
    INVALID_ARGUMENT = 106
    NOT_INITIALIZED = 107
    STORE_BUSY = 108  # a shared store's write found its lock held past the call's deadline


class TransportType(_PybindStyleEnum):
    # 0 and 2 are named by public callers; 3 is everyone's default and is
    # compared against TRANSPORT_GDR, so we read it as GDR.
    TRANSPORT_TCP = 0
    TRANSPORT_RDMA = 2
    TRANSPORT_GDR = 3


class LogLevel(_PybindStyleEnum):
    # Callers only ever build LogLevel(1) and LogLevel(2); names are ours.
    DEBUG = 0
    INFO = 1
    WARNING = 2
    ERROR = 3
    FATAL = 4


class MemoryType(_PybindStyleEnum):
    MEMORY_DEFAULT = 0
    MEMORY_CUDA = 1


def overall_status(codes: Sequence[StatusCode]) -> StatusCode:
    """The call-level status for a list of per-key codes.

    SUCCESS when every key succeeded, FAILED when none did, else
    PARTIAL_FAILED. Public callers see exactly these three at call level.
    """
    succeeded = sum(1 for code in codes if code == StatusCode.SUCCESS)
    if succeeded == len(codes):
        return StatusCode.SUCCESS
    if succeeded == 0:
        return StatusCode.FAILED
    return StatusCode.PARTIAL_FAILED
