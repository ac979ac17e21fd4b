"""`jupyter-vgpu topo` and `jupyter-vgpu place`: output, JSON shape, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_vgpu.cli import place_main  # the core's, told the bundled captures' card memory
from jupyter_vgpu.core.cli_topo import topo_main
from jupyter_vgpu.data import TOPOLOGY_DIR

P40 = str(TOPOLOGY_DIR / "p40-7gpu-pix-phb.txt")
DGX = str(TOPOLOGY_DIR / "dgx-a100.txt")
BIN = Path(sys.executable).parent


def run(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_topo_prints_tree_and_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(topo_main, [P40], capsys)
    assert code == 0
    assert "|  |--PIX:4 [3,4,5,6]" in out
    assert out.splitlines()[0] == "ROOT:7"
    assert any(line.split() == ["GPU3", "PHB", "PHB", "PHB", "X", "PIX", "PIX", "PIX", "0"] for line in out.splitlines())


def test_topo_says_what_each_link_name_it_shows_means(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(topo_main, [P40], capsys)
    legend = out[out.index("Legend:"):].splitlines()
    assert code == 0 and legend == ["Legend:", "  X   = the card itself",
                                    "  PIX = PCIe through at most one PCIe switch",
                                    "  PHB = PCIe through a PCIe host bridge (typically the CPU)"]
    code, out, _ = run(topo_main, [DGX], capsys)
    assert "  NV12 = NVLink: a bonded set of 12 NVLinks (more links, faster)" in out.splitlines()
    assert "PIX =" not in out  # only the links this machine has


def test_topo_json_has_gpus_and_links_as_nvidia_smi_writes_them(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(topo_main, [DGX, "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert [g["index"] for g in data["gpus"]] == list(range(8))
    assert [g["numa"] for g in data["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert data["links"][0] == ["X"] + ["NV12"] * 7
    assert data["tree"]["level"] == "ROOT"


def test_topo_bad_input_exits_2_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "topo.txt"
    lines = Path(P40).read_text().splitlines()
    lines[3] = lines[3][:12]
    bad.write_text("\n".join(lines))
    code, out, err = run(topo_main, [str(bad)], capsys)
    assert code == 2 and out == ""
    assert f"{bad}: line 4: GPU2 has" in err
    code, _, err = run(topo_main, [str(tmp_path / "missing.txt")], capsys)
    assert code == 2 and "cannot read" in err and "No such file" in err
    code, _, err = run(topo_main, [], capsys)
    assert code == 2 and "FILE" in err


def test_place_whole_cards_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(place_main, [P40, "--cores", "400", "--json"], capsys)
    assert code == 0
    assert json.loads(out)["gpus"] == [3, 4, 5, 6]
    code, out, _ = run(place_main, [P40, "--cores", "300", "--used", "0=100", "4=10:4", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["gpus"] == [3, 5, 6] and data["memoryUnits"] == [96] * 3  # a P40 has 24 GiB


def test_place_share_with_memory_size_and_card_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(place_main, [P40, "--cores", "30", "--memory", "8GiB", "--used", "5=50:40",
                                    "--card-memory", "24576", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"gpus": [5], "cores": [30], "memoryUnits": [32], "linkCost": 0, "policy": "binpack",
                               "cardMemoryMib": 24576}
    code, out, _ = run(place_main, [P40, "--cores", "30", "--memory", "32", "--used", "5=50:40",
                                    "--policy", "spread", "--json"], capsys)
    assert code == 0 and json.loads(out)["gpus"] != [5]
    code, out, _ = run(place_main, [P40, "--cores", "30", "--memory", "32"], capsys)
    assert code == 0 and out.startswith("30 % of one card with 8 GiB -> card ")


def test_place_refuses_in_its_own_flags_not_resource_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(place_main, [P40, "--cores", "50"], capsys)
    assert code == 2 and out == ""
    assert "--cores=50 is a share of one card and needs --memory too" in err and "e.g. --memory 4GiB" in err
    assert "vcuda" not in err


def test_place_knows_the_card_memory_of_a_bundled_capture(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The P40 box's cards have 24 GiB, not 40: 30 GiB does not fit there, 20 GiB does, and the output
    says which size it placed on; another capture's size is assumed, and the output says so."""
    code, out, _ = run(place_main, [P40, "--cores", "50", "--memory", "30GiB"], capsys)
    assert code == 1 and "the largest card on this node has 24 GiB" in out
    code, out, _ = run(place_main, [P40, "--cores", "50", "--memory", "20GiB", "--json"], capsys)
    assert code == 0 and json.loads(out)["cardMemoryMib"] == 24576
    code, out, _ = run(place_main, [P40, "--cores", "100"], capsys)
    assert code == 0 and "card 0: 100 cores, 24 GiB" in out and "(cards of 24 GiB: the machine of this capture)" in out
    copy = tmp_path / "my-node.txt"
    copy.write_text(Path(P40).read_text().replace("mlx4_0", "mlx5_0"))
    code, out, _ = run(place_main, [str(copy), "--cores", "100"], capsys)
    assert code == 0 and "card 0: 100 cores, 40 GiB" in out and "40 GiB assumed" in out and "--card-memory" in out
    code, out, _ = run(place_main, [str(copy), "--cores", "100", "--card-memory", "16384"], capsys)
    assert code == 0 and "card 0: 100 cores, 16 GiB" in out and "assumed" not in out


def test_place_refusal_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    used = ["--used", "0=100", "2=100", "3=100", "4=100", "6=100"]
    code, out, _ = run(place_main, [P40, "--cores", "400", *used, "--json"], capsys)
    assert code == 1
    assert json.loads(out) == {"error": "only 2 whole cards free (1, 5); asked for 4 whole cards",
                               "cardMemoryMib": 24576}
    code, out, _ = run(place_main, [P40, "--cores", "400", *used], capsys)
    assert code == 1 and out.startswith("does not fit: only 2 whole cards free (1, 5)")


@pytest.mark.parametrize(("argv", "message"), [
    (["--cores", "150"], "--cores=150 is neither a share of one card"),
    (["--cores", "30"], "needs --memory too"),
    (["--cores", "30", "--memory", "3.5GiBs"], "unknown unit"),
    (["--cores", "100", "--used", "9=100"], "--used '9=100': no card 9; this node has cards 0-6"),
    (["--cores", "100", "--used", "2:100"], "expected IDX=CORES[:UNITS]"),
    (["--cores", "100", "--used", "2=130"], "cores must be 1-100"),
    (["--cores", "100", "--used", "2=60", "2=60"], "card 2 would hold 120 cores"),
    (["--cores", "100", "--policy", "random"], "invalid choice: 'random'"),
    (["--cores", "lots"], "invalid int value: 'lots'"),
    (["--cores", "100", "--card-memory", "100"], "--card-memory 100"),
])
def test_place_bad_input_exits_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(place_main, [P40, *argv], capsys)
    assert code == 2, (out, err)
    assert message in err
    code, out, _ = run(place_main, [P40, *argv, "--json"], capsys)
    assert code == 2 and message in json.loads(out)["error"]


def test_the_installed_commands_read_stdin() -> None:
    text = Path(P40).read_text()
    for command in ([str(BIN / "jupyter-vgpu")], [str(BIN / "jupyter"), "vgpu"]):
        done = subprocess.run([*command, "place", "-", "--cores", "200", "--json"], input=text,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["gpus"] == [0, 1]
    done = subprocess.run([str(BIN / "jupyter-vgpu"), "topo", "-", "--json"], input="garbage\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "stdin: line 1: no header row" in done.stderr
