"""Load and faults against the CPU server: Locust smoke run, over-capacity, aborts,
bad input. After each test the server is healthy and no KV slot is in use."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from support.constants import PROMPT, REGION
from support.e2e import greedy, wait_idle

pytestmark = pytest.mark.server

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py"


@pytest.fixture(autouse=True)
def healthy_and_empty_after(load_server):
    yield
    assert wait_idle(load_server) == 0, "KV slots still in use after the test"
    assert requests.get(load_server.url + "/health", timeout=30).status_code == 200
    assert load_server.proc.poll() is None


def test_locust_smoke_run_has_no_failures(load_server, tmp_path: Path) -> None:
    csv = tmp_path / "smoke"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "4", "-r", "4", "-t", "20s",
           "--host", load_server.url, "--output-len", "200", "--short-len", "16", "--csv", str(csv),
           "--only-summary", "--stop-timeout", "30"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    stats = (tmp_path / "smoke_stats.csv").read_text()
    rows = [line.split(",") for line in stats.splitlines()]
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    aggregated = next(r for r in body if r[col["Name"]] == "Aggregated")
    assert int(aggregated[col["Failure Count"]]) == 0, out.stderr[-3000:]
    types = {r[col["Type"]] for r in body}
    assert {"chat", "TTFT", "TPOT", "ITL"} <= types, types
    chat = [r for r in body if r[col["Type"]] == "chat"]
    assert sum(int(r[col["Request Count"]]) for r in chat) >= 4
    assert out.returncode == 0, out.stderr[-3000:]


def test_more_users_than_the_pool_holds_queue_without_retraction(load_server) -> None:
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: greedy(load_server, 400, PROMPT + [120 + i]), range(16)))
    metas = [o["meta_info"] for o in outs]
    assert all(m["completion_tokens"] == 400 and m["kv_region_len"] <= REGION for m in metas)
    assert all(m["num_retractions"] == 0 for m in metas)
    log = load_server.log_text()
    queued = [int(x) for x in re.findall(r"#queue-req: (\d+)", log)]
    assert queued and max(queued) > 0, "requests should have waited in the queue"
    assert "Retract requests" not in log and "out of memory" not in log.lower()


def test_abort_request_mid_stream(load_server) -> None:
    body = {"input_ids": PROMPT, "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "temperature": 0.7, "ignore_eos": True}}
    finish = None
    with requests.post(load_server.url + "/generate", json=body, stream=True, timeout=120) as r:
        rid = None
        for line in r.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            rid = chunk["meta_info"]["id"]
            if chunk["meta_info"]["completion_tokens"] == 300:
                requests.post(load_server.url + "/abort_request", json={"rid": rid}, timeout=30).raise_for_status()
            finish = chunk["meta_info"].get("finish_reason")
            if finish:
                break
    assert finish is not None and finish["type"] == "abort", finish


def test_prompt_longer_than_the_context_is_a_clear_error(load_server) -> None:
    body = {"input_ids": [7] * 5000, "sampling_params": {"max_new_tokens": 4}}
    r = requests.post(load_server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "context length" in r.text.lower() or "too long" in r.text.lower(), r.text


def test_malformed_policy_fields_are_http_400(load_server) -> None:
    for bad in ({"kv_budget": -5}, {"kv_seed": "x"}, {"kv_policy": 3}, {"kv_n_large": 500}):
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "custom_params": bad}}
        r = requests.post(load_server.url + "/generate", json=body, timeout=60)
        assert r.status_code == 400, (bad, r.text)
    # A misspelt field is an error, not silently ignored; other keys stay allowed.
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "custom_params": {"kv_budjet": 64}}}
    r = requests.post(load_server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 400 and "did you mean 'kv_budget'" in r.text, r.text
    body["sampling_params"]["custom_params"] = {"my_processor_arg": 1}
    assert requests.post(load_server.url + "/generate", json=body, timeout=60).status_code == 200


def test_a_client_cannot_forge_the_carried_options(load_server) -> None:
    """The scheduler trusts only what the tokenizer process validated: client-sent options
    with a budget beyond the server's are dropped, and the server's own budget applies."""
    from vase_sglang.plugin.options import OPTIONS_KEY

    forged = {OPTIONS_KEY: {"cfg": {"policy": "vase", "budget": 4096, "recent": 32}, "seed": 1, "reason": "forged",
                            "stop_on_loop": None}}
    body = {"input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": REGION + 64, "temperature": 0, "ignore_eos": True,
                                "custom_params": forged}}
    r = requests.post(load_server.url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["kv_eviction_rounds"] >= 1 and meta["kv_region_len"] <= REGION, meta
