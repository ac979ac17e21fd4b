"""docs/server-api.yaml: the document is valid OpenAPI 3.1, its check can fail, and the
server's real answers (every route, errors included) are checked against it."""

from __future__ import annotations

import json

import pytest
import server_api_support
import tornado.httpclient
from server_api_support import check_response, check_schema, document


def test_the_document_is_openapi_3_1_with_json_schema_2020_12():
    from jsonschema import Draft202012Validator

    spec = document()
    assert spec["openapi"].startswith("3.1.")
    for name, schema in spec["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)  # raises SchemaError, naming the problem
        assert schema.get("type") != "object" or schema.get("additionalProperties") is False \
            or name == "ShareRequestBody", f"{name}: answers are closed objects"


def test_the_check_catches_what_the_document_does_not_say():
    good = {"state": "none", "source": "none", "message": "no GPU", "allocation": None}
    check_response("allocation", "GET", 200, good)
    for bad, words in [({**good, "extra": 1}, "extra"), ({**good, "state": "maybe"}, "maybe"),
                       ({k: v for k, v in good.items() if k != "message"}, "'message' is a required property"),
                       ({**good, "allocation": {"cores": "25"}}, "allocation")]:
        with pytest.raises(AssertionError, match=words):
            check_response("allocation", "GET", 200, bad)
    with pytest.raises(AssertionError, match="does not list"):
        check_response("allocation", "GET", 500, {"message": "boom"})
    with pytest.raises(AssertionError, match="not in server-api.yaml"):
        check_response("nowhere", "GET", 200, {})
    with pytest.raises(AssertionError):
        check_schema("UsageStreamMessage", {"state": "live"})


def test_every_answer_of_a_server_round_is_checked(run, jp_fetch):
    """Through jp_fetch (which checks every vgpu/api answer): each route, each documented error."""
    server_api_support.CHECKED.clear()

    def fetch(*parts, **kwargs):
        return run(jp_fetch("vgpu", "api", *parts, raise_error=False, **kwargs))

    for route in ("allocation", "topology", "usage"):
        assert fetch(route).code == 200
    assert fetch("usage", params={"history": "-1"}).code == 400
    assert fetch("requests").code == 204 and not fetch("requests").body
    assert fetch("requests/r9-none").code == 404
    assert fetch("requests", method="POST", body="not json").code == 400
    accepted = fetch("requests", method="POST", body=json.dumps({"cores": 25, "memory": "4GiB"}))
    assert accepted.code == 202
    request_id = json.loads(accepted.body)["id"]
    assert fetch(f"requests/{request_id}").code == 200 and fetch("requests").code == 200
    with pytest.raises(tornado.httpclient.HTTPClientError):  # raising, the error body is checked too
        run(jp_fetch("vgpu", "api", "requests", "r9-none"))
    assert sorted(set(server_api_support.CHECKED)) == sorted({
        ("allocation", "GET", 200), ("topology", "GET", 200), ("usage", "GET", 200), ("usage", "GET", 400),
        ("requests", "GET", 204), ("requests/r9-none", "GET", 404), ("requests", "POST", 400),
        ("requests", "POST", 202), (f"requests/{request_id}", "GET", 200), ("requests", "GET", 200)})
