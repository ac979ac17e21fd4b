"""fgd-filter's typical shape of a pod (``decisions.typical_shape``), memoised by (request, CPU,
selector), equals the shape read from the pod afresh, whatever pods came before it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_filter_property import pod_for, requests
from vgpu_plugin.extender import decisions
from vgpu_plugin.extender.decisions import read_ask, typical_shape
from vgpu_plugin.extender.headroom import pod_cpu_memory

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.fragment import Shape

NAMES = contract.DEFAULT_NAMES

selectors = st.one_of(st.none(), st.dictionaries(st.sampled_from(["zone", "gpu", "", "Zone"]),
                                                 st.one_of(st.sampled_from(["a", "b", "a=b"]), st.integers(0, 2)),
                                                 max_size=3))
pods = st.tuples(requests, st.sampled_from([None, "100m", "2", "0.5", "2000m"]), selectors)


def _pod(asks, cpu, selector):
    pod = pod_for(asks)
    if cpu is not None:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    if selector is not None:
        pod["spec"]["nodeSelector"] = selector
    return pod


def _afresh(pod):
    """The shape as read before the memo: the pod's CPU, its request, its selector's strings."""
    ask = read_ask(pod, NAMES, "fgd-filter")
    shape = Shape.of_pod(ask.requests, pod_cpu_memory(pod)[0])
    if shape is None:
        return None
    selector = pod["spec"].get("nodeSelector") or {}
    items = tuple(sorted({f"{k}={v}" for k, v in selector.items() if isinstance(k, str) and k and isinstance(v, str)}))
    return replace(shape, memory_units=0, selector=items)


@settings(max_examples=200, deadline=None)
@given(st.lists(pods, min_size=1, max_size=8), st.randoms())
def test_typical_shape_memoised_equals_the_shape_read_afresh(specs, rng):
    decisions._TYPICAL_SHAPES.clear()
    seen = [_pod(*spec) for spec in specs]
    order = seen + rng.sample(seen, len(seen))  # each pod met again, in another order
    for pod in order:
        ask = read_ask(pod, NAMES, "fgd-filter")
        expected = _afresh(pod)
        assert typical_shape(pod, ask) == expected
        assert typical_shape(pod, ask, pod_cpu_memory(pod)[0]) == expected
