"""Widgets without a frontend: every comm message a widget sends is recorded.

``comm.create_comm`` is the documented replacement point (ipykernel replaces it too);
here it returns a Comm whose ``publish_msg`` appends to a list instead of a kernel socket.
"""

from __future__ import annotations

import threading
from typing import Any

import comm
import pytest
from comm.base_comm import BaseComm


class RecordingComm(BaseComm):
    def __init__(self, log: list[dict[str, Any]], **kwargs: Any) -> None:
        self.log = log
        super().__init__(**kwargs)

    def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None,
                    **keys: Any) -> None:
        with _lock:
            self.log.append({"msg_type": msg_type, "comm_id": self.comm_id, "data": data or {}})


_lock = threading.Lock()


class CommLog(list):
    def states(self, comm_id: str) -> list[dict[str, Any]]:
        """Every state this comm sent, in order: the open message's, then each update's."""
        with _lock:
            messages = [m for m in self if m["comm_id"] == comm_id]
        out = []
        for message in messages:
            data = message["data"]
            if message["msg_type"] == "comm_open":
                out.append(data.get("state", {}))
            elif message["msg_type"] == "comm_msg" and data.get("method") == "update":
                out.append(data.get("state", {}))
        return out

    def last(self, comm_id: str, key: str) -> Any:
        values = [s[key] for s in self.states(comm_id) if key in s]
        return values[-1] if values else None

    def closed(self, comm_id: str) -> bool:
        with _lock:
            return any(m["msg_type"] == "comm_close" and m["comm_id"] == comm_id for m in self)


@pytest.fixture
def comms(monkeypatch: pytest.MonkeyPatch) -> CommLog:
    log = CommLog()
    monkeypatch.setattr(comm, "create_comm", lambda **kwargs: RecordingComm(log, **kwargs))
    return log
