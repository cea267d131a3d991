"""Fixtures of the end-to-end tests: one real CPU server per configuration."""

from __future__ import annotations

import pytest
from support.constants import ADMISSION_POOL, LOAD_POOL, VASE_ARGS
from support.e2e import oracle_env
from support.server import start_server
from support.telemetry import write_tiny_calibration

# Each server configuration is used by one test module only and lives for that module:
# started once per test run, and stopped before the next module's servers start, so
# the two cores are not shared with idle servers.


@pytest.fixture(scope="session")
def server_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="module")
def vase_server(request, tiny_model, server_dir):
    # The prefix oracle digests each prompt's K/V at every region start and round.
    server = start_server(request, "vase", tiny_model, server_dir, *VASE_ARGS, "--enable-metrics",
                          env=oracle_env(server_dir / "vase-digests.jsonl"))
    server.digest_file = server_dir / "vase-digests.jsonl"
    return server


@pytest.fixture(scope="module")
def none_server(request, tiny_model, server_dir):
    return start_server(request, "none", tiny_model, server_dir, "--kv-policy", "none")


@pytest.fixture(scope="module")
def retract_server(request, tiny_model, server_dir):
    # SGLang's own test switch: retract running requests every few forwards.
    return start_server(request, "retract", tiny_model, server_dir, *VASE_ARGS, env={"SGLANG_TEST_RETRACT": "1"})


@pytest.fixture(scope="module")
def triton_kernel_server(request, tiny_model, server_dir):
    """The GPU path's Triton kernels (scoring, selection, compaction, score carry) run in
    the interpreter inside a CPU server, with SGLang's test retractions on. One retraction
    every 50 forwards, not SGLang's default 3: each re-prefill runs a round on the whole
    history, and in the interpreter that round costs about a second."""
    return start_server(request, "triton-kernels", tiny_model, server_dir, *VASE_ARGS,
                        env={"VASE_KERNEL_BACKEND": "triton", "TRITON_INTERPRET": "1", "SGLANG_TEST_RETRACT": "1",
                             "SGLANG_TEST_RETRACT_INTERVAL": "50"})


@pytest.fixture(scope="module")
def admission_server(request, tiny_model, server_dir):
    return start_server(request, "admission", tiny_model, server_dir, *VASE_ARGS, "--decode-log-interval", "10",
                        max_total_tokens=ADMISSION_POOL)


@pytest.fixture(scope="module")
def load_server(request, tiny_model, server_dir):
    return start_server(request, "load", tiny_model, server_dir, *VASE_ARGS, "--decode-log-interval", "10",
                        max_total_tokens=LOAD_POOL)


@pytest.fixture(scope="module")
def telemetry_server(request, tiny_model, server_dir):
    """vase with a calibration's KL mappings, the planted-loop logit processor allowed, metrics on."""
    calibration = write_tiny_calibration(server_dir / "tiny-calibration.json", tiny_model)
    return start_server(request, "telemetry", tiny_model, server_dir, *VASE_ARGS, "--kv-calibration",
                        str(calibration), "--enable-custom-logit-processor", "--enable-metrics")
