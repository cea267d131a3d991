"""Helpers shared by the end-to-end test modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from support.constants import PROMPT
from support.server import cpu_env


def launch(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args], env=cpu_env(), capture_output=True,
                          text=True, timeout=timeout, cwd="/")


def greedy(server, n: int, input_ids=PROMPT, **extra) -> dict:
    body = {"input_ids": input_ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra}}
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def tokens(out: dict) -> list[int]:
    return [t for _, t, _ in out["meta_info"]["output_token_logprobs"]]


def wait_idle(server, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    used = server.used_tokens()
    while used and time.monotonic() < deadline:
        time.sleep(0.5)
        used = server.used_tokens()
    return used


def record(name: str, figures: dict[str, Any]) -> Path | None:
    """Write a test's measured figures to ``$VASE_RESULTS/<name>.json`` when the variable is
    set (``scripts/reliability.sh`` sets it to ``results/``), and print them either way."""
    print(f"{name}: {json.dumps(figures)}")
    root = os.environ.get("VASE_RESULTS")
    if not root:
        return None
    path = Path(root) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"measured_by": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                                **figures}, indent=2) + "\n")
    return path
