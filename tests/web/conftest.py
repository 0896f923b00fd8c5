"""Fixtures of the web tests: one result database per session (tests/web/webdata.py, written through the real
writer), opened read-only, and the real server (uvicorn in a thread on a free port of 127.0.0.1)."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orchestrator.web.app import create_app
from orchestrator.web.db import open_readonly
from tests.web.webdata import build_db


@pytest.fixture(scope="session")
def web_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("webdb") / "tcplab.db"
    build_db(path)
    return path


@pytest.fixture(scope="session")
def ro_engine(web_db: Path) -> Iterator[Engine]:
    engine = open_readonly(f"sqlite:///{web_db}")
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def client(ro_engine):
    from starlette.testclient import TestClient

    with TestClient(create_app(ro_engine)) as c:
        yield c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(ro_engine) -> Iterator[str]:
    """The base URL of the real server."""
    import uvicorn

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(ro_engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the web server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)
