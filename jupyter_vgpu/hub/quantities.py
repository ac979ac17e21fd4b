"""Quantities from untrusted input (user_options, request bodies, pod resources) read safely.

user_options and restart bodies are whatever JSON a user sent. Every value is type- and
size-checked here before the contract's parsers see it, and any arithmetic error the parsers
still raise becomes a RequestError, so the Hub answers 400 with a reason and never a 500.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Request, RequestError

MAX_QUANTITY_TEXT = 64
"""Longest quantity text read at all: Kubernetes' own quantities are far shorter."""

MAX_EXPONENT = 18
"""Largest decimal exponent a quantity text may carry ('1e18'; ``E``, the largest suffix, is 10**18).
A larger one is refused before the contract sees it: Decimal would build (and int() would
expand) a number of that many digits, blocking the Hub's event loop."""

MAX_COUNT = 2**63 - 1
"""Largest count of an extended resource: Kubernetes keeps them in an int64."""

T = TypeVar("T")

_EXPONENT = re.compile(r"[eE]\s*([+-]?[0-9]+)")


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


def _check_shape(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RequestError(f"{name}: {shown(value)} is not a count (use a whole number such as 25)")
    if isinstance(value, str) and len(value.strip()) > MAX_QUANTITY_TEXT:
        raise RequestError(f"{name}: a quantity of {len(value.strip())} characters is not a count "
                           f"(use a whole number such as 25)")
    if isinstance(value, str):
        exponent = _EXPONENT.search(value)
        if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:
            raise RequestError(f"{name}: {shown(value)} has an exponent beyond ±{MAX_EXPONENT} "
                               f"(use a whole number such as 25)")


def checked_count(value: object, name: str) -> int:
    """contract.parse_count for a value from outside: a count of at most MAX_COUNT, or RequestError."""
    _check_shape(value, name)
    count = guarded(f"{name}: {shown(value)}", lambda: contract.parse_count(value, name))
    if count > MAX_COUNT:
        raise RequestError(f"{name}: {shown(value)} is more than any cluster has")
    return count


def checked_memory_size(value: object) -> int:
    """contract.parse_memory_size for a value from outside: vcuda-memory units, or RequestError."""
    _check_shape(value, "memory")
    if isinstance(value, float):
        raise RequestError(f"memory size {shown(value)}: use e.g. 4GiB, 4096MiB or a whole number of units")
    units = guarded(f"memory size {shown(value)}", lambda: contract.parse_memory_size(value))  # type: ignore[arg-type]
    if units > MAX_COUNT:
        raise RequestError(f"memory size {shown(value)} is more than any cluster has")
    return units


def checked_request(cores: int, memory_units: int, core_name: str = "vcuda-core",
                    memory_name: str = "vcuda-memory") -> Request:
    """A validated Request whose numbers stay within MAX_COUNT (so every message can print them)."""
    for name, value in ((core_name, cores), (memory_name, memory_units)):
        if isinstance(value, int) and value > MAX_COUNT:
            raise RequestError(f"{name}: {shown(value)} is more than any cluster has")
    contract.validate_request(cores, memory_units, core_name, memory_name)
    return Request(cores, memory_units)
