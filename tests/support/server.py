"""Start and stop real SGLang servers for the end-to-end tests (CPU engine)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from vase_sglang.server_process import ServerError, ServerProcess, server_env

# SGLang's own leak and double-free checks run in every test server.
STRICT_ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
}
# On top of server_process.CPU_FLAGS (the one place for the CPU engine's flags); a test's
# own arguments come after these, so they win.
TEST_FLAGS = ("--max-running-requests", "32", "--log-level", "info")


def cpu_env(**extra: str) -> dict[str, str]:
    return {**server_env("cpu"), **STRICT_ENV, **extra}


class Server(ServerProcess):
    """A CPU test server: process management is ``vase_sglang.server_process``'s."""

    def __init__(self, name: str, model: Path, workdir: Path, *args: str, env: dict[str, str] | None = None,
                 max_total_tokens: int = 16384):
        super().__init__(name, str(model), ["--max-total-tokens", str(max_total_tokens), *TEST_FLAGS, *args], "cpu",
                         workdir / f"{name}.log", workdir)
        self.env = cpu_env(**(env or {}))
        self.digest_file: Path | None = None  # the prefix oracle's output, when it runs (support.e2e.oracle_env)

    def start(self, timeout: float = 240.0) -> Server:
        self.launch()
        try:
            self.wait_healthy(time.monotonic() + timeout)
        except ServerError:
            self.stop()
            raise
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    # -- requests -------------------------------------------------------------------
    def generate(self, text: str | None = None, input_ids: list[int] | None = None, timeout: float = 300,
                 **sampling) -> dict:
        body: dict = {"sampling_params": sampling}
        if input_ids is not None:
            body["input_ids"] = input_ids
        else:
            body["text"] = text
        extra = sampling.pop("_extra", None)
        if extra:
            body.update(extra)
        r = requests.post(self.url + "/generate", json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def loads(self) -> dict:
        return requests.get(self.url + "/v1/loads", params={"include": "core,memory"}, timeout=10).json()


def start_server(request: pytest.FixtureRequest, name: str, model, workdir, *args: str, **kwargs) -> Server:
    """A started test server that stops when ``request``'s scope ends."""
    srv = Server(name, model, workdir, *args, **kwargs)
    request.addfinalizer(srv.stop)  # always stop what we start, by its pid (process group)
    return srv.start()
