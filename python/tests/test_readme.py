"""The README's black-box check: every ```python block of python/README.md runs as
written in a fresh virtual environment holding only the built package, the remote
one against the real ratelimiterd on its default address, 127.0.0.1:8080."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

from conftest import start_ratelimiterd, stop

README = Path(__file__).resolve().parent.parent / "README.md"
#: ratelimiterd's default address, which the README's remote example uses.
DEFAULT_PORT = 8080
#: How long one README block may run.
BLOCK_TIMEOUT_S = 120


def python_blocks() -> List[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    wheel = os.environ.get("LLM_RATELIMITER_WHEEL", "")
    if not wheel or not Path(wheel).is_file():
        pytest.fail("LLM_RATELIMITER_WHEEL must name the built wheel (scripts/python-test.sh sets it)")
    venv = tmp_path_factory.mktemp("readme-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", wheel], check=True)
    return python


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DEFAULT_PORT))
        except OSError:
            pytest.fail(f"port {DEFAULT_PORT} is taken: the README's remote example needs ratelimiterd's "
                        "default address; stop whatever listens there and rerun")
    process = start_ratelimiterd(tmp_path_factory.mktemp("readme-server"), DEFAULT_PORT)
    try:
        yield
    finally:
        stop(process)


def test_the_readme_has_an_in_process_and_a_remote_example() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 2
    assert any("Limiter(" in b and "RemoteLimiter" not in b for b in blocks)
    assert any("RemoteLimiter(\"http://127.0.0.1:8080\"" in b for b in blocks)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_block_runs_as_written(index: int, fresh_python: str, default_server: None, tmp_path: Path) -> None:
    script = tmp_path / f"block{index}.py"
    script.write_text(python_blocks()[index])
    result = subprocess.run([fresh_python, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=BLOCK_TIMEOUT_S)
    assert result.returncode == 0, f"README block {index} failed:\n{result.stdout}\n{result.stderr}"
