"""Fixtures of the end-to-end tests: one real CPU server per configuration per run.

The servers several modules could use are declared here, the others in their module, all
with ``shared_server``: ``ServerPool`` starts each before its first user, ahead of time
where it can, and stops it after its last, so the two cores are not shared with idle
servers. A test that stops or kills its server starts its own (``Server``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.constants import ADMISSION_POOL, LOAD_POOL, VASE_ARGS
from support.e2e import oracle_env
from support.server import ServerConfig, ServerPool, shared_server
from support.telemetry import write_tiny_calibration

POOL = pytest.StashKey[ServerPool]()
CURRENT = pytest.StashKey[pytest.Item]()


@pytest.fixture(scope="session")
def server_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def servers(request: pytest.FixtureRequest, tiny_model, server_dir):
    """The run's shared servers, planned over the tests selected."""
    pool = ServerPool(request.session.items, tiny_model, server_dir)
    request.config.stash[POOL] = pool
    pool.before(request.config.stash[CURRENT])  # the first user's servers start together
    yield pool
    pool.stop_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules whose tests use shared servers run first, one after another, so that one
    module's tests overlap the next one's server start-ups; then the modules that start
    their own servers (several measure them). Within each group the order is the files'."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in item.path.parents]
    pooled = {item.path for item in (items[i] for i in slots) if ServerPool.uses(item)}
    unmarked = [item.nodeid for item in items if ServerPool.uses(item) and not item.get_closest_marker("server")]
    if unmarked:
        raise pytest.UsageError(f"tests that use a shared server without the server marker: {unmarked}")
    ordered = sorted((items[i] for i in slots), key=lambda item: item.path not in pooled)
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[CURRENT] = item
    pool = item.config.stash.get(POOL, None)
    if pool is not None:
        pool.before(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    pool = item.config.stash.get(POOL, None)
    if pool is not None:
        pool.after(item)


@shared_server
def vase_server(tiny_model, server_dir) -> ServerConfig:
    # The prefix oracle digests each prompt's K/V at every region start and round.
    return ServerConfig("vase", (*VASE_ARGS, "--enable-metrics"), env=oracle_env(server_dir / "vase-digests.jsonl"))


@shared_server
def none_server(tiny_model, server_dir) -> ServerConfig:
    return ServerConfig("none", ("--kv-policy", "none"))


@shared_server
def retract_server(tiny_model, server_dir) -> ServerConfig:
    # SGLang's own test switch: retract running requests every few forwards.
    return ServerConfig("retract", VASE_ARGS, env={"SGLANG_TEST_RETRACT": "1"})


@shared_server
def triton_kernel_server(tiny_model, server_dir) -> ServerConfig:
    """The GPU path's Triton kernels (scoring, selection, compaction, score carry) run in
    the interpreter inside a CPU server, with SGLang's test retractions on. One retraction
    every 50 forwards, not SGLang's default 3: each re-prefill runs a round on the whole
    history, and in the interpreter that round costs about a second."""
    return ServerConfig("triton-kernels", VASE_ARGS,
                        env={"VASE_KERNEL_BACKEND": "triton", "TRITON_INTERPRET": "1", "SGLANG_TEST_RETRACT": "1",
                             "SGLANG_TEST_RETRACT_INTERVAL": "50"})


@shared_server
def admission_server(tiny_model, server_dir) -> ServerConfig:
    return ServerConfig("admission", (*VASE_ARGS, "--decode-log-interval", "10"), max_total_tokens=ADMISSION_POOL)


@shared_server
def load_server(tiny_model, server_dir) -> ServerConfig:
    return ServerConfig("load", (*VASE_ARGS, "--decode-log-interval", "10"), max_total_tokens=LOAD_POOL)


@shared_server
def telemetry_server(tiny_model, server_dir) -> ServerConfig:
    """vase with a calibration's KL mappings, the planted-loop logit processor allowed, metrics on."""
    calibration = write_tiny_calibration(server_dir / "tiny-calibration.json", tiny_model)
    return ServerConfig("telemetry", (*VASE_ARGS, "--kv-calibration", str(calibration),
                                      "--enable-custom-logit-processor", "--enable-metrics"))
