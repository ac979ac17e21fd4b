"""What the device plugin remembers between reconciliations must not change what it concludes.

``CheckpointReader`` parses kubelet's checkpoint only when its bytes differ from the last
bytes that parsed; ``AnswerMemo`` remembers each recorded answer's env and token check from
one pass to the next. Over random sequences of real checkpoint files (rewrites of the same
size and mtime, entries removed, corrupt files, the file gone) and of answers (real
protobuf answers, corrupt ones, genuine and forged tokens), each answers exactly what the
full reading answers, and the plan built from them is the full pass's plan.
"""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu_plugin.deviceplugin import api_pb2
from vgpu_plugin.deviceplugin.allocator import AnswerMemo
from vgpu_plugin.deviceplugin.checkpoint import (
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    PodDeviceEntry,
    read_checkpoint,
    write_checkpoint,
)
from vgpu_plugin.deviceplugin.reconcile import World, plan_reconcile
from vgpu_plugin.deviceplugin.responses import answer_env
from vgpu_plugin.tokens import TokenMinter

from jupyter_vgpu.core import contract as c

NAMES = c.DEFAULT_NAMES
RESOURCES = (NAMES.core_resource, NAMES.memory_resource)

ENTRY = st.builds(
    PodDeviceEntry,
    pod_uid=st.sampled_from(["uid-a", "uid-b", "uid-c", "uid-d"]),
    container_name=st.sampled_from(["c0", "c1"]),
    resource=st.sampled_from(RESOURCES),
    device_ids=st.lists(st.sampled_from([f"gpu{card}-core-{i:02d}" for card in range(2) for i in range(6)]),
                        min_size=1, max_size=4, unique=True).map(lambda ids: tuple(sorted(ids))),
    alloc_response=st.binary(max_size=24))

STEP = st.one_of(
    st.tuples(st.just("write"), st.lists(ENTRY, max_size=6)),
    st.tuples(st.just("same size"), st.integers(min_value=0)),  # one digit of an ID changed, mtime kept
    st.tuples(st.just("drop"), st.integers(min_value=0)),  # one entry removed
    st.tuples(st.just("corrupt"), st.sampled_from([b"{", b"\xff\xfe", b"[]", b'{"Data": {"PodDeviceEntries": 3}}'])),
    st.tuples(st.just("truncate"), st.integers(min_value=1)),
    st.tuples(st.just("delete"), st.none()),
    st.tuples(st.just("again"), st.none()),  # nothing changed
)


def _full(path: str) -> tuple[str, object]:
    try:
        return "entries", read_checkpoint(path)
    except CheckpointError as error:
        return "error", str(error)


def _remembered(reader: CheckpointReader) -> tuple[str, object]:
    try:
        return "entries", reader.read()
    except CheckpointError as error:
        return "error", str(error)


def _apply(path: str, step: tuple[str, object], entries: list[PodDeviceEntry]) -> list[PodDeviceEntry]:
    """Change the file as the step says; the entries last written (what 'same size' and 'drop' edit)."""
    kind, arg = step
    registered = {NAMES.core_resource: [f"gpu{card}-core-{i:02d}" for card in range(2) for i in range(6)]}
    if kind == "write":
        entries = list(arg)
        write_checkpoint(path, entries, registered)
    elif kind == "same size" and os.path.exists(path) and b"-core-" in open(path, "rb").read():
        # one digit of a held device ID changed in place (the checksum too is 'kubelet's'): same size, same mtime
        before = os.stat(path)
        raw = open(path, "rb").read()
        at = raw.index(b"-core-") + len(b"-core-") + 1  # the first entry's IDs come before RegisteredDevices
        if not raw[at:at + 1].isdigit():  # a truncated file
            return entries
        raw = raw[:at] + str((int(raw[at:at + 1]) + 1 + int(arg) % 8) % 10).encode() + raw[at + 1:]
        with open(path + ".new", "wb") as handle:
            handle.write(raw)
        os.replace(path + ".new", path)
        assert os.path.getsize(path) == before.st_size
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        state, read = _full(path)
        entries = list(read) if state == "entries" else entries
    elif kind == "drop" and entries:
        del entries[int(arg) % len(entries)]
        write_checkpoint(path, entries, registered)
    elif kind == "corrupt":
        with open(path, "wb") as handle:
            handle.write(arg)
    elif kind == "truncate" and os.path.exists(path):
        size = os.path.getsize(path)
        os.truncate(path, max(0, size - 1 - int(arg) % max(size, 1)))
    elif kind == "delete" and os.path.exists(path):
        os.unlink(path)
    return entries


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=14))
def test_the_reader_answers_what_a_full_read_answers_and_parses_only_new_bytes(steps):
    with tempfile.TemporaryDirectory(prefix="vdp-ck-", dir="/tmp") as directory:
        path = os.path.join(directory, "kubelet_internal_checkpoint")
        reader = CheckpointReader(path)
        entries: list[PodDeviceEntry] = []
        parsed: bytes | None = None  # the bytes the reader may answer from
        parses = 0
        for step in steps:
            entries = _apply(path, step, entries)
            expected = _full(path)
            assert _remembered(reader) == expected, step
            # what a parse is owed: bytes that differ from the last that parsed
            raw = open(path, "rb").read() if os.path.exists(path) else None
            if raw is not None and raw != parsed:
                if expected[0] == "entries":
                    parses, parsed = parses + 1, raw
                else:
                    parsed = None  # a malformed file leaves nothing remembered
            assert reader.parses == parses, step
            assert _remembered(reader) == expected, "a second read of the same file"
            assert reader.parses == parses, "the same bytes were parsed again"


def _answer(env: dict[str, str]) -> bytes:
    return api_pb2.ContainerAllocateResponse(envs=env).SerializeToString()


def test_the_answer_memo_answers_what_the_readers_answer_and_asks_each_once_per_pass_run():
    minter = TokenMinter(b"s" * 32)
    other = TokenMinter(b"o" * 32)  # a lost secret: its tokens verify to nothing here
    tokens = [minter.mint(f"id{i}") for i in range(4)] + [other.mint("id9"), None, "", "v1.x.forged", "garbage"]
    answers = [_answer({c.ENV_TOKEN: t or "", c.ENV_DEVICE_INDICES: str(i)}) for i, t in enumerate(tokens)]
    answers += [b"", b"\x0a\xff\xff", b"not protobuf at all"]

    @given(passes=st.lists(st.lists(st.tuples(st.sampled_from(answers), st.sampled_from(tokens)), max_size=8),
                           min_size=1, max_size=8))
    @settings(max_examples=200, deadline=None)
    def run(passes):
        checked: list[str | None] = []

        def verify(token):
            checked.append(token)
            return minter.verify(token)

        memo = AnswerMemo(verify)
        before: set[str | None] = set()
        for asked in passes:
            memo.next_pass()
            checked.clear()
            for raw, token in asked:
                assert memo.env(raw) == answer_env(raw)
                assert memo.verify(token) == minter.verify(token)
            # a token asked in the last pass is not checked again; any other once
            assert sorted(checked, key=str) == sorted({t for _, t in asked} - before, key=str)
            before = {t for _, t in asked}

    run()


def test_a_plan_with_remembered_answers_is_the_full_pass_plan():
    """The out-of-order case of test_dp_reconcile, planned from real protobuf answers: with the memo
    (asked twice, the second time from memory) and without, the plans are equal."""
    from test_dp_reconcile import pod, served
    from vgpu_plugin.deviceplugin.pods import parse_pod
    from vgpu_plugin.deviceplugin.served import Ledger

    from jupyter_vgpu.core.inventory import Card

    minter = TokenMinter(b"s" * 32)
    cards = {i: Card(index=i, uuid=f"GPU-{i}", model="T", memory_mib=16384) for i in range(4)}
    older, newer = pod("older", 0, time_ns=1), pod("newer", 3, time_ns=2)
    ids = ("gpu0-core-00", "gpu0-core-01")
    ledger = Ledger(served={("uid-older", 0): served("older", 0, ids)})
    ledger.given[ids] = (ledger.served[("uid-older", 0)].allocation, ("uid-older", 0))
    env = {c.ENV_DEVICE_INDICES: "0", c.ENV_DEVICE_UUIDS: "GPU-0", c.ENV_CORES: "20",
           c.ENV_MEMORY_MIB: str(8 * c.MEMORY_UNIT_MIB), c.ENV_CONTAINER: "c0", c.ENV_TOKEN: minter.mint("a1")}
    entries = [PodDeviceEntry("uid-newer", "c0", NAMES.core_resource, ids, _answer(env))]
    views = [v for v in (parse_pod(p, "n1", NAMES) for p in (older, newer)) if v is not None]

    def world(verify, read) -> World:
        return World(node="n1", names=NAMES, views=views, cards=cards, verify=verify, answer_env=read, now=100.0)

    full = plan_reconcile(ledger, entries, world(minter.verify, answer_env), gone=set())
    memo = AnswerMemo(minter.verify)
    plans = []
    for _ in range(2):
        memo.next_pass()
        plans.append(plan_reconcile(ledger, entries, world(memo.verify, memo.env), gone=set()))
    assert full.ledger.served[("uid-newer", 0)].allocation.allocation_id == "a1"  # the case did move the record
    for plan in plans:
        assert (plan.ledger, plan.dirty, plan.notes) == (full.ledger, full.dirty, full.notes)


def test_a_rewrite_with_one_more_entry_reads_only_the_new_entry():
    """kubelet rewrites the whole file after each admission: the entries met before are not read again,
    and an entry changed in place (one of its device IDs) is read again."""
    registered = {NAMES.core_resource: [f"gpu0-core-{i:02d}" for i in range(100)]}
    entries = [PodDeviceEntry(f"uid-{n}", "c0", NAMES.core_resource, (f"gpu0-core-{n:02d}",), b"answer %d" % n)
               for n in range(5)]
    with tempfile.TemporaryDirectory(prefix="vdp-ck-", dir="/tmp") as directory:
        path = os.path.join(directory, "kubelet_internal_checkpoint")
        reader = CheckpointReader(path)
        write_checkpoint(path, entries[:4], registered)
        assert reader.read() == entries[:4] and reader._known.reused == 0
        write_checkpoint(path, entries, registered)
        assert reader.read() == entries == read_checkpoint(path)
        assert reader._known.reused == 4
        moved = [*entries[:2], PodDeviceEntry("uid-2", "c0", NAMES.core_resource, ("gpu0-core-42",), b"answer 2"),
                 *entries[3:]]
        write_checkpoint(path, moved, registered)
        assert reader.read() == moved == read_checkpoint(path)
        assert reader._known.reused == 4 + 4


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUE, spaced=st.booleans())
def test_the_checkpoint_json_is_read_as_the_stdlib_reads_it(value, spaced):
    """orjson reads the text where it can; NaN, infinities and integers beyond 64 bits (which it refuses)
    go to the stdlib: the value is the stdlib's either way."""
    from vgpu_plugin.deviceplugin.checkpoint import _loads

    text = json.dumps(value, indent=1 if spaced else None)
    assert repr(_loads(text)) == repr(json.loads(text))


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet='{}[]":,0123456789.eE-+ntrufalsNIy \\ud', max_size=30))
def test_what_the_stdlib_refuses_is_refused(text):
    from vgpu_plugin.deviceplugin.checkpoint import _loads

    try:
        expected = ("value", repr(json.loads(text)))
    except (ValueError, RecursionError):
        expected = ("refused", "")
    try:
        got = ("value", repr(_loads(text)))
    except (ValueError, RecursionError):
        got = ("refused", "")
    assert got == expected


def test_texts_orjson_reads_differently_are_read_by_the_stdlib():
    from vgpu_plugin.deviceplugin.checkpoint import _loads

    for text in ("-9223372036854775809", "[18446744073709551616]", "9" * 5000, '{"a": NaN}', '"\\ud800"',
                 "[" * 40 + "]" * 40, '{"Data": {"PodDeviceEntries": [{"PodUID": 1.5}]}}'):
        try:
            expected = ("value", repr(json.loads(text)))
        except (ValueError, RecursionError) as error:
            expected = ("refused", type(error).__name__)
        try:
            got = ("value", repr(_loads(text)))
        except (ValueError, RecursionError) as error:
            got = ("refused", type(error).__name__)
        assert got == expected, text[:40]


NUMA_MAP = st.dictionaries(st.sampled_from([f"gpu{card}-core-{i:02d}" for card in range(2) for i in range(6)]),
                           st.one_of(st.none(), st.integers(0, 3)), max_size=12)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes=st.lists(st.tuples(st.lists(ENTRY, max_size=6), st.integers(0, 2)), min_size=1, max_size=10),
       maps=st.lists(NUMA_MAP, min_size=3, max_size=3))
def test_the_writer_writes_the_bytes_write_checkpoint_writes(writes, maps):
    """The kubelet stand-in's writer keeps each entry's JSON text and the registered devices' between writes;
    the file is byte for byte ``write_checkpoint``'s, through entries added, removed and repeated, the NUMA
    map replaced and the registered devices changed (a ListAndWatch update), in place too."""
    cores = [f"gpu{card}-core-{i:02d}" for card in range(2) for i in range(6)]
    memory = [f"gpu{card}-mem-{i:04d}" for card in range(2) for i in range(3)]
    variants = [{NAMES.core_resource: cores}, {NAMES.memory_resource: memory[::-1], NAMES.core_resource: cores[:-1]},
                {NAMES.core_resource: cores, NAMES.memory_resource: memory}]
    with tempfile.TemporaryDirectory(prefix="vdp-ck-", dir="/tmp") as directory:
        writer = CheckpointWriter(os.path.join(directory, "kept"))
        full = os.path.join(directory, "full")
        kept_entries: list[PodDeviceEntry] = []
        for step, (entries, which) in enumerate(writes):
            kept_entries = kept_entries[len(kept_entries) // 2:] + entries  # old entries stay, as on a node
            registered = variants[(which + step) % 3]
            if step == 3:
                memory.pop()  # the same list, changed in place
            writer.write(kept_entries, registered, maps[which])
            write_checkpoint(full, kept_entries, registered, maps[which])
            assert open(writer.path, "rb").read() == open(full, "rb").read()


def test_the_writer_builds_only_new_entries():
    registered = {NAMES.core_resource: ["gpu0-core-00", "gpu0-core-01"]}
    entries = [PodDeviceEntry(f"uid-{n}", "c0", NAMES.core_resource, (f"gpu0-core-0{n}",)) for n in range(2)]
    numa = {"gpu0-core-00": 0}
    with tempfile.TemporaryDirectory(prefix="vdp-ck-", dir="/tmp") as directory:
        writer = CheckpointWriter(os.path.join(directory, "kubelet_internal_checkpoint"))
        writer.write(entries[:1], registered, numa)
        writer.write(entries, registered, numa)
        assert writer.built == 2
        writer.write(entries, registered, dict(numa))  # another map: every object built again
        assert writer.built == 4
        assert read_checkpoint(writer.path) == entries
