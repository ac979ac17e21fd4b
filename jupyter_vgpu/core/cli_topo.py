"""``jupyter-vgpu topo`` and ``jupyter-vgpu place``: the topology and placement core from a shell.

Both read `nvidia-smi topo -m` text from a file or stdin (``-``). Exit codes: 0 done,
1 the request does not fit, 2 bad input (unreadable file, unparsable topology, bad flags).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from jupyter_vgpu.core.claims import held_memory_units
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    CardShare,
    Request,
    RequestError,
    format_mib,
    parse_memory_size,
    validate_request,
)
from jupyter_vgpu.core.placement import POLICIES, CardState, NodeState, PodPlacement, place_pod
from jupyter_vgpu.core.topology import Topology, TopologyError, parse_nvidia_smi_topo

DEFAULT_CARD_MEMORY_MIB = 40960

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT = 0, 1, 2


class _InputError(Exception):
    """Bad input; the message is shown as is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _InputError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def _read_topology(path: str) -> Topology:
    return _read_capture(path)[0]


def _read_capture(path: str) -> tuple[Topology, str]:
    """The topology and the text it was read from."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
    except OSError as error:
        raise _InputError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        return parse_nvidia_smi_topo(text), text
    except TopologyError as error:
        where = "stdin" if path == "-" else path
        raise _InputError(f"{where}: {error}") from None


def _run(argv: Sequence[str], parser: _Parser, body: Any) -> int:
    wants_json = "--json" in argv
    try:
        args = parser.parse_args(list(argv))
        return int(body(args))
    except _InputError as error:
        print(str(error), file=sys.stderr)
        if wants_json:
            print(json.dumps({"error": str(error).splitlines()[0]}))
        return EXIT_BAD_INPUT
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0) if isinstance(exit_.code, int | None) else EXIT_BAD_INPUT
    except BrokenPipeError:  # `jupyter-vgpu topo x --json | head`: the reader is gone, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


# --- topo ----------------------------------------------------------------------------------


def _topo_parser() -> _Parser:
    parser = _Parser(prog="jupyter-vgpu topo",
                     description="Show a node's GPU topology (tree and link matrix) from `nvidia-smi topo -m` text.")
    parser.add_argument("file", metavar="FILE", help="a file holding `nvidia-smi topo -m` output, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print JSON: gpus, links and tree")
    return parser


def topo_main(argv: Sequence[str]) -> int:
    def body(args: argparse.Namespace) -> int:
        topology = _read_topology(args.file)
        if args.json:
            print(json.dumps(topology.to_dict(), indent=2))
        else:
            print(topology.render_tree())
            print()
            print(topology.render_matrix())
            print()
            print(topology.render_legend())
        return EXIT_OK

    return _run(argv, _topo_parser(), body)


# --- place ---------------------------------------------------------------------------------


def _place_parser() -> _Parser:
    parser = _Parser(
        prog="jupyter-vgpu place",
        description="Choose card(s) for one vGPU request on a node described by `nvidia-smi topo -m` text.",
        epilog="Exit status: 0 placed, 1 does not fit (the reason is printed), 2 bad input.",
    )
    parser.add_argument("file", metavar="FILE", help="a file holding `nvidia-smi topo -m` output, or - for stdin")
    parser.add_argument("--cores", type=int, required=True,
                        help="compute: 1-99 for a share of one card (in %%), 100*n for n whole cards")
    parser.add_argument("--memory", default=None,
                        help=f"memory: a size such as 4GiB or 4096MiB, or a number of {MEMORY_UNIT_MIB} MiB units "
                             "(required with a share)")
    parser.add_argument("--used", action="extend", nargs="+", default=[], metavar="IDX=CORES[:UNITS]",
                        help="what card IDX already holds, e.g. 2=100 (taken whole) or 0=30:40 "
                             "(30 cores and 40 memory units); repeatable")
    parser.add_argument("--policy", choices=POLICIES, default="binpack", help="placement policy (default binpack)")
    parser.add_argument("--card-memory", type=int, default=None, metavar="MIB",
                        help="memory of each card in MiB (default: the machine's own for a capture bundled with "
                             f"jupyter-vgpu, else {DEFAULT_CARD_MEMORY_MIB}, which the output says)")
    parser.add_argument("--json", action="store_true", help="print JSON: gpus (or error), cores, memoryUnits, linkCost")
    return parser


def _parse_used(items: Sequence[str], count: int) -> list[CardShare]:
    holdings = []
    for item in items:
        index_text, sep, value = item.partition("=")
        cores_text, _, units_text = value.partition(":")
        if not sep or not index_text.strip().isdigit() or not cores_text.strip().isdigit():
            raise _InputError(f"--used {item!r}: expected IDX=CORES[:UNITS], e.g. 2=100 or 0=30:40")
        index, cores = int(index_text), int(cores_text)
        if index >= count:
            raise _InputError(f"--used {item!r}: no card {index}; this node has cards 0-{count - 1}")
        if not 1 <= cores <= CORES_PER_CARD:
            raise _InputError(f"--used {item!r}: cores must be 1-{CORES_PER_CARD}")
        try:
            units = parse_memory_size(units_text) if units_text else 0
        except RequestError as error:
            raise _InputError(f"--used {item!r}: {error}") from None
        holdings.append(CardShare(index, "", cores, units))
    return holdings


def place_main(argv: Sequence[str], card_memory_of: Callable[[str], int | None] | None = None) -> int:
    """``card_memory_of``: the cards' memory in MiB of the machine a capture's text shows, when it is
    known (``jupyter-vgpu place`` passes the bundled captures'); else ``--card-memory`` or the default,
    which the output then says it assumed."""
    def body(args: argparse.Namespace) -> int:
        if args.card_memory is not None and args.card_memory < MEMORY_UNIT_MIB:
            raise _InputError(f"--card-memory {args.card_memory}: a card needs at least {MEMORY_UNIT_MIB} MiB")
        try:
            memory = parse_memory_size(args.memory) if args.memory is not None else 0
            # in this command's own words: its flags, not the resources they become
            validate_request(args.cores, memory, core_name="--cores", memory_name="--memory",
                             memory_example="--memory 4GiB")
            request = Request(args.cores, memory)
        except RequestError as error:
            raise _InputError(f"jupyter-vgpu place: {error}") from None
        topology, text = _read_capture(args.file)
        bundled = card_memory_of(text) if card_memory_of is not None else None
        card_memory = args.card_memory or bundled or DEFAULT_CARD_MEMORY_MIB
        assumed = args.card_memory is None and bundled is None
        units = card_memory // MEMORY_UNIT_MIB
        cards = tuple(CardState(i, units) for i in range(topology.count))
        state = NodeState(cards, topology)
        holdings = _parse_used(args.used, topology.count)
        for share in holdings:
            card = state.card(share.index)
            held = held_memory_units(share.cores, share.memory_units, card.memory_units)
            after = card.holding(share.cores, held)
            if after.used_cores > CORES_PER_CARD or after.used_memory_units > after.memory_units:
                raise _InputError(
                    f"--used: card {share.index} would hold {after.used_cores} cores and "
                    f"{after.used_memory_units} of {after.memory_units} memory units; that is more than it has"
                )
            state = NodeState(tuple(after if c.index == share.index else c for c in state.cards), topology)
        result = place_pod(state, {0: request}, args.policy)
        if not isinstance(result, PodPlacement):
            if args.json:
                print(json.dumps({"error": result.reason, "cardMemoryMib": card_memory}))
            else:
                print(f"does not fit: {result.reason}")
                print(_card_memory_note(card_memory, assumed, bundled))
            return EXIT_REFUSED
        assignment = result.containers[0]
        chosen = [index for index, _, _ in assignment]
        if args.json:
            print(json.dumps({
                "gpus": chosen,
                "cores": [c for _, c, _ in assignment],
                "memoryUnits": [m for _, _, m in assignment],
                "linkCost": result.link_cost,
                "policy": args.policy,
                "cardMemoryMib": card_memory,
            }))
        else:
            print(f"{request.describe()} -> card{'s' if len(chosen) > 1 else ''} {', '.join(map(str, chosen))}")
            for index, cores, held in assignment:
                print(f"  card {index}: {cores} cores, {format_mib(held * MEMORY_UNIT_MIB)}")
            if len(chosen) > 1:
                pairs = [f"{a}-{b} {topology.links[a][b]}" for i, a in enumerate(chosen) for b in chosen[i + 1:]]
                print(f"  links: {', '.join(pairs)} (cost {result.link_cost})")
            print(_card_memory_note(card_memory, assumed, bundled))
        return EXIT_OK

    return _run(argv, _place_parser(), body)


def _card_memory_note(card_memory: int, assumed: bool, bundled: int | None) -> str:
    if assumed:
        return (f"  (cards of {format_mib(card_memory)} assumed: `nvidia-smi topo -m` does not say; "
                "set --card-memory MIB)")
    if bundled is not None and card_memory == bundled:
        return f"  (cards of {format_mib(card_memory)}: the machine of this capture)"
    return f"  (cards of {format_mib(card_memory)})"
