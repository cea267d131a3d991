"""Start and stop real SGLang servers for the end-to-end tests (CPU engine), and share
one server per configuration across a test run (``shared_server``, ``ServerPool``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        # The prefix oracle's output, when it runs (support.e2e.oracle_env names the file).
        digests = (env or {}).get("VASE_TEST_DIGEST_FILE")
        self.digest_file: Path | None = Path(digests) if digests else None

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


# -- shared servers ---------------------------------------------------------------------
@dataclass(frozen=True)
class ServerConfig:
    """One test server's configuration on the tiny model. Two configurations with the same
    arguments, environment and pool are the same server; ``name`` only labels its log."""

    name: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    max_total_tokens: int = 16384

    @property
    def key(self) -> tuple:
        return self.args, tuple(sorted(self.env.items())), self.max_total_tokens


# Fixture name -> the function that gives its configuration from the tiny model's path and
# the server folder (``shared_server``). It runs once per run, before the server starts
# (it may write a file the server reads).
SHARED: dict[str, Callable[[Path, Path], ServerConfig]] = {}


def shared_server(config: Callable[[Path, Path], ServerConfig]) -> Any:
    """Declares a session fixture, named after ``config``, that returns this run's one server
    of the configuration ``config(tiny_model, server_dir)``: ``ServerPool`` starts it before
    its first user (ahead of time where it can) and stops it after its last."""
    name = config.__name__
    if name in SHARED:
        raise ValueError(f"two shared servers named {name}")
    SHARED[name] = config

    def fixture(servers: ServerPool) -> Server:
        return servers.get(name)

    fixture.__doc__ = config.__doc__
    return pytest.fixture(scope="session", name=name)(fixture)


# Servers up at once, the one in use included (a CPU test server holds about 2 GB).
MAX_ALIVE = 3


def _module(item: pytest.Item) -> str | None:
    module = getattr(item, "module", None)
    return getattr(module, "__name__", None)


class ServerPool:
    """The shared servers (``shared_server``) of one test run, planned over its items.

    Before each test (``before``) it launches, without waiting, the servers that test uses
    and then those the next tests use, up to ``MAX_ALIVE`` at once, so that start-ups
    overlap tests instead of following them. It looks ahead only through modules whose
    tests use shared servers: no server starts while a module runs that measures its own
    servers. After each test (``after``) it stops the servers no later test uses. A test
    uses a shared server when it requests its fixture, directly or through other fixtures,
    or when a parametrized fixture gets the fixture's name as its parameter (and looks it
    up with ``request.getfixturevalue``).
    """

    def __init__(self, items: list[pytest.Item], model: Path, workdir: Path):
        self.model, self.workdir = model, workdir
        self.configs: dict[str, ServerConfig] = {}
        self.servers: dict[tuple, Server] = {}
        self.ready: set[tuple] = set()
        self.failed: dict[tuple, ServerError] = {}  # not launched again
        self.index = {item.nodeid: i for i, item in enumerate(items)}
        names = [self.uses(item) for item in items]
        self.needs = [[self.config(n).key for n in sorted(used)] for used in names]
        pooled = {_module(item) for item, used in zip(items, names, strict=True) if used}
        self.pooled = [_module(item) in pooled for item in items]
        self.last: dict[tuple, int] = {}
        for i, keys in enumerate(self.needs):
            for key in keys:
                self.last[key] = i

    @staticmethod
    def uses(item: pytest.Item) -> set[str]:
        """The shared fixtures ``item`` uses."""
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            names |= {v for v in callspec.params.values() if isinstance(v, str)}
        return names & SHARED.keys()

    def config(self, name: str) -> ServerConfig:
        if name not in self.configs:
            config = SHARED[name](self.model, self.workdir)
            if any(c.name == config.name and c.key != config.key for c in self.configs.values()):
                raise ValueError(f"two server configurations named {config.name}")
            self.configs[name] = config
        return self.configs[name]

    def _launch(self, key: tuple) -> Server:
        if key in self.failed:
            raise self.failed[key]
        if key not in self.servers:
            config = next(c for c in self.configs.values() if c.key == key)
            srv = Server(config.name, self.model, self.workdir, *config.args, env=config.env,
                         max_total_tokens=config.max_total_tokens)
            srv.launch()
            self.servers[key] = srv
        return self.servers[key]

    def alive(self) -> int:
        return sum(srv.alive() for srv in self.servers.values())

    def before(self, item: pytest.Item) -> None:
        """Launches what ``item`` uses, then what the next tests use, within ``MAX_ALIVE``."""
        i = self.index.get(item.nodeid)
        if i is None:
            return
        for key in self.needs[i]:
            if key not in self.failed:
                self._launch(key)
        for j in range(i + 1, len(self.needs)):
            if not self.pooled[j]:
                break
            for key in self.needs[j]:
                if key not in self.servers and key not in self.failed and self.alive() < MAX_ALIVE:
                    self._launch(key)

    def get(self, name: str, timeout: float = 240.0) -> Server:
        """The started server of shared fixture ``name``, waiting for its start-up if needed."""
        key = self.config(name).key
        srv = self._launch(key)
        if key not in self.ready:
            try:
                srv.wait_healthy(time.monotonic() + timeout)
            except ServerError as exc:
                srv.stop()
                del self.servers[key]
                self.failed[key] = exc
                raise
            self.ready.add(key)
        return srv

    def after(self, item: pytest.Item) -> None:
        """Stops the servers that no test after ``item`` uses."""
        i = self.index.get(item.nodeid)
        if i is None:
            return
        for key, srv in list(self.servers.items()):
            if self.last.get(key, -1) <= i:
                srv.stop()
                del self.servers[key]
                self.ready.discard(key)

    def stop_all(self) -> None:
        for srv in self.servers.values():
            srv.terminate()
        for srv in self.servers.values():
            srv.wait_stopped()
        self.servers.clear()
        self.ready.clear()
