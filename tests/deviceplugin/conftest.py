"""Fixtures for tests/deviceplugin; they live in dp_helpers (a unique module name, so tests can
import its helpers whichever directories pytest collects together)."""

from dp_helpers import daemons, gpus, peer, plugin_dir  # noqa: F401
