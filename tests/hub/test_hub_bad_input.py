"""Whatever a user sends, the Hub side refuses it with a reason (400 / RequestError), never a 500.

Fuzzed user_options go the way a spawn goes through real KubeSpawner objects
(apply_user_options, profile loading, the pod manifest, the pod hook); fuzzed restart bodies
go over HTTP to the restart endpoint of a real JupyterHub process.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from hub_spawn_support import CORE, MEM, hub_config, make_spawner, make_user, spawn_pod
from hub_support import HUBFILES, running_hub
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tornado import web

from jupyter_vgpu.core import contract
from jupyter_vgpu.hub import CUSTOM_PROFILE_SLUG, SHARE_OPTION, Limit

UNLISTED = f"{SHARE_OPTION}--unlisted-choice"
LIMIT = {"cores": 200, "memory": "80GiB"}
SLUGS = ["cpu", "vgpu-quarter", "vgpu-half", "vgpu-one", "vgpu-two", CUSTOM_PROFILE_SLUG]

# numbers and quantities as a hostile user would send them, next to ordinary ones
ABSURD = ["1e999999999", "1e5000", "-1e999999999", "1e-999999999", "9" * 5000, "1E+18", "1Ei", "NaN",
          "Infinity", "0x10", " 25 ", "", "25", "30", "100", "0", "1e2", "100m"]
quantity_text = st.one_of(
    st.sampled_from(ABSURD),
    st.from_regex(r"[+-]?[0-9]{1,30}(\.[0-9]{0,8})?([eE][+-]?[0-9]{1,12})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|u|n)?",
                  fullmatch=True),
    st.text(max_size=12),
)
junk = st.one_of(st.none(), st.booleans(), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
count = st.one_of(
    st.integers(min_value=0, max_value=400),
    st.integers(),
    st.sampled_from([2**63, 2**64, 10**300, 10**4000, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    quantity_text,
    junk,
)
share_text = st.one_of(
    st.sampled_from(["30% 8GiB", "2 GPUs", "1" * 5000 + " GPUs", "30% " + "9" * 40 + "GiB", "30% 1e999GiB",
                     "99% 512GiB", "0% 8GiB", "30% 8Ti", "5/1GB", "30 % 8 GiB"]),
    st.from_regex(r"[0-9]{1,40} ?%? ?[,/]? ?[0-9]{1,40}(\.[0-9]{1,12})? ?(GiB|MiB|Gi|Mi|G|M|gb|mb|GB|MB|Ti)",
                  fullmatch=True),
    st.from_regex(r"[0-9]{1,40} ?(GPUs?|gpus?|cards?)", fullmatch=True),
    st.text(max_size=20),
    junk,
)
user_options = st.one_of(
    st.fixed_dictionaries({}, optional={
        "profile": st.one_of(st.sampled_from(SLUGS), junk),
        SHARE_OPTION: st.one_of(st.sampled_from(SLUGS), st.text(max_size=8), junk),
        UNLISTED: share_text,
        contract.HUB_OPTION_CORES: count,
        contract.HUB_OPTION_MEMORY_UNITS: count,
        "image": st.text(max_size=8),
    }),
    st.lists(st.integers(), max_size=3),
    st.text(max_size=8),
    st.integers(),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=user_options)
def test_fuzzed_user_options_are_refused_with_a_400_or_spawn_within_the_limit(options):
    """apply_user_options refuses with a 400 and a reason, or the whole spawn goes through and
    the pod asks for no more than the limit: no other exception anywhere on the way."""
    config = hub_config(default_limit=LIMIT)

    async def spawn():
        spawner = make_spawner(config)
        if not isinstance(options, dict):  # KubeSpawner's user_options trait holds dicts only
            await spawner.apply_user_options(spawner, options)
            raise AssertionError(f"user_options {options!r} were accepted")
        return await spawn_pod(spawner, user_options=options)

    try:
        pod = asyncio.run(spawn())
    except web.HTTPError as error:
        assert error.status_code == 400 and error.jupyterhub_message, error
        return
    limits = pod.spec.containers[0].resources.limits or {}
    request = contract.parse_container_request(limits, pod.spec.containers[0].resources.requests)
    if request is not None:
        assert Limit.from_spec(LIMIT, "the limit").allows(request), (options, limits)
        assert pod.spec.scheduler_name == contract.SCHEDULER_NAME


def test_a_bad_typed_share_beside_runtime_options_is_refused_with_a_400():
    """Found by the fuzzer: runtime keys made apply_user_options skip the typed 'Other…' text,
    which KubeSpawner then read when loading the profile and failed the spawn without a 400."""
    options = {UNLISTED: "30% " + "9" * 40 + "GiB", "profile": CUSTOM_PROFILE_SLUG,
               contract.HUB_OPTION_MEMORY_UNITS: 0}

    async def spawn():
        return await spawn_pod(make_spawner(hub_config(default_limit=LIMIT)), user_options=options)

    with pytest.raises(web.HTTPError) as refused:
        asyncio.run(spawn())
    assert refused.value.status_code == 400 and "too large or malformed" in refused.value.jupyterhub_message


@pytest.mark.parametrize(
    "limits, words",
    [
        (["vcuda-core"], "must be a mapping"),
        ("tencent.com/vcuda-core", "must be a mapping"),
        ({CORE: "1e999999999"}, "exponent beyond"),
        ({CORE: "1e5000"}, "exponent beyond"),
        ({CORE: str(10**20)}, "more than any node has"),
        ({CORE: "30", MEM: "9" * 40}, "more than any node has"),
        ({CORE: "30", MEM: "1" + "0" * 80}, "characters is not a count"),
    ],
)
async def test_malformed_pod_resources_from_a_hook_are_refused_with_a_reason(limits, words):
    """An admin's pod hook (or a profile override) that leaves vGPU resources of the wrong
    shape or size: the pod hook refuses the pod with the reason instead of crashing."""
    from traitlets.config import Config

    from jupyter_vgpu.hub import VGPUHub

    def admin_hook(spawner, pod):
        pod.spec.containers[0].resources.limits = limits
        return pod

    c = Config()
    c.KubeSpawner.modify_pod_hook = admin_hook
    VGPUHub(config=c).configure(c)
    with pytest.raises(contract.RequestError, match=words):
        await spawn_pod(make_spawner(c, make_user()))


# --- the restart endpoint, over HTTP ---------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzhub")
    config = f"""
        from jupyter_vgpu.hub import VGPUHub

        c.JupyterHub.spawner_class = "simple"
        c.Spawner.cmd = [{sys.executable!r}, {str(HUBFILES / 'standin_server.py')!r}]
        c.Spawner.environment = {{"STANDIN_RECORD_DIR": {str(root)!r}}}
        c.Spawner.http_timeout = 60
        c.Spawner.start_timeout = 60
        c.VGPUHub.default_limit = {LIMIT!r}
        VGPUHub(config=c).configure(c)
        c.Spawner.apply_user_options = c.KubeSpawner.apply_user_options
    """
    with running_hub(root, config, users=("alice",)) as hub:
        yield hub


restart_body = st.one_of(
    st.fixed_dictionaries({}, optional={contract.HUB_OPTION_CORES: count,
                                        contract.HUB_OPTION_MEMORY_UNITS: count}),
    st.fixed_dictionaries({contract.HUB_OPTION_CORES: count}, optional={
        "profile": st.sampled_from(SLUGS), UNLISTED: share_text}),
    st.lists(count, max_size=3),
    count,
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=restart_body)
def test_fuzzed_restart_bodies_get_a_400_with_a_reason_never_a_500(fuzz_hub, body):
    status, answer = fuzz_hub.call("POST", "/vgpu/restart/alice", body=body)
    event(f"HTTP {status}")
    assert status in (202, 400, 409), (status, answer, json.dumps(body)[:200])
    assert isinstance(answer, dict) and answer.get("message"), answer
    if status == 202:  # only a well-formed share within the limit starts a restart
        assert set(body) <= {contract.HUB_OPTION_CORES, contract.HUB_OPTION_MEMORY_UNITS}
        assert answer["cores"] <= LIMIT["cores"] and answer["memoryUnits"] <= 80 * 4, answer


@pytest.mark.slow
@pytest.mark.parametrize("body", [
    {contract.HUB_OPTION_CORES: "1e999999999", contract.HUB_OPTION_MEMORY_UNITS: 8},
    {contract.HUB_OPTION_CORES: "1e5000"},
    {contract.HUB_OPTION_CORES: 30, contract.HUB_OPTION_MEMORY_UNITS: "1e999999999"},
    {contract.HUB_OPTION_CORES: 30, contract.HUB_OPTION_MEMORY_UNITS: "8E700000"},
])
def test_absurd_restart_bodies_are_a_400(fuzz_hub, body):
    """The cases found by hand (issue 12) and by the fuzzer: each was a 500, or held the Hub's
    event loop while Decimal expanded a number of 700000 digits, before."""
    status, answer = fuzz_hub.call("POST", "/vgpu/restart/alice", body=body)
    assert status == 400, (status, answer)
    assert answer["message"], answer
