"""Start, watch and stop one ``sglang.launch_server`` process (used by the benchmarks and eval).

Every server runs in its own process group, in its own working directory (where its logs
go), and ``stop()`` ends the whole group: SIGTERM, then SIGKILL for what is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# SGLang's CPU engine, as documented in docs/cpu-mode.md.
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--mem-fraction-static", "0.1", "--dtype", "float32", "--sleep-on-idle")


# Relaunches on a fresh port when the chosen one was taken before the server bound it.
MAX_REBINDS = 3


class ServerError(Exception):
    """A server that exited or never became healthy; the message carries its log tail."""


def autogroup_nice() -> int | None:
    """The nice value of this process's scheduling group (a Linux autogroup: one per session),
    or None where the kernel has none."""
    try:
        return int(Path("/proc/self/autogroup").read_text().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int) -> None:
    """Gives this process's scheduling group the nice value ``nice`` (no-op without autogroups)."""
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError:
        pass


def keep_priority() -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child started with ``start_new_session=True``: with autogroups each
    session is its own scheduling group, so a niced parent's lower priority would count for
    nothing against other sessions; the child's new group gets the parent's group's nice."""
    nice = autogroup_nice()
    if not nice:
        return None
    return lambda: set_autogroup_nice(nice)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def device_flags(device: str) -> list[str]:
    return list(CPU_FLAGS) if device == "cpu" else ["--device", "cuda"]


def server_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the pytest conftest sets it; servers use real kernels
    if device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    else:
        env.pop("SGLANG_USE_CPU_ENGINE", None)
    return env


def cpu_share_env(index: int, n_workers: int, cores: int) -> dict[str, str]:
    """Environment for CPU worker ``index`` of ``n_workers`` on a ``cores``-core machine.

    SGLang's CPU engine spreads its OpenMP threads over every core and lets them spin
    while they wait: workers side by side then fight over all the cores (two workers on 2
    cores took 6.5x longer than one). Each gets its own share of the cores, as many
    threads as that share, and threads that sleep when idle.
    """
    share = max(1, cores // n_workers)
    first = (index * share) % cores
    return {"SGLANG_CPU_OMP_THREADS_BIND": f"{first}-{first + share - 1}" if share > 1 else str(first),
            "OMP_NUM_THREADS": str(share), "OMP_WAIT_POLICY": "PASSIVE"}


class ServerProcess:
    """``python -m sglang.launch_server --model-path MODEL --port P <args>`` in its own group."""

    def __init__(self, name: str, model: str, args: list[str], device: str, log_path: Path, workdir: Path):
        import requests  # noqa: F401 - fail early if missing

        self.name = name
        self.log_path = log_path
        self.workdir = workdir
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
                    "--port", "0", *device_flags(device), *args]
        self._choose_port()
        self.env = server_env(device)
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None

    def share_cpu(self, index: int, n_servers: int, cores: int | None = None) -> None:
        """Run as CPU server ``index`` of ``n_servers`` side by side on this machine
        (``cpu_share_env``); variables already set, by the caller or the user, win."""
        for key, value in cpu_share_env(index, n_servers, cores or os.cpu_count() or 1).items():
            self.env.setdefault(key, value)

    def launch(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.workdir, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=keep_priority())
        self.pgid = self.proc.pid

    def wait_healthy(self, deadline: float) -> None:
        import requests

        if self.proc is None:
            raise ServerError(f"{self.name} server was never launched")
        rebinds = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if rebinds < MAX_REBINDS and self._port_was_taken():
                    # free_port() only finds a port free at that instant; another server's
                    # ephemeral sockets can take it before uvicorn binds. Choose again.
                    rebinds += 1
                    self._choose_port()
                    self.launch()
                    continue
                raise ServerError(f"{self.name} server exited with status {self.proc.returncode} at start-up; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise ServerError(f"{self.name} server not healthy after the start-up timeout; "
                          f"log {self.log_path}:\n{self.log_tail()}")

    def _choose_port(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd[self.cmd.index("--port") + 1] = str(self.port)

    def _port_was_taken(self) -> bool:
        """The last launch exited because its HTTP port was bound by someone else."""
        tail = self.log_tail(5)
        return "address already in use" in tail and f", {self.port})" in tail

    def alive(self) -> bool:
        """The launched server process has not exited (SGLang exits when a child dies)."""
        return self.proc is not None and self.proc.poll() is None

    def used_tokens(self) -> int:
        """KV slots neither free nor evictable from the tree (0 when idle and leak-free)."""
        import requests

        body = requests.get(self.url + "/v1/loads", params={"include": "core,memory"}, timeout=10).json()
        loads = body["loads"] if "loads" in body else body
        entries = loads if isinstance(loads, list) else [loads]  # one per DP rank
        return sum(int(e.get("core", e)["num_used_tokens"]) for e in entries)

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def terminate(self) -> None:
        """Sends SIGTERM to the server's process group (see wait_stopped)."""
        pgid = self.pgid
        if self.proc is not None and pgid is not None and (self.proc.poll() is None or group_alive(pgid)):
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait_stopped(self, timeout: float = 30.0) -> None:
        """Waits for the whole group to exit, then SIGKILLs what is left."""
        pgid = self.pgid
        if self.proc is None or pgid is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.proc.poll() is None or group_alive(pgid)):
            time.sleep(0.2)
        if group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.2)

    def stop(self) -> None:
        self.terminate()
        self.wait_stopped()


def stop_all(servers: list[ServerProcess]) -> None:
    for s in servers:
        s.terminate()
    for s in servers:
        s.wait_stopped()
