"""A simulated Kubernetes control plane for tests and demos, spoken to through the official client.

- ``simkube.apiserver.SimKubeAPI``: an API server on ``https://127.0.0.1:<port>`` (kmock's
  scaffold and reaction DSL for fault injection, over ``simkube.store.Store``: resourceVersions,
  watch resumption and 410 Gone, selectors, the three patch formats, pods/binding, finalizers),
  with a bearer token and a per-instance certificate in the kubeconfig it writes;
- ``simkube.scheduler.SimScheduler``: a kube-scheduler stand-in that reads a real
  KubeSchedulerConfiguration and calls HTTP extenders with kube-scheduler's JSON;
- ``simkube.waiting.wait_for``: the polling loop;
- ``simkube.pytest_plugin``: the ``kube``, ``kube_session`` and ``core_v1`` fixtures.

Nothing here knows about GPUs; the project's demo cluster (``vgpu_plugin.demo``) is built on it.
Submodules are imported on demand, so importing this package costs nothing.
"""
