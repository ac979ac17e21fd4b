"""Helpers for the %vgpu tests."""

from __future__ import annotations


def run(ip, line):
    """(stdout, display outputs) of one %vgpu line."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        ip.run_line_magic("vgpu", line)
    return captured.stdout, captured.outputs
