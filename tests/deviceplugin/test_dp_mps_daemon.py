"""``jupyter-vgpu mps-control-daemon`` against stand-in ``nvidia-cuda-mps-control`` and ``nvidia-smi``
executables: the real process interface (argv, environment, the control daemon's stdin protocol)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from vgpu_plugin.deviceplugin.mps_daemon import (
    MPSControlDaemon,
    MPSDaemonConfig,
    ceiling_commands,
    main,
)

CONTROL = """#!/bin/sh
# stand-in nvidia-cuda-mps-control: -d starts the daemon; otherwise one command on stdin
if [ "$1" = "-d" ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$MPS_LOG"
  exit 0
fi
read -r command
echo "command $command" >> "$MPS_LOG"
case "$command" in
  get_default_active_thread_percentage) [ -e "$MPS_DEAD" ] && exit 1; echo 100.0 ;;
esac
"""
SMI = """#!/bin/sh
echo "smi $*" >> "$MPS_LOG"
if [ "$1" = "-L" ]; then
  echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)"
  echo "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-1)"
fi
"""


@pytest.fixture
def tools(tmp_path, monkeypatch):
    for name, text in (("control", CONTROL), ("smi", SMI)):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    monkeypatch.setenv("MPS_LOG", str(log))
    monkeypatch.setenv("MPS_DEAD", str(tmp_path / "dead"))
    return tmp_path


def calls(tools: Path) -> list[str]:
    return (tools / "calls.log").read_text().splitlines()


def test_start_prepares_the_directories_starts_the_daemon_and_sets_the_ceilings(tools):
    previous = os.umask(0o077)
    (tools / "shm").mkdir(mode=0o755)  # as kubelet creates a missing hostPath
    try:
        config = MPSDaemonConfig(pipe_dir=str(tools / "mps/pipe"), log_dir=str(tools / "mps/log"),
                                 shm_dir=str(tools / "shm"), devices=2,
                                 thread_ceiling=50, memory_ceiling="20G", exclusive=True,
                                 control=str(tools / "control"), smi=str(tools / "smi"))
        MPSControlDaemon(config).start()
    finally:
        os.umask(previous)
    for name in ("pipe", "log"):
        assert stat.S_IMODE((tools / "mps" / name).stat().st_mode) == 0o755
    assert stat.S_IMODE((tools / "shm").stat().st_mode) == 0o1777
    assert calls(tools) == [
        "smi -c EXCLUSIVE_PROCESS",
        f"start pipe={tools / 'mps/pipe'} log={tools / 'mps/log'}",
        "command set_default_active_thread_percentage 50",
        "command set_default_device_pinned_mem_limit 0 20G",
        "command set_default_device_pinned_mem_limit 1 20G",
    ]


def test_without_ceilings_no_command_is_sent():
    assert ceiling_commands(MPSDaemonConfig()) == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"thread_ceiling": 0}, "1-100"),
    ({"thread_ceiling": 101}, "1-100"),
    ({"memory_ceiling": "20GB"}, "like 512M or 16G"),
    ({"memory_ceiling": "0G"}, "like 512M or 16G"),
])
def test_bad_ceilings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MPSDaemonConfig(**kwargs)


def test_the_command_counts_cards_for_memory_ceilings_and_exits_when_the_daemon_stops_answering(tools):
    (tools / "dead").write_text("")  # the control daemon dies right after start
    (tools / "shm").mkdir()
    code = main([f"--pipe-dir={tools / 'pipe'}", f"--log-dir={tools / 'log'}", f"--shm-dir={tools / 'shm'}",
                 "--max-thread-percentage=40",
                 "--max-pinned-memory=10G", "--exclusive=false", "--check-period=0.01",
                 f"--control={tools / 'control'}", f"--smi={tools / 'smi'}"])
    assert code == 1, "kubelet restarts the container"
    assert calls(tools) == [
        "smi -L",
        f"start pipe={tools / 'pipe'} log={tools / 'log'}",
        "command set_default_active_thread_percentage 40",
        "command set_default_device_pinned_mem_limit 0 10G",
        "command set_default_device_pinned_mem_limit 1 10G",
        "command get_default_active_thread_percentage",
    ]


def test_a_failing_start_is_a_clear_error(tools, capsys):
    code = main([f"--pipe-dir={tools / 'pipe'}", f"--log-dir={tools / 'log'}", "--max-thread-percentage=400",
                 f"--control={tools / 'control'}", f"--smi={tools / 'smi'}"])
    assert code == 2 and "1-100" in capsys.readouterr().err
