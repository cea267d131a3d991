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


# Imports sglang.launch_server once, then runs it as ``python -m sglang.launch_server ARGS``
# would, once per argument list in a forked child (the plugin loads in the child, after the
# fork, as in a fresh process); prints each child's exit status, stdout and stderr as JSON.
_LAUNCH_EACH = """
import json, os, runpy, sys, tempfile, traceback
import sglang.launch_server  # the slow part, done once
results = []
for args in json.loads(sys.argv[1]):
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        code = 0
        try:
            sys.argv = [sglang.launch_server.__file__, *args]
            runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out.seek(0)
    err.seek(0)
    results.append({"returncode": status, "stdout": out.read(), "stderr": err.read()})
print(json.dumps(results))
"""


def launch_each(*arg_lists: list[str], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """``launch(*args)`` for each argument list, importing SGLang once for all of them: each
    runs ``sglang.launch_server`` as ``__main__`` in a child forked after the import."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCH_EACH, json.dumps([list(a) for a in arg_lists])],
                          env=cpu_env(), capture_output=True, text=True, timeout=timeout, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    return [subprocess.CompletedProcess(["sglang.launch_server", *a], r["returncode"], r["stdout"], r["stderr"])
            for a, r in zip(arg_lists, runs, strict=True)]


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


def assert_matches_reference(model, policy: str, prompt: list[int], out: dict, tol: float = 1e-4,
                             backend: str = "torch") -> float:
    """Replay one served request in the reference decode loop and return the largest
    |log-prob| gap, failing when it reaches ``tol`` or the rounds or region differ.

    Teacher-forced on the server's tokens, with the server's policy, seed and kernel
    ``backend`` (the twins agree to rounding, and on a random-weight model's near-uniform
    attention a rounding difference can flip which token is kept). The loop
    re-prefills where the server did (meta_info ``kv_reprefilled_tokens``) and, like the
    server, never feeds the last token (nor runs a round for it). The region is bounded
    by B + R except when a re-prefill produced the last token: then, as on the server,
    the whole history sits in the region and no decode step follows to run the round
    that brings it back (``kv_region_len`` is as of the last decode step).
    """
    import torch

    from support.constants import REGION, SEED, B, R
    from support.reference_decode import ReferenceDecoder
    from vase_sglang.config import PolicyConfig

    meta = out["meta_info"]
    reprefills = [int(g) for g in meta["kv_reprefilled_tokens"].split(",")] if meta["kv_reprefilled_tokens"] else []
    toks = tokens(out)
    ref = ReferenceDecoder(model, PolicyConfig(policy=policy, budget=B, recent=R), seed=SEED, backend=backend)
    logits = ref.prefill(prompt)
    ref_lp, pending = [], list(reprefills)
    for i, token in enumerate(toks):
        ref_lp.append(torch.log_softmax(logits, -1)[token].item())
        if i + 1 == len(toks):
            break
        if pending and pending[0] == i + 1:  # retracted after i + 1 tokens: re-prefilled them
            pending.pop(0)
            logits = ref.reprefill(prompt, toks[: i + 1])
        else:
            logits = ref.step(token)
    assert not pending, f"re-prefill points {reprefills} past the output"
    assert ref.rounds == meta["kv_eviction_rounds"], (ref.rounds, meta["kv_eviction_rounds"])
    assert meta["kv_region_len"] <= REGION
    assert ref.region_length <= REGION or reprefills[-1] == len(toks) - 1, (ref.region_length, reprefills[-3:])
    server_lp = [lp for lp, _, _ in meta["output_token_logprobs"]]
    diffs = [abs(a - b) for a, b in zip(server_lp, ref_lp, strict=True)]
    worst = max(diffs)
    first = next((i for i, d in enumerate(diffs) if d >= tol), 0)  # read only when some diff >= tol
    assert worst < tol, (f"re-prefilled at {reprefills}: max |logprob diff| = {worst}, first at token {first} "
                         f"(diffs from there: {[round(d, 5) for d in diffs[first:first + 8]]}), "
                         f"{meta['kv_eviction_rounds']} rounds")
    return worst


ORACLE_PATH = Path(__file__).parent / "prefix_oracle"


def oracle_env(digest_file: Path) -> dict[str, str]:
    """Server environment that loads the prefix oracle (``prefix_oracle/sitecustomize.py``)
    into every server process, writing to ``digest_file``."""
    path = os.pathsep.join(p for p in (str(ORACLE_PATH), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "VASE_TEST_DIGEST_FILE": str(digest_file)}


def prefix_digests(digest_file: Path) -> dict[str, list[str]]:
    """Per request id, the oracle's digests of its prompt's K/V since its region last
    started: the start, then one after each round."""
    out: dict[str, list[str]] = {}
    for line in digest_file.read_text().splitlines():
        entry = json.loads(line)
        if entry["event"] == "start":
            out[entry["rid"]] = [entry["digest"]]
        else:
            out[entry["rid"]].append(entry["digest"])
    return out
