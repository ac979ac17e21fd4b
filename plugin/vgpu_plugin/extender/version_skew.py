"""Is the kube-scheduler beside the extender within Kubernetes' version-skew policy?

The policy: kube-scheduler must not be newer than kube-apiserver and may be at most one
minor version older. vgpu-scheduler runs an upstream kube-scheduler image: the Helm chart
picks the release of the API server's minor at install, a kustomize overlay the
deploy/components/scheduler-<minor> its admin adds, so a cluster upgraded since, or an
overlay with the wrong component, drifts out of policy. The extender checks once at start (it reads
its own pod for the paired image and the API server's /version) and logs a warning;
``jupyter-vgpu doctor`` reports the same verdict.
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
    message: str  # what was found and, unless ok, what to do


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


def judge(server: str | None, scheduler_image: str | None) -> Verdict:
    """The verdict for an API server version (gitVersion) and the paired kube-scheduler image."""
    api = parse_version(server)
    if api is None:
        return Verdict("warn", f"cannot read the API server's version ({server!r}); check the kube-scheduler "
                               "image by hand: at most one minor version older than the API server, never newer")
    tag = image_tag(scheduler_image)
    scheduler = parse_version(tag)
    wanted = KubeVersion(api.major, api.minor, api.patch)
    remedy = (f"set the image in your overlay: images: [{{name: {SCHEDULER_IMAGE}, newTag: {wanted}}}] "
              "(docs/admin.md, 'kube-scheduler version')")
    if scheduler is None:
        return Verdict("warn", f"cannot tell the version of kube-scheduler image {scheduler_image!r} "
                               f"(API server {server}); use a version tag: {remedy}")
    what = f"kube-scheduler {tag} with API server {server}"
    if scheduler.major != api.major or scheduler.minor > api.minor:
        return Verdict("fail", f"{what}: the scheduler is newer than the API server, which the version-skew "
                               f"policy does not allow (it may call APIs this server lacks); {remedy}")
    if api.minor - scheduler.minor > OLDER_MINORS_ALLOWED:
        return Verdict("warn", f"{what}: the scheduler is {api.minor - scheduler.minor} minor versions older "
                               f"than the API server, beyond the supported {OLDER_MINORS_ALLOWED}; {remedy}")
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
    else:
        log.warning("version skew: %s", verdict.message)


def check_in_background(api_client: Any, namespace: str, pod_name: str, container: str) -> threading.Thread:
    """Check once without delaying the extender's start (the API may be slow to answer)."""
    thread = threading.Thread(
        target=lambda: log_verdict(check_paired_scheduler(api_client, namespace, pod_name, container)),
        name="version-skew", daemon=True)
    thread.start()
    return thread
