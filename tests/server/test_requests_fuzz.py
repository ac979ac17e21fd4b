"""Whatever a notebook user POSTs to vgpu/api/requests, the answer is 202 or a 400 with a reason:
never a 500 (hypothesis over the shapes and quantities a hostile tenant can send)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

QUANTITY_TEXT = st.one_of(
    st.from_regex(r"\A[+-]?[0-9]{1,30}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,12})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|m|MiB|GiB)?\Z"),
    st.sampled_from(["1e999999999", "1e5000", "9" * 80, "NaN", "inf", "-0", "0x10", "1_000", "25 %", "4 GiB"]),
    st.text(max_size=70),
)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                   st.floats(allow_nan=True, allow_infinity=True), QUANTITY_TEXT)
VALUE = st.one_of(SCALAR, st.lists(SCALAR, max_size=3), st.dictionaries(st.text(max_size=5), SCALAR, max_size=2))
BODY = st.one_of(
    st.fixed_dictionaries({"cores": VALUE, "memory": VALUE}),
    st.dictionaries(st.sampled_from(["cores", "memory", "gpus", "policy", "extra"]), VALUE, max_size=4),
    VALUE,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODY)
def test_any_request_body_is_accepted_or_refused_with_a_reason(run, jp_fetch, body):
    response = run(jp_fetch("vgpu", "api", "requests", method="POST", body=json.dumps(body), raise_error=False))
    assert response.code in (202, 400), (body, response.code, response.body[:300])
    if response.code == 400:
        assert json.loads(response.body)["message"], body


def test_bodies_that_are_not_json_are_refused_with_a_reason(run, jp_fetch):
    """Not JSON at all, or nested deeper than the JSON reader goes: a 400 saying what to send."""
    for body in ("{cores: 25", "\ud800", '{"cores": ' + "[" * 100_000 + "]" * 100_000 + "}"):
        response = run(jp_fetch("vgpu", "api", "requests", method="POST", body=body.encode("utf-8", "surrogatepass"),
                                raise_error=False))
        assert response.code == 400, (body[:40], response.code, response.body[:300])
        assert "the body is not JSON; send" in json.loads(response.body)["message"], body[:40]
