"""Process-wide state shared by the scheduler-side hooks (one scheduler per process)."""

from __future__ import annotations

from typing import Any

from vase_sglang.runtime import EvictionRuntime

runtime: EvictionRuntime | None = None
req_to_token_pool: Any = None
reserved_bytes: int = 0
