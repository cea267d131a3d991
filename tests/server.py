"""Start and stop real SGLang servers for the end-to-end tests (CPU engine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

# SGLang's own leak and double-free checks run in every test server.
STRICT_ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_command(model: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
        "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
        "--mem-fraction-static", "0.1", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
        "--max-running-requests", "32", "--log-level", "info", "--sleep-on-idle", *extra,
    ]


def cpu_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SGLANG_USE_CPU_ENGINE": "1", **STRICT_ENV, **extra})
    env.pop("TRITON_INTERPRET", None)  # servers use the torch kernels on CPU
    return env


class Server:
    def __init__(self, name: str, model: Path, workdir: Path, *args: str, env: dict[str, str] | None = None,
                 max_total_tokens: int = 16384):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.cmd = cpu_command(model, self.port, "--max-total-tokens", str(max_total_tokens), *args)
        self.env = cpu_env(**(env or {}))
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 240.0) -> "Server":
        log = open(self.log_path, "w")
        # Own session, so stop() can end the whole process group (scheduler, detokenizer).
        # cwd outside the checkout: its kernels/ folder must not shadow the installed package.
        self.proc = subprocess.Popen(self.cmd, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server {self.name} did not become healthy in {timeout}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

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

    def used_tokens(self) -> int:
        """KV slots neither free nor evictable from the tree (0 when idle and leak-free)."""
        body = self.loads()
        loads = body["loads"] if "loads" in body else body
        entries = loads if isinstance(loads, list) else [loads]  # one per DP rank
        return sum(int(e.get("core", e)["num_used_tokens"]) for e in entries)
