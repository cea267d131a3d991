"""The hand-off of the server's eviction settings to every SGLang process it starts.

The main process validates the ``--kv-*`` flags once (``flags``) and exports the result
in one environment variable; the scheduler, detokenizer and DP-controller processes read
it back here. An environment variable survives both ``launch_server``'s child processes
and ``sglang.Engine(**kwargs)``.
"""

from __future__ import annotations

import functools
import json
import os
from typing import NamedTuple

from ..config import PolicyConfig
from .auto import AutoTable
from .telemetry import TelemetryOptions

ENV_CONFIG = "VASE_SGLANG_CONFIG"


class Exported(NamedTuple):
    """The server's settings as every process reads them."""

    config: PolicyConfig
    seed: int | None  # --kv-seed (None: each request draws its own)
    auto: AutoTable | None  # --kv-policy auto's table
    telemetry: TelemetryOptions
    guards: bool  # --kv-guards: the HTTP hardening (patches/guards/)


def export_config(cfg: PolicyConfig, seed: int | None = None, auto: AutoTable | None = None,
                  telemetry: TelemetryOptions | None = None, guards: bool = True) -> None:
    """Hand the server's policy, ``--kv-seed``, ``auto`` table, telemetry settings and
    ``--kv-guards`` to every SGLang process it starts."""
    os.environ[ENV_CONFIG] = json.dumps({"config": cfg.to_dict(), "seed": seed,
                                         "auto": auto.to_dict() if auto is not None else None,
                                         "telemetry": (telemetry or TelemetryOptions()).to_dict(),
                                         "guards": guards}, sort_keys=True)


def exported() -> Exported:
    """Every exported setting (defaults when nothing was exported: stock SGLang, guards on).

    Called per request; parsed once per distinct value of the variable."""
    return _parse_exported(os.environ.get(ENV_CONFIG))


def exported_config() -> PolicyConfig:
    """The server's config in any SGLang process (``none`` when nothing was exported)."""
    return exported().config


def exported_seed() -> int | None:
    """The server's ``--kv-seed`` (None: each request draws its own)."""
    return exported().seed


def exported_auto() -> AutoTable | None:
    """The server's ``--kv-policy auto`` table (None when it runs one policy)."""
    return exported().auto


def exported_telemetry() -> TelemetryOptions:
    """The server's telemetry settings (``--kv-telemetry``, ``--kv-stop-on-loop``, KL mappings)."""
    return exported().telemetry


@functools.lru_cache(maxsize=4)
def _parse_exported(text: str | None) -> Exported:
    if not text:
        return Exported(PolicyConfig(policy="none"), None, None, TelemetryOptions(), True)
    data = json.loads(text)
    auto = AutoTable.from_dict(data["auto"]) if data.get("auto") else None
    return Exported(PolicyConfig.from_dict(data["config"]), data["seed"], auto,
                    TelemetryOptions.from_dict(data.get("telemetry")), data.get("guards", True))
