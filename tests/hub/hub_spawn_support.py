"""What JupyterHub and KubeSpawner do between 'Start' and the pod create call, on real KubeSpawner
objects with no Hub and no cluster (KubeSpawner's ``_mock`` skips the API client)."""

from __future__ import annotations

from types import SimpleNamespace

from jupyterhub import orm
from kubespawner import KubeSpawner
from traitlets.config import Config

from jupyter_vgpu.core import contract
from jupyter_vgpu.hub import VGPUHub

NAMES = contract.DEFAULT_NAMES
CORE, MEM = NAMES.core_resource, NAMES.memory_resource


def make_user(name: str = "alice", groups: tuple[str, ...] = ()) -> SimpleNamespace:
    """A Hub user as the hooks see it; ``spawners`` is JupyterHub's ``User.spawners`` (name -> spawner)."""
    return SimpleNamespace(
        name=name, id=7, url=f"/user/{name}/", escaped_name=name,
        groups=[SimpleNamespace(name=g) for g in groups], spawners={},
    )


def hub_config(**traits) -> Config:
    c = Config()
    c.KubeSpawner.profile_list = [{"display_name": "CPU only", "slug": "cpu", "default": True}]
    for key, value in traits.items():
        setattr(c.VGPUHub, key, value)
    VGPUHub(config=c).configure(c)
    return c


def make_spawner(c: Config, user: SimpleNamespace | None = None, name: str = "") -> KubeSpawner:
    """A KubeSpawner for the user's server ``name``, listed in ``user.spawners`` as the Hub lists it."""
    user = user or make_user()
    # the server's name lives on its database row (Spawner.name), one not in any database here
    spawner = KubeSpawner(_mock=True, config=c, user=user, orm_spawner=orm.Spawner(name=name), namespace="jhub")
    user.spawners[name] = spawner
    return spawner


async def spawn_pod(spawner: KubeSpawner, formdata: dict | None = None, user_options: dict | None = None):
    """The form data parsed into user_options, JupyterHub's apply_user_options step,
    KubeSpawner's profile loading, its pod manifest, then the modify_pod_hook."""
    if formdata is not None:
        user_options = spawner.options_from_form(formdata)
    spawner.user_options = user_options if user_options is not None else {}
    await spawner._run_apply_user_options(spawner.user_options)
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    return await spawner.modify_pod_hook(spawner, pod)


def notebook_env(pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if hasattr(e, "name")}
