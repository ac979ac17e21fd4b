"""Is the kube-scheduler beside the extender within Kubernetes' version-skew policy?

The policy: kube-scheduler must not be newer than kube-apiserver and may be at most one
minor version older. vgpu-scheduler runs an upstream kube-scheduler image: the Helm chart
picks the release of the API server's minor at install, a kustomize overlay the
deploy/components/scheduler-<minor> its admin adds, so a cluster upgraded since, or an
overlay with the wrong component, drifts out of policy. The extender checks once at start (it reads
its own pod for the paired image and the API server's /version) and logs a warning;
``jupyter-vgpu doctor`` reports the same verdict (``judge``), as a failure where it is one.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# kube-scheduler may trail kube-apiserver by this many minor versions, and never lead it
OLDER_MINORS_ALLOWED = 1
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class KubeVersion:
    major: int
    minor: int
    patch: int | None = None

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}" + ("" if self.patch is None else f".{self.patch}")


@dataclass(frozen=True)
class Verdict:
    level: str  # "ok", "warn" or "fail"
    message: str  # what was found
    remedy: str = ""  # what to do, unless ok


# The Kubernetes minors the chart (values.yaml, images.kubeScheduler.tagsByMinor) and
# deploy/components/scheduler-<minor> ship a kube-scheduler for (tests/deploy checks they
# agree). deploy/base's own tag is SCHEDULER_TAG_UNSET, which no registry has: a kustomize
# overlay without one of the components deploys no scheduler at all.
SCHEDULER_MINORS = ((1, 35), (1, 36), (1, 37))
SCHEDULER_TAG_UNSET = "unset-add-deploy-components-scheduler-1.minor"
SKEW_DOC = "docs/admin.md, 'kube-scheduler version'"


def parse_version(text: str | None) -> KubeVersion | None:
    """'v1.32.4', '1.30', 'v1.30.6-eks-7f9249a' -> KubeVersion; None when it is not one."""
    found = _VERSION.match((text or "").strip())
    if found is None:
        return None
    patch = found.group(3)
    return KubeVersion(int(found.group(1)), int(found.group(2)), None if patch is None else int(patch))


def image_tag(image: str | None) -> str | None:
    """'registry.k8s.io/kube-scheduler:v1.32.4@sha256:...' -> 'v1.32.4'; None when untagged."""
    if not image:
        return None
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def scheduler_remedy(server: KubeVersion) -> str:
    """What to change for an API server of version ``server``."""
    if (server.major, server.minor) in SCHEDULER_MINORS:
        return (f"Helm: run helm upgrade, which picks the kube-scheduler of the API server's minor (or set "
                f"images.kubeScheduler.tag); kustomize: add deploy/components/scheduler-{server.major}.{server.minor} "
                f"to your overlay's components: (in place of any other scheduler-* component or {SCHEDULER_IMAGE} "
                f"images: entry; {SKEW_DOC})")
    shipped = ", ".join(f"{major}.{minor}" for major, minor in SCHEDULER_MINORS)
    return (f"jupyter-vgpu ships a kube-scheduler for {shipped} only: set images.kubeScheduler.tag (Helm) or "
            f"images: [{{name: {SCHEDULER_IMAGE}, newTag: v{server.major}.{server.minor}.<patch>}}] (kustomize) to "
            f"the newest patch of your API server's minor ({SKEW_DOC})")


def judge(server: str | None, scheduler_image: str | None) -> Verdict:
    """Kubernetes' version-skew policy for kube-scheduler and the API server (gitVersion): never
    newer, at most OLDER_MINORS_ALLOWED minor(s) older. Outside it is a failure: upstream
    supports no such pair, and a newer scheduler may call APIs the server does not serve."""
    api = parse_version(server)
    if api is None:
        return Verdict("warn", f"cannot read the API server's version ({server!r})",
                       "check the kube-scheduler image by hand: the API server's minor version or one older, "
                       f"never newer ({SKEW_DOC})")
    tag = image_tag(scheduler_image)
    if tag == SCHEDULER_TAG_UNSET:
        return Verdict("fail", f"kube-scheduler image {scheduler_image} has no version: the overlay adds none of "
                               "deploy/components/scheduler-<minor>, so vgpu-scheduler cannot start (no such image)",
                       scheduler_remedy(api))
    scheduler = parse_version(tag)
    if scheduler is None:
        return Verdict("warn", f"cannot tell the version of kube-scheduler image {scheduler_image!r} "
                               f"(API server {server})", f"use a version tag: {scheduler_remedy(api)}")
    what = f"kube-scheduler {tag} with API server {server}"
    if (scheduler.major, scheduler.minor) > (api.major, api.minor):
        return Verdict("fail", f"{what}: the scheduler is newer than the API server, which the version-skew policy "
                               "does not allow (it may call APIs this server does not serve)", scheduler_remedy(api))
    if scheduler.major != api.major:
        return Verdict("fail", f"{what}: another major version; the version-skew policy allows the same minor or "
                               f"{OLDER_MINORS_ALLOWED} older", scheduler_remedy(api))
    behind = api.minor - scheduler.minor
    if behind > OLDER_MINORS_ALLOWED:
        return Verdict("fail", f"{what}: the scheduler is {behind} minor versions older than the API server; the "
                               f"version-skew policy allows {OLDER_MINORS_ALLOWED}", scheduler_remedy(api))
    if behind:
        return Verdict("ok", f"{what}: within the version-skew policy (one minor older, as during a control-plane "
                             "upgrade; move to the API server's minor next)")
    return Verdict("ok", f"{what}: within the version-skew policy")


def server_version(api_client: Any) -> str:
    """The API server's gitVersion, from /version (readable by every authenticated client)."""
    from kubernetes import client

    return str(client.VersionApi(api_client).get_code().git_version)


def paired_image(api_client: Any, namespace: str, pod_name: str, container: str) -> str | None:
    """The image of ``container`` in the extender's own pod (None when there is no such container)."""
    from kubernetes import client

    pod = client.CoreV1Api(api_client).read_namespaced_pod(pod_name, namespace)
    for candidate in pod.spec.containers or []:
        if candidate.name == container:
            return str(candidate.image)
    return None


def check_paired_scheduler(api_client: Any, namespace: str, pod_name: str, container: str) -> Verdict:
    """Read both versions and judge them; an unreadable API is a warning, never an exception."""
    try:
        image = paired_image(api_client, namespace, pod_name, container)
        server = server_version(api_client)
    except Exception as error:  # the official client raises ApiException, urllib3 and OSError errors
        return Verdict("warn", f"cannot check the kube-scheduler version: reading pod {namespace}/{pod_name} "
                               f"or /version failed ({error})")
    if image is None:
        return Verdict("warn", f"pod {namespace}/{pod_name} has no container {container!r}; cannot check the "
                               "kube-scheduler version (--scheduler-container)")
    return judge(server, image)


def log_verdict(verdict: Verdict) -> None:
    if verdict.level == "ok":
        log.info("version skew: %s", verdict.message)
    else:  # the extender serves on: a wrong scheduler is the admin's to replace (doctor fails on it)
        log.warning("version skew: %s; %s", verdict.message, verdict.remedy)


def check_in_background(api_client: Any, namespace: str, pod_name: str, container: str) -> threading.Thread:
    """Check once without delaying the extender's start (the API may be slow to answer)."""
    thread = threading.Thread(
        target=lambda: log_verdict(check_paired_scheduler(api_client, namespace, pod_name, container)),
        name="version-skew", daemon=True)
    thread.start()
    return thread
