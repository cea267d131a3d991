"""Test set-up shared by every test module.

Without a GPU the Triton kernels run under the interpreter; the variable must be set
before any kernel module is imported, which is why it is set here, at collection time.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---- end-to-end fixtures ---------------------------------------------------------------
# Each server configuration is used by one test module only and lives for that module:
# started once per test run, and stopped before the next module's servers start, so
# the two cores are not shared with idle servers.

import pytest  # noqa: E402

VASE_ARGS = ("--kv-policy", "vase", "--kv-budget", "128", "--kv-recent", "32", "--kv-seed", "7")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    from vase_sglang.bundled.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def server_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("servers")


def _server(request: pytest.FixtureRequest, name: str, model, workdir, *args: str, **kwargs):
    from server import Server

    srv = Server(name, model, workdir, *args, **kwargs)
    request.addfinalizer(srv.stop)  # always stop what we start, by its pid (process group)
    return srv.start()


@pytest.fixture(scope="module")
def vase_server(request, tiny_model, server_dir):
    return _server(request, "vase", tiny_model, server_dir, *VASE_ARGS, "--enable-metrics",
                   env={"VASE_SGLANG_DEBUG_DIGEST": "1"})


@pytest.fixture(scope="module")
def none_server(request, tiny_model, server_dir):
    return _server(request, "none", tiny_model, server_dir, "--kv-policy", "none")


@pytest.fixture(scope="module")
def retract_server(request, tiny_model, server_dir):
    # SGLang's own test switch: retract running requests every few forwards.
    return _server(request, "retract", tiny_model, server_dir, *VASE_ARGS, env={"SGLANG_TEST_RETRACT": "1"})


# Prompt 12 tokens + 1000 generated: full cache holds 2 such requests in 2150 slots, not 3.
ADMISSION_POOL = 2150


@pytest.fixture(scope="module")
def admission_server(request, tiny_model, server_dir):
    return _server(request, "admission", tiny_model, server_dir, *VASE_ARGS, "--decode-log-interval", "10",
                   max_total_tokens=ADMISSION_POOL)


# A pool where 16 concurrent vase requests (12 + 160 slots each) cannot all run at once.
LOAD_POOL = 1200


@pytest.fixture(scope="module")
def load_server(request, tiny_model, server_dir):
    return _server(request, "load", tiny_model, server_dir, *VASE_ARGS, "--decode-log-interval", "10",
                   max_total_tokens=LOAD_POOL)
