"""Graceful shutdown: SIGTERM to the server while rounds run.

The server process gets SIGTERM (what Docker and Kubernetes send to PID 1). SGLang drains
running requests before it shuts down, unboundedly; vase-sglang aborts what still runs
after ``VASE_SGLANG_DRAIN_TIMEOUT`` (3 s here), so the server exits within that plus
SGLang's own shutdown: exit status 0, no traceback, no process of its group left, and
every client gets an answer.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from support.constants import VASE_ARGS
from support.e2e import record
from support.server import Server

from vase_sglang.patches.guards.lifecycle import DRAIN_ENV, drain_timeout

DRAIN_SECONDS = 3
EXIT_WITHIN = DRAIN_SECONDS + 5 + 25  # the drain, SGLang's 5 s watchdog poll, the schedulers' release


def test_drain_timeout_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DRAIN_ENV, raising=False)
    assert drain_timeout() == 20.0
    monkeypatch.setenv(DRAIN_ENV, "2.5")
    assert drain_timeout() == 2.5
    for bad in ("soon", "-1"):
        monkeypatch.setenv(DRAIN_ENV, bad)
        with pytest.raises(ValueError, match=DRAIN_ENV):
            drain_timeout()


@pytest.mark.server
def test_sigterm_during_rounds_exits_cleanly_within_the_timeout(tiny_model, server_dir) -> None:
    srv = Server("shutdown", tiny_model, server_dir, *VASE_ARGS, env={DRAIN_ENV: str(DRAIN_SECONDS)}).start()
    try:
        def long_request(i: int) -> tuple[int, dict | str]:
            try:  # far longer than the drain: 4,000 tokens each
                r = requests.post(srv.url + "/generate", timeout=300, json={
                    "input_ids": [5, 6, 7, 8 + i],
                    "sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}})
                return r.status_code, r.json()
            except requests.RequestException as exc:
                return -1, repr(exc)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(long_request, i) for i in range(4)]
            deadline = time.monotonic() + 120
            while requests.get(srv.url + "/kv_policy", timeout=10).json()["totals"].get("eviction_rounds", 0) < 4:
                assert time.monotonic() < deadline, "no eviction rounds"
                time.sleep(0.2)
            group = psutil.Process(srv.proc.pid).children(recursive=True)
            offset = srv.log_size()
            t0 = time.monotonic()
            os.kill(srv.proc.pid, signal.SIGTERM)
            status = srv.proc.wait(timeout=EXIT_WITHIN)
            elapsed = time.monotonic() - t0
            answers = [f.result(timeout=30) for f in futures]
        _, alive = psutil.wait_procs(group, timeout=10)
        log = srv.log_since(offset)
        assert status == 0, log[-3000:]
        assert elapsed < EXIT_WITHIN
        assert not alive, f"orphaned: {[(p.pid, p.name()) for p in alive]}"
        assert "Traceback" not in log, log[-3000:]
        assert "aborting them" in log  # the drain limit, not the requests' end, stopped them
        for code, body in answers:  # each client got an answer: cut short, not left hanging
            assert code == 200 and isinstance(body, dict), (code, str(body)[:300])
            assert body["meta_info"]["finish_reason"]["type"] == "abort"
            assert body["meta_info"]["completion_tokens"] < 4000
        record("reliability/shutdown", {
            "sigterm_to_exit_s": round(elapsed, 1), "drain_limit_s": DRAIN_SECONDS, "exit_within_s": EXIT_WITHIN,
            "exit_status": status, "clients": len(answers), "clients_answered_abort": len(answers),
            "completion_tokens": [body["meta_info"]["completion_tokens"] for _, body in answers],
            "processes_left": len(alive)})
    finally:
        srv.stop()
