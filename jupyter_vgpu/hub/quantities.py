"""Quantities from untrusted input (user_options, request bodies, pod resources) read safely.

user_options and restart bodies are whatever JSON a user sent. The contract's parsers bound a
quantity's type, length, exponent and size before any arithmetic; any error they still raise
becomes a RequestError here, so the Hub answers 400 with a reason and never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Request, RequestError

T = TypeVar("T")

def shown(value: object, width: int = 40) -> str:
    """repr() of a value a user sent, cut short so a message never carries a megabyte."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def guarded(what: str, parse: Callable[[], T]) -> T:
    """``parse()``, with any arithmetic or conversion error turned into a RequestError."""
    try:
        return parse()
    except RequestError:
        raise
    except (ArithmeticError, ValueError, TypeError) as error:  # decimal.Overflow, InvalidOperation, int-str limit
        raise RequestError(f"{what} is too large or malformed to read as a quantity "
                           f"({type(error).__name__}); use e.g. 25 or 4GiB") from None


def checked_count(value: object, name: str) -> int:
    """contract.parse_count for a value from outside (it bounds length, exponent and size before
    any arithmetic), with any error it still raises turned into a RequestError."""
    return guarded(f"{name}: {shown(value)}", lambda: contract.parse_count(value, name))


def checked_memory_size(value: object) -> int:
    """contract.parse_memory_size for a value from outside: vcuda-memory units, or RequestError."""
    if isinstance(value, float):
        raise RequestError(f"memory size {shown(value)}: use e.g. 4GiB, 4096MiB or a whole number of units")
    units = guarded(f"memory size {shown(value)}", lambda: contract.parse_memory_size(value))  # type: ignore[arg-type]
    if units > contract.MAX_COUNT:
        raise RequestError(f"memory size {shown(value)} is more than any node has")
    return units


def checked_request(cores: int, memory_units: int, core_name: str = "vcuda-core",
                    memory_name: str = "vcuda-memory") -> Request:
    """A validated Request whose numbers stay within contract.MAX_COUNT (so every message can print them)."""
    for name, value in ((core_name, cores), (memory_name, memory_units)):
        if isinstance(value, int) and value > contract.MAX_COUNT:
            raise RequestError(f"{name}: {shown(value)} is more than any node has")
    contract.validate_request(cores, memory_units, core_name, memory_name)
    return Request(cores, memory_units)
