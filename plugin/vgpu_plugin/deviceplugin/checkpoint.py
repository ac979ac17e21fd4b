"""kubelet's device-manager checkpoint (``<plugin dir>/kubelet_internal_checkpoint``).

kubelet records there which devices it gave each pod's container, per resource. The
device plugin reads it to learn what kubelet actually did (reconciliation, restarts);
the simulated kubelet writes it. Format (kubelet >= 1.20):

    {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
                                    "DeviceIDs": {"<numa node>": [ids]}, "AllocResp": "<base64>"}],
              "RegisteredDevices": {"<resource>": [ids]}},
     "Checksum": N}

Older kubelets wrote ``DeviceIDs`` as a plain list; both are read. The checksum is
kubelet's hash of its Go structure, which cannot be reproduced outside Go; it is not
verified here, and the simulated kubelet writes a 32-bit FNV-1a of the compact, key-sorted
JSON of ``Data`` instead (in C: ``fnv-hash-fast``; a pure-Python loop over the ~60 KB file
of a busy node cost 15–100 ms per admission in the classroom storm).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class PodDeviceEntry:
    pod_uid: str
    container_name: str
    resource: str
    device_ids: tuple[str, ...]
    alloc_response: bytes = b""


class CheckpointError(ValueError):
    """The checkpoint file is not in kubelet's format; the message says where."""


def _read_bytes(path: str) -> bytes | None:
    """The file's bytes; None when there is none yet."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _parse_bytes(raw: bytes, known: EntryMemo | None = None) -> list[PodDeviceEntry]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"kubelet checkpoint is not UTF-8: {error}") from None
    return parse_checkpoint(text, known)


class EntryMemo:
    """The entries the last parse read, by the exact JSON of their raw object: kubelet rewrites the
    whole file after each admission, and all but the new pod's entries are the ones read last time.
    ``_entry`` is a function of the raw object alone, so a raw object seen before (the same JSON, its
    keys in the same order) is the same entry. Only what the last parse met is kept."""

    def __init__(self) -> None:
        self._last: dict[bytes, PodDeviceEntry] = {}
        self._now: dict[bytes, PodDeviceEntry] = {}
        self.reused = 0  # entries answered from memory (the others were read)

    def start(self) -> None:
        self._now = {}

    def finish(self) -> None:
        self._last, self._now = self._now, {}

    def entry(self, raw: object, where: str) -> PodDeviceEntry:
        try:
            key = orjson.dumps(raw)
        except (orjson.JSONEncodeError, TypeError):  # e.g. an integer beyond 64 bits: read it, do not remember it
            return _entry(raw, where)
        found = self._now.get(key) or self._last.get(key)
        if found is not None:
            self.reused += 1
        else:
            found = _entry(raw, where)
        self._now[key] = found
        return found


def read_checkpoint(path: str) -> list[PodDeviceEntry]:
    """Entries from kubelet's checkpoint; [] when there is none yet; CheckpointError when malformed."""
    raw = _read_bytes(path)
    return [] if raw is None else _parse_bytes(raw)


class CheckpointReader:
    """``read_checkpoint`` for one path, read again and again (the device plugin after every write
    and every few seconds): the file's bytes are read each time, and parsed only when they differ
    from the last bytes that parsed. The answer is ``read_checkpoint``'s, since the entries are a
    function of the bytes alone; no file, an unreadable file and a malformed one are answered as
    ``read_checkpoint`` answers them, and never from memory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._raw: bytes | None = None
        self._entries: tuple[PodDeviceEntry, ...] = ()
        self._known = EntryMemo()
        self.parses = 0  # how many times bytes were parsed (the other reads found the same bytes again)

    def read(self) -> list[PodDeviceEntry]:
        raw = _read_bytes(self.path)
        if raw is None:
            return []
        if raw != self._raw:
            self._raw = None  # a malformed file leaves nothing remembered
            entries = _parse_bytes(raw, self._known)
            self.parses += 1
            self._raw, self._entries = raw, tuple(entries)
        return list(self._entries)


def parse_checkpoint(text: str, known: EntryMemo | None = None) -> list[PodDeviceEntry]:
    """The entries of a checkpoint's text. Whatever the text holds, the answer is the entries or a
    CheckpointError naming the first thing out of kubelet's format, never another exception.
    ``known``: the entries a reader met in its last parse, to answer unchanged ones from."""
    try:
        data = _loads(text)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, an integer too long, nesting too deep
        raise CheckpointError(f"kubelet checkpoint is not JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("Data"), dict):
        raise CheckpointError("kubelet checkpoint has no 'Data' object")
    raw_entries = data["Data"].get("PodDeviceEntries")
    if raw_entries is None:
        return []
    if not isinstance(raw_entries, list):
        raise CheckpointError("kubelet checkpoint 'PodDeviceEntries' is not a list")
    if known is None:
        return [_entry(raw, f"PodDeviceEntries[{i}]") for i, raw in enumerate(raw_entries)]
    known.start()
    entries = [known.entry(raw, f"PodDeviceEntries[{i}]") for i, raw in enumerate(raw_entries)]
    known.finish()  # only after a whole parse: a malformed file leaves the last one's entries known
    return entries


def _loads(text: str) -> object:
    """``json.loads(text)``, in C when orjson reads the text to the same value. Where orjson refuses
    (NaN, lone surrogates, ...) the stdlib reads or refuses as before. Where orjson differs without
    refusing, its answer holds a float (it reads an integer beyond 64 bits as one) or is nested deep
    (it allows deeper nesting than the stdlib's recursion limit): those texts, never kubelet's, go to
    the stdlib too. Any other value both read alike (strings, 64-bit integers, the last of duplicate keys)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    return json.loads(text) if _unlike_the_stdlib(value) else value


_SHALLOW = 32  # kubelet's checkpoint nests 5 deep


def _unlike_the_stdlib(value: object) -> bool:
    """Whether orjson's value may not be the stdlib's: a float in it, or nesting deeper than ``_SHALLOW``.
    Each container's members are typed in C (``map(type, ...)``): the file's long lists are strings."""
    if type(value) is float:
        return True
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _SHALLOW:
            return True
        members = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        kinds = set(map(type, members))
        if float in kinds:
            return True
        if dict in kinds or list in kinds:
            stack.extend((member, depth + 1) for member in members if type(member) is dict or type(member) is list)
    return False


def _entry(raw: object, where: str) -> PodDeviceEntry:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where} is not an object")
    names = []
    for key in ("PodUID", "ContainerName", "ResourceName"):
        if key not in raw:
            raise CheckpointError(f"{where} lacks {key}")
        if not isinstance(raw[key], str):
            raise CheckpointError(f"{where}.{key} is not a string")
        names.append(raw[key])
    uid, container, resource = names
    return PodDeviceEntry(uid, container, resource, _device_ids(raw.get("DeviceIDs"), where),
                          _alloc_response(raw.get("AllocResp"), where))


def _device_ids(ids: object, where: str) -> tuple[str, ...]:
    """``{"<numa node>": [ids]}`` (kubelet >= 1.20) or a plain list (older kubelets); null is none."""
    if ids is None:
        return ()
    if isinstance(ids, dict):
        lists = [ids[numa] for numa in sorted(ids)]
        if not all(ids_ is None or isinstance(ids_, list) for ids_ in lists):
            raise CheckpointError(f"{where}.DeviceIDs maps a NUMA node to something that is not a list")
        flat = [d for ids_ in lists for d in (ids_ or [])]
    elif isinstance(ids, list):
        flat = ids
    else:
        raise CheckpointError(f"{where}.DeviceIDs is neither a list nor a NUMA map")
    if not all(isinstance(d, str) for d in flat):
        raise CheckpointError(f"{where}.DeviceIDs holds something that is not a string")
    return tuple(sorted(set(flat)))


def _alloc_response(text: object, where: str) -> bytes:
    if text is None:
        return b""
    if not isinstance(text, str):
        raise CheckpointError(f"{where}.AllocResp is not a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or a character outside ASCII
        raise CheckpointError(f"{where}.AllocResp is not base64") from None


def write_checkpoint(path: str, entries: Iterable[PodDeviceEntry],
                     registered: Mapping[str, Iterable[str]], numa_of: Mapping[str, int | None] | None = None) -> None:
    """Write the file atomically in kubelet's format (for the simulated kubelet)."""
    numa_of = numa_of or {}
    _write(path, [_entry_object(entry, numa_of) for entry in entries], registered)


class CheckpointWriter:
    """``write_checkpoint`` for one path, written again and again (the simulated kubelet after every
    admission, ~70 entries and ~2,000 registered IDs on a packed node). Each entry's JSON text is
    built once and kept while the entry is written, as it is a function of the entry and the NUMA map
    alone; the registered devices' text is kept while they are the same IDs. The file is byte for
    byte ``write_checkpoint``'s: orjson writes no whitespace, so a sorted-keys object is its sorted
    members' texts joined. ``numa_of`` must not change in place: a different map (by identity)
    forgets every entry built with the last."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._numa_of: Mapping[str, int | None] | None = None
        self._texts: dict[PodDeviceEntry, bytes] = {}
        self._registered: tuple[dict[str, tuple[str, ...]], bytes] | None = None  # the IDs and their text
        self.built = 0  # entry texts built (the others were kept from the write before)

    def write(self, entries: Iterable[PodDeviceEntry], registered: Mapping[str, Iterable[str]],
              numa_of: Mapping[str, int | None]) -> None:
        if numa_of is not self._numa_of:
            self._numa_of, self._texts = numa_of, {}
        kept: dict[PodDeviceEntry, bytes] = {}
        texts = []
        for entry in entries:
            found = kept.get(entry) or self._texts.get(entry)
            if found is None:
                found = orjson.dumps(_entry_object(entry, numa_of), option=orjson.OPT_SORT_KEYS)
                self.built += 1
            kept[entry] = found
            texts.append(found)
        ids = {name: tuple(devices) for name, devices in registered.items()}
        if self._registered is None or self._registered[0] != ids:
            self._registered = ids, _registered_text(ids)
        _write_encoded(self.path, b'{"PodDeviceEntries":[' + b",".join(texts) + b'],"RegisteredDevices":'
                       + self._registered[1] + b"}")
        self._texts = kept  # only what this write wrote


def _registered_text(registered: Mapping[str, Iterable[str]]) -> bytes:
    return orjson.dumps({name: sorted(ids) for name, ids in registered.items()}, option=orjson.OPT_SORT_KEYS)


def _entry_object(entry: PodDeviceEntry, numa_of: Mapping[str, int | None]) -> dict[str, object]:
    by_numa: dict[str, list[str]] = {}
    for device in entry.device_ids:
        numa = numa_of.get(device)
        by_numa.setdefault(str(numa if numa is not None else -1), []).append(device)
    return {
        "PodUID": entry.pod_uid,
        "ContainerName": entry.container_name,
        "ResourceName": entry.resource,
        "DeviceIDs": by_numa,
        "AllocResp": base64.b64encode(entry.alloc_response).decode(),
    }


def _write(path: str, pod_entries: list[dict[str, object]], registered: Mapping[str, Iterable[str]]) -> None:
    data = {"PodDeviceEntries": pod_entries,
            "RegisteredDevices": {name: sorted(ids) for name, ids in registered.items()}}
    _write_encoded(path, orjson.dumps(data, option=orjson.OPT_SORT_KEYS))


def _write_encoded(path: str, encoded: bytes) -> None:
    """The checkpoint around ``encoded`` (its Data's JSON) with kubelet's checksum, replacing ``path`` atomically."""
    # only the simulated kubelet writes: its dependency ("sim"), not the node daemon's
    from fnv_hash_fast import fnv1a_32

    body = b'{"Data":' + encoded + b',"Checksum":' + str(fnv1a_32(encoded)).encode() + b"}"
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
