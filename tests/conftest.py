"""Test set-up shared by every test module.

Without a GPU the Triton kernels run under the interpreter; the variable must be set
before any kernel module is imported, which is why it is set here, at collection time.
Tests are grouped by layer: ``unit/`` (algorithm, adapter and glue, no server),
``kernels/``, ``tools/`` (what a user runs beside the server) and ``e2e/`` (real CPU
servers); shared fakes, constants and server helpers live in ``support/``. Across the
layers, the markers ``server``, ``slow`` and ``gpu`` (pyproject.toml) select what a test
needs; a ``gpu`` test is skipped where CUDA is missing.
"""

from __future__ import annotations

import os
import signal

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402 - after TRITON_INTERPRET


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    """The tiny random-weight Qwen3 that the end-to-end servers and the tools tests load."""
    from vase_sglang.bundled.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A SIGTERM (CI's timeout, a user's kill) would end pytest without running finalizers,
    # leaving the test servers it started running; as an interrupt, pytest tears the
    # fixtures down and each server is stopped by its process group.
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background jobs of the selected tests (``support.background``)."""
    from support.background import JOBS

    if session.config.option.collectonly or not session.items:
        return
    factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    session.config.add_cleanup(JOBS.kill_all)
    JOBS.start(session.items, lambda name: factory.mktemp(f"background-{name}"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The next background job starts once the one before it has ended."""
    from support.background import JOBS

    JOBS.advance()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs it)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(no_gpu)
