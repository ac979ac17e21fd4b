"""A user's limit holds for the sum over their named servers, each counted by what it really
holds: real KubeSpawner objects of one user, started the way the Hub starts them.

Limit 50 % / 20 GiB throughout. Every other server is counted by what its pod was checked
with, or, while it starts, by its user_options resolved as KubeSpawner resolves them (no
profile: KubeSpawner's default profile; a typed share: only in the profile that has the field).
"""

from __future__ import annotations

import pytest
from hub_spawn_support import CORE, MEM, make_spawner, make_user, spawn_pod
from jupyterhub import orm
from tornado import web
from traitlets.config import Config

from jupyter_vgpu.hub import CUSTOM_PROFILE_SLUG, VGPUHub
from jupyter_vgpu.hub.options import UNLISTED_OPTION

LIMIT = {"cores": 50, "memory": "20GiB"}


def only_vgpu_profiles(**admin) -> Config:
    """No profile of the admin's: KubeSpawner's default is the first share, vgpu-quarter (25 % / 20 GiB)."""
    c = Config()
    for key, value in admin.items():
        setattr(c.KubeSpawner, key, value)
    c.VGPUHub.default_limit = LIMIT
    VGPUHub(config=c).configure(c)
    return c


async def start(spawner, user_options: dict):
    """What the Hub does around the hooks (its spawn handler, then User.spawn): the server is pending (active) from
    before its options are checked, and runs once its pod is made."""
    spawner._spawn_pending = True
    pod = await spawn_pod(spawner, user_options=user_options)
    spawner._spawn_pending = False
    spawner.orm_spawner.server = orm.Server(proto="http", ip="127.0.0.1", port=8888, base_url="/", cookie_name="jupyterhub-user")
    return pod


def stop(spawner) -> None:
    spawner.orm_spawner.server = None


async def refused(spawner, user_options: dict) -> str:
    with pytest.raises(web.HTTPError) as info:
        await start(spawner, user_options)
    spawner._spawn_pending = False  # the Hub ends a refused spawn
    assert info.value.status_code == 400
    return info.value.jupyterhub_message


def limits(pod) -> tuple[str, str]:
    resources = pod.spec.containers[0].resources.limits
    return resources[CORE], resources[MEM]


async def test_servers_started_with_no_profile_count_as_kubespawners_default_profile():
    c, user = only_vgpu_profiles(), make_user("mallory")
    pod = await start(make_spawner(c, user, "one"), {})
    assert limits(pod) == ("25", "80")  # KubeSpawner loaded vgpu-quarter
    for name, options in (("two", {}), ("three", {"profile": ""})):
        message = await refused(make_spawner(c, user, name), options)
        assert "25 % of one GPU's compute and 20 GiB" in message and "server 'one'" in message, message
        assert "more than the default limit allows" in message, message


async def test_no_profile_is_the_admins_default_profile_when_there_is_one():
    c = only_vgpu_profiles(profile_list=[{"display_name": "CPU only", "slug": "cpu", "default": True}])
    user = make_user("mallory")
    for name in ("one", "two", "three"):  # CPU servers hold no GPU
        pod = await start(make_spawner(c, user, name), {})
        assert CORE not in (pod.spec.containers[0].resources.limits or {})
    await start(make_spawner(c, user, "gpu"), {"profile": "vgpu-quarter"})


async def test_a_typed_share_is_read_only_in_the_profile_that_offers_it():
    c, user = only_vgpu_profiles(), make_user("mallory")
    stray = {"profile": "vgpu-quarter", UNLISTED_OPTION: "1% 256MiB"}
    message = await refused(make_spawner(c, user, "one"), stray)
    assert "typed share" in message and CUSTOM_PROFILE_SLUG in message and "'vgpu-quarter'" in message, message
    message = await refused(make_spawner(c, user, "two"), {UNLISTED_OPTION: "1% 256MiB"})  # no profile: the default
    assert "typed share" in message, message
    pod = await start(make_spawner(c, user, "three"), {"profile": CUSTOM_PROFILE_SLUG, UNLISTED_OPTION: "1% 256MiB"})
    assert limits(pod) == ("1", "1")


async def test_a_starting_server_counts_before_its_pod_is_made():
    """Two spawns at once: the first has passed its check and waits for its pod; the second must
    count it as the profile KubeSpawner will load, whatever typed text it carries."""
    c, user = only_vgpu_profiles(), make_user("mallory")
    for first_options in ({}, {"profile": "vgpu-quarter", UNLISTED_OPTION: "1% 256MiB"}):
        first = make_spawner(c, user, "first")
        first._spawn_pending, first.user_options = True, first_options
        message = await refused(make_spawner(c, user, "second"), {"profile": CUSTOM_PROFILE_SLUG, UNLISTED_OPTION: "1% 256MiB"})
        assert "server 'first'" in message and "20 GiB" in message, message
        first._spawn_pending = False


async def test_a_server_is_counted_by_what_its_pod_asks_for():
    """The admin's pod hook gives CPU pods a quarter card: the server holds what its pod asks for,
    not what its user_options name."""
    def quarter_for_everyone(spawner, pod):
        pod.spec.containers[0].resources.limits = {CORE: "25", MEM: "80"}
        return pod

    c = only_vgpu_profiles(modify_pod_hook=quarter_for_everyone,
                           profile_list=[{"display_name": "CPU only", "slug": "cpu", "default": True}])
    user = make_user("mallory")
    await start(make_spawner(c, user, "one"), {"profile": "cpu"})
    message = await refused(make_spawner(c, user, "two"), {"profile": "vgpu-quarter"})
    assert "server 'one'" in message, message
    # a stopped server holds nothing
    stop(user.spawners["one"])
    await start(make_spawner(c, user, "two"), {"profile": "vgpu-quarter"})
