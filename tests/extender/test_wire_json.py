"""The extender's request reader (``wire._load``): orjson where it reads exactly what json reads,
json otherwise; every body, accepted or refused, ends as json alone would leave it."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_plugin.extender.wire import WireError, _load

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(["\ud800", "\udfff"]),
                     max_size=6))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.sampled_from(["Pod", "pod", "POD", "NodeNames", "k", "é"]) | st.text(max_size=4),
                                        inner, max_size=5), max_leaves=30)


def _same(a: object, b: object) -> bool:
    """Equal values of equal types all the way down (NaN equal to NaN; 1 and 1.0 not equal)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@contextlib.contextmanager
def _recursion_limit(limit: int) -> Iterator[None]:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def _json_reads(body: bytes) -> object:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return WireError


def _extender_reads(body: bytes) -> object:
    try:
        return _load(body)
    except WireError:
        return WireError


@settings(max_examples=400, deadline=None)
@given(VALUES, st.sampled_from(["", " ", "\n"]), st.booleans())
def test_reads_what_json_reads(value, space, ascii_only):
    body = (space + json.dumps(value, ensure_ascii=ascii_only) + space).encode("utf-8", "surrogatepass")
    assert _same(_extender_reads(body), _json_reads(body))


@pytest.mark.parametrize("body", [
    b'{"a":1,"a":2,"A":3}',                          # duplicate keys: the last wins, first position kept
    b'[123456789012345678901234567890, -9223372036854775809, 18446744073709551616]',  # beyond 64 bits
    b'[9223372036854775807, -9223372036854775808, 18446744073709551615]',
    b'[1e400, -1e400, NaN, Infinity, -Infinity, 1.5e-400, -0.0, -0]',
    b'"\\ud800"', b'\xef\xbb\xbf{"Pod": {}}', '{"Pod": "\u00e9"}'.encode("utf-16"),
    b'["node-0001", "x\\u0000y", "\\u00e9\\ud83d\\ude00"]', b'{"a": "1234567890123456789"}',
    b'[' * 1010 + b']' * 1010,                       # deeper than json reads, within orjson's 1,024
    b'[1,]', b'{"a" 1}', b'"\xff"', b'nul', b'[' * 5000 + b']' * 5000,
    b'{"Pod": {"spec": {"overhead": {"cpu": 2.5}}}, "NodeNames": ["a", "b"]}',  # a float deep in the pod
    b'{"Pod": {"x": [[{"y": 123456789012345678901234}]]}, "NodeNames": ["a"]}',  # a long number deep in it
    b'{"NodeNames": ["a", 18446744073709551616, "b"]}', b'{"NodeNames": ["a", 1.0]}', b'[[[["a"], 1e2]]]',
])
def test_edge_bodies_read_as_json_reads_them(body):
    try:
        expected = _json_reads(body)
    except RecursionError:
        # json's C reader stops at the interpreter's recursion limit (less the caller's depth);
        # orjson reads up to 1,024 levels: a body between the two is read as json reads it with room
        try:
            read = _load(body)
        except WireError as error:  # too deep for both readers: a clear refusal, not a crash
            assert str(error) == "request body nests too deeply to read"
            return
        with _recursion_limit(10_000):
            assert _same(read, json.loads(body))
        return
    with _recursion_limit(10_000):  # the comparison recurses as deep as the body nests
        assert _same(_extender_reads(body), expected)
