"""Fixtures for tests/deviceplugin; they live in deviceplugin_support (a unique module name, so tests can
import its helpers whichever directories pytest collects together)."""

from deviceplugin_support import daemons, gpus, peer, plugin_dir  # noqa: F401
