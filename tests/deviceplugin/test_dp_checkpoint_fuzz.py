"""kubelet's checkpoint parser under fuzzing: whatever the file holds, the answer is well-typed
entries or a CheckpointError, never another exception (which used to kill the daemon's
supervisor thread before it registered with kubelet)."""

from __future__ import annotations

import base64
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu_plugin.deviceplugin.checkpoint import (
    CheckpointError,
    PodDeviceEntry,
    parse_checkpoint,
    read_checkpoint,
    write_checkpoint,
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)

IDS = st.lists(st.text(max_size=12), max_size=4)


def maybe(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly kubelet's shape, sometimes anything at all."""
    return st.one_of(good, good, JSON)


ENTRY = st.fixed_dictionaries({}, optional={
    "PodUID": maybe(st.text(max_size=8)),
    "ContainerName": maybe(st.text(max_size=8)),
    "ResourceName": maybe(st.text(max_size=8)),
    "DeviceIDs": maybe(st.one_of(IDS, st.dictionaries(st.sampled_from(["-1", "0", "1"]), maybe(IDS), max_size=3))),
    "AllocResp": maybe(st.one_of(st.binary(max_size=16).map(lambda b: base64.b64encode(b).decode()),
                                 st.text(max_size=8))),
})

CHECKPOINT = maybe(st.fixed_dictionaries({
    "Data": maybe(st.fixed_dictionaries({}, optional={
        "PodDeviceEntries": maybe(st.lists(maybe(ENTRY), max_size=3)),
        "RegisteredDevices": JSON})),
    "Checksum": JSON}))


def parsed_or_refused(text: str) -> list[PodDeviceEntry] | None:
    try:
        entries = parse_checkpoint(text)
    except CheckpointError as error:
        assert str(error), "a refusal says why"
        return None
    for entry in entries:
        assert isinstance(entry, PodDeviceEntry)
        assert all(isinstance(v, str) for v in (entry.pod_uid, entry.container_name, entry.resource))
        assert isinstance(entry.device_ids, tuple) and all(isinstance(d, str) for d in entry.device_ids)
        assert isinstance(entry.alloc_response, bytes)
    return entries


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHECKPOINT)
def test_any_checkpoint_shape_is_entries_or_a_checkpoint_error(data):
    parsed_or_refused(json.dumps(data))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=64))
def test_any_text_is_entries_or_a_checkpoint_error(text):
    parsed_or_refused(text)


def test_the_reported_garbled_checkpoints_are_checkpoint_errors():
    good = {"PodUID": "u", "ContainerName": "c", "ResourceName": "r", "DeviceIDs": {"0": ["a"]}, "AllocResp": ""}
    for change in ({"DeviceIDs": {"0": 5}}, {"AllocResp": 5}, {"DeviceIDs": {"0": "ab"}}, {"PodUID": ["x"]},
                   {"AllocResp": "é"}):
        text = json.dumps({"Data": {"PodDeviceEntries": [{**good, **change}]}})
        assert parsed_or_refused(text) is None, change
    for text in ("[" * 100_000, '{"Data": {"PodDeviceEntries": [' + "9" * 5000 + "]}}"):
        assert parsed_or_refused(text) is None


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=64))
def test_any_file_is_entries_or_a_checkpoint_error(tmp_path, raw):
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_bytes(raw)
    try:
        read_checkpoint(str(path))
    except CheckpointError:
        pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.builds(PodDeviceEntry, st.text(max_size=8), st.text(max_size=8), st.text(max_size=8),
                          st.lists(st.text(min_size=1, max_size=8), max_size=4).map(lambda ids: tuple(sorted(set(ids)))),
                          st.binary(max_size=16)), max_size=4))
def test_what_the_simulated_kubelet_writes_reads_back(tmp_path, entries):
    path = str(tmp_path / "kubelet_internal_checkpoint")
    write_checkpoint(path, entries, {})
    assert read_checkpoint(path) == entries
