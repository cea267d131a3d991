"""The server's eviction settings (``ServerSettings``) and how every SGLang process it
starts gets them.

The main process validates the ``--kv-*`` flags once (``flags.server_settings``) and
exports the result in one environment variable; the scheduler, detokenizer and
DP-controller processes read it back with ``imported_settings``. An environment variable
survives ``launch_server``'s child processes, ``sglang.Engine(**kwargs)`` and the server
that ``sgl.Runtime`` spawns alike. It carries server settings only: a request's own
options travel in its ``custom_params`` (``options``).

Only the hooks in ``patches/`` call ``imported_settings``; every function below them is
given the settings as an argument.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

from ..config import PolicyConfig
from .auto import AutoTable
from .telemetry import TelemetryOptions

ENV_SETTINGS = "VASE_SGLANG_CONFIG"


@dataclass(frozen=True)
class ServerSettings:
    """The server's settings as every process reads them."""

    config: PolicyConfig = field(default_factory=lambda: PolicyConfig(policy="none"))
    seed: int | None = None  # --kv-seed (None: each request draws its own)
    auto: AutoTable | None = None  # --kv-policy auto's table
    telemetry: TelemetryOptions = field(default_factory=TelemetryOptions)
    guards: bool = True  # --kv-guards: the HTTP hardening (patches/guards/)

    def to_json(self) -> str:
        return json.dumps({"config": self.config.to_dict(), "seed": self.seed,
                           "auto": self.auto.to_dict() if self.auto is not None else None,
                           "telemetry": self.telemetry.to_dict(), "guards": self.guards}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServerSettings:
        data = json.loads(text)
        auto = AutoTable.from_dict(data["auto"]) if data.get("auto") else None
        return cls(PolicyConfig.from_dict(data["config"]), data["seed"], auto,
                   TelemetryOptions.from_dict(data.get("telemetry")), data.get("guards", True))


def export_settings(settings: ServerSettings) -> None:
    """Hand ``settings`` to every SGLang process this one starts from now on."""
    os.environ[ENV_SETTINGS] = settings.to_json()


def export_config(cfg: PolicyConfig, seed: int | None = None, auto: AutoTable | None = None,
                  telemetry: TelemetryOptions | None = None, guards: bool = True) -> None:
    """``export_settings`` from its parts (the tests and tools set a policy this way)."""
    export_settings(ServerSettings(cfg, seed, auto, telemetry or TelemetryOptions(), guards))


def imported_settings() -> ServerSettings:
    """The exported settings (the defaults when nothing was exported: stock SGLang, guards
    on). Parsed once per distinct value of the variable."""
    return _parse(os.environ.get(ENV_SETTINGS))


@functools.lru_cache(maxsize=4)
def _parse(text: str | None) -> ServerSettings:
    return ServerSettings.from_json(text) if text else ServerSettings()
