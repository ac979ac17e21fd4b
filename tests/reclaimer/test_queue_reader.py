"""Issue 17: the reclaimer reads the scheduler's queue with the queue token for its admin page; a
queue that refuses or does not answer is said so on the page, never fails the pass."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from vgpu_plugin.extender.ledger import Ledger
from vgpu_plugin.extender.server import Extender

from jupyter_vgpu.reclaimer.admin import render
from jupyter_vgpu.reclaimer.nodes import ScrapeToken
from jupyter_vgpu.reclaimer.queue import QueueReader
from jupyter_vgpu.reclaimer.service import VGPUReclaimer

TOKEN = "reclaimer-queue-token-0123456789"


def test_the_queue_is_read_with_its_token_and_a_refusal_is_shown(tmp_path: Path) -> None:
    extender = Extender(port=0, ledger=Ledger(), queue_token=TOKEN, queue_notice_interval=None).start()
    try:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        reclaimer = VGPUReclaimer(queue_url=extender.base_url, queue_token_file=str(token_file))
        asyncio.run(reclaimer.queue.read())
        assert reclaimer.queue.problem is None and reclaimer.queue.latest == {"pending": [], "nodes": []}
        assert "<table class=\"queue\">" in render(reclaimer)

        wrong = QueueReader(extender.base_url, ScrapeToken("not-the-queue-token-000000"))
        asyncio.run(wrong.read())
        assert (wrong.latest, wrong.problem) == (None, "HTTP 403")
        reclaimer._queue = wrong
        assert "The scheduler's queue did not answer: HTTP 403." in render(reclaimer)
    finally:
        extender.stop()
    with socket.socket() as sock:  # nothing listens there any more
        sock.bind(("127.0.0.1", 0))
        gone = QueueReader(f"http://127.0.0.1:{sock.getsockname()[1]}", ScrapeToken(TOKEN), timeout=5)
    asyncio.run(gone.read())
    assert gone.latest is None and gone.problem
    assert "Not shown: the reclaimer has no queue_url." in render(VGPUReclaimer())
