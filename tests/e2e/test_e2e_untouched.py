"""``--kv-policy none --kv-guards off`` leaves SGLang untouched: the plugin installs only
its ``--kv-*`` flag parser, and the server answers byte for byte as the same SGLang
without the plugin (``SGLANG_PLUGINS`` naming another plugin, so SGLang never loads it).

Both servers start fresh and get the same requests in the same order (so their radix
caches hold the same prefixes); the answers may differ only in ``VOLATILE`` fields
(request ids, timestamps, latencies), and the test names every field that differs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from support.constants import PROMPT
from support.server import ServerConfig, shared_server

pytestmark = pytest.mark.server

# Keys whose values differ between any two runs of the same request: ids, clocks.
VOLATILE = {"id", "created", "e2e_latency", "response_sent_to_client_ts", "request_received_ts",
            "decode_throughput", "inference_time", "queue_time", "prefill_launch_delay",
            "prefill_launch_latency", "prefill_finished_ts", "system_fingerprint"}

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/generate", {"input_ids": PROMPT, "rid": "untouched-1",
                   "sampling_params": {"max_new_tokens": 24, "temperature": 0}, "return_logprob": True}),
    # Greedy only: stock SGLang's sampled output differs from run to run on CPU, seed or not.
    ("/generate", {"text": "The capital of France is", "rid": "untouched-2",
                   "sampling_params": {"max_new_tokens": 16, "temperature": 0, "stop": ["\n\n"]}}),
    ("/v1/completions", {"model": "default", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 16, "temperature": 0}),
    # A body SGLang itself answers badly (the guards turn it into a 400): stock behaviour, whatever it is.
    ("/generate", {"text": "hi", "rid": "untouched-3", "sampling_params": {"max_new_tokens": "many"}}),
]


# Fresh for this module: no other test uses either configuration.
@shared_server
def untouched(tiny_model, server_dir) -> ServerConfig:
    return ServerConfig("untouched", ("--kv-policy", "none", "--kv-guards", "off"))


@shared_server
def stock(tiny_model, server_dir) -> ServerConfig:
    # SGLang loads only the plugins SGLANG_PLUGINS names: none of ours.
    return ServerConfig("stock", env={"SGLANG_PLUGINS": "not-vase"})


def _answer(server, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = requests.post(server.url + path, json=body, timeout=120)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def _paths_that_differ(a: Any, b: Any, where: str = "") -> set[str]:
    """The dotted key paths whose values differ between two JSON documents."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for key in a.keys() | b.keys():
            out |= _paths_that_differ(a.get(key), b.get(key), f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return set().union(*(_paths_that_differ(x, y, where) for x, y in zip(a, b, strict=True)))
    return set() if a == b else {where}


def test_none_with_guards_off_installs_nothing_but_the_flag_parser(untouched) -> None:
    # The plugin's only words in any process: the untouched notice (and CPU mode's stand-in,
    # an import shim of the CPU engine, not a hook). No scheduler hook, no reservation.
    said = [line for line in untouched.log_text().splitlines() if "vase-sglang" in line and "CPU mode" not in line]
    assert len(said) == 1 and "SGLang serves untouched" in said[0], said
    assert requests.get(untouched.url + "/kv_policy", timeout=10).status_code == 404


def test_responses_are_those_of_sglang_without_the_plugin(untouched, stock) -> None:
    for path, body in REQUESTS:
        (status, got), (stock_status, expected) = _answer(untouched, path, body), _answer(stock, path, body)
        assert status == stock_status, (path, status, stock_status)
        differ = _paths_that_differ(got, expected)
        real = sorted(p for p in differ if p.rsplit(".", 1)[-1] not in VOLATILE)
        assert not real, (path, real, json.dumps(got)[:600], json.dumps(expected)[:600])
