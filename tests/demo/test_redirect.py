"""The demo opens the browser on a 0600 redirect page, so the lab's token is on no command line."""

from __future__ import annotations

import stat
from pathlib import Path

from vgpu_plugin.demo.lab import write_redirect


def test_the_redirect_page_is_private_and_leads_to_the_lab(tmp_path: Path) -> None:
    url = "http://127.0.0.1:8888/lab?token=abc123&x=<1>"
    page = write_redirect(str(tmp_path / "open.html"), url)
    assert page == f"file://{tmp_path / 'open.html'}" and "abc123" not in page
    assert stat.S_IMODE((tmp_path / "open.html").stat().st_mode) == 0o600
    text = (tmp_path / "open.html").read_text()
    assert 'content="0;url=http://127.0.0.1:8888/lab?token=abc123&amp;x=&lt;1&gt;"' in text
