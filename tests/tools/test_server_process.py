"""ServerProcess's start-up against a stand-in server (a real one costs 30-40 s to start)."""

from __future__ import annotations

import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vase_sglang import server_process
from vase_sglang.server_process import ServerError, ServerProcess

# Binds --port as uvicorn does and answers /health; prints uvicorn's message when the port is taken.
FAKE_SERVER = textwrap.dedent('''
    import argparse, http.server, sys
    ap = argparse.ArgumentParser(); ap.add_argument("--port", type=int)
    port = ap.parse_known_args()[0].port

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()

    try:
        httpd = http.server.HTTPServer(("127.0.0.1", port), Health)
    except OSError as e:
        print(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address "
              f"('127.0.0.1', {port}): address already in use", flush=True)
        sys.exit(1)
    httpd.serve_forever()
''')


def fake_server(tmp_path: Path) -> ServerProcess:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    proc = ServerProcess("fake", "unused-model", [], "cpu", tmp_path / "fake.log", tmp_path)
    proc.cmd = [sys.executable, str(script), *proc.cmd[3:]]
    return proc


def test_a_port_taken_before_the_server_binds_it_is_chosen_again(tmp_path, monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy, server_process.free_port()])
        monkeypatch.setattr(server_process, "free_port", lambda: next(ports))
        proc = fake_server(tmp_path)
        assert proc.port == busy
        proc.launch()
        try:
            proc.wait_healthy(time.monotonic() + 30)
            assert proc.port != busy and proc.url.endswith(f":{proc.port}")
            assert proc.cmd[proc.cmd.index("--port") + 1] == str(proc.port)
            assert proc.alive()
        finally:
            proc.stop()
    assert not proc.alive()


def test_a_port_that_stays_taken_ends_in_a_clear_error(tmp_path, monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(server_process, "free_port", lambda: busy)
        proc = fake_server(tmp_path)
        proc.launch()
        try:
            with pytest.raises(ServerError, match="address already in use"):
                proc.wait_healthy(time.monotonic() + 30)
        finally:
            proc.stop()
