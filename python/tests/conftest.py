"""Fixtures: a real ratelimiterd on a free port, started and stopped per module."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

#: How long ratelimiterd may take to answer /healthz after it starts.
SERVER_START_TIMEOUT_S = 30.0


def ratelimiterd_binary() -> str:
    """The binary scripts/python-test.sh built (RATELIMITERD_BIN)."""
    path = os.environ.get("RATELIMITERD_BIN", "")
    if not path or not Path(path).is_file():
        pytest.fail("RATELIMITERD_BIN must name a built ratelimiterd (scripts/python-test.sh sets it)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ratelimiterd(directory: Path, port: int, extra_yaml: str = "") -> subprocess.Popen:
    """Starts ratelimiterd on 127.0.0.1:port with a registry in ``directory`` and
    ``extra_yaml`` (whole top-level sections) appended to its configuration."""
    config = directory / "ratelimiterd.yaml"
    config.write_text(
        f'server:\n  listen_addr: "127.0.0.1:{port}"\nregistry:\n  path: "{directory / "limits.json"}"\n'
        + extra_yaml
    )
    process = subprocess.Popen(
        [ratelimiterd_binary(), "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(directory / "ratelimiterd.log", "wb"),
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ratelimiterd exited: {(directory / 'ratelimiterd.log').read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("ratelimiterd did not answer /healthz in time")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve(directory: Path, extra_yaml: str = "") -> Iterator[str]:
    """A fixture's body: ratelimiterd on a free port (:func:`start_ratelimiterd`),
    yielding its URL, stopped after."""
    port = free_port()
    process = start_ratelimiterd(directory, port, extra_yaml)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve(tmp_path_factory.mktemp("ratelimiterd"))
