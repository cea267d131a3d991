"""Helpers shared by the end-to-end test modules."""

from __future__ import annotations

import subprocess
import sys
import time

import requests
from server import cpu_env

B, R, SEED = 128, 32, 7
REGION = B + R
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42]


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
