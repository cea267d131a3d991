"""The prepared GPU check (see gpu_check.sh): each step under its own time limit, one JSON.

    python3 scripts/gpu_check.py OUT_DIR [--steps compile,tests,bench,sanitizer]
    python3 scripts/gpu_check.py --one-round      # what compute-sanitizer runs

Steps:
  compile    the offline compile check (python -m vase_sglang.compile_check) with this
             machine's Triton: every warm-up variant for sm_80/90/100, resources per variant;
  tests      the kernel, policy, round-cost, CUDA-graph and real-size int64 tests on CUDA
             (Triton compiled), JUnit XML parsed into the JSON;
  bench      the kernel benchmark at Qwen3-8B geometry (B=4096, R=64, 36 layers, 32 q / 8
             KV heads, head_dim 128, 1-64 requests), Triton against the torch reference;
  sanitizer  compute-sanitizer memcheck on one VaSE round (Triton select + compact), if
             the tool is on PATH.
It needs torch, triton, pytest, hypothesis and scipy, not sglang, and runs from the source
tree. Nothing here runs in CI: CI has no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/kernels/test_kernels.py", "tests/kernels/test_round_cost.py", "tests/kernels/test_kernel_int64.py",
    "tests/unit/test_cuda_graph_safety.py", "tests/unit/test_policy_properties.py",
    "tests/unit/test_sampling_distribution.py", "tests/unit/test_sharding.py", "tests/unit/test_scheduler.py",
    "tests/unit/test_config.py", "tests/kernels/test_compile_check.py",
]
LIMITS = {"compile": 240, "tests": 300, "bench": 180, "sanitizer": 90}


def _run(cmd: list[str], limit: int, log: Path, env: dict[str, str] | None = None) -> dict:
    t0 = time.monotonic()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=limit, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(time.monotonic() - t0, 1), "log": log.name}


def environment() -> dict:
    import torch
    import triton

    free, total = torch.cuda.mem_get_info()
    return {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "gpu_free_gb": round(free / 1e9, 1), "gpu_total_gb": round(total / 1e9, 1),
            "compute_sanitizer": shutil.which("compute-sanitizer")}


def step_tests(out: Path) -> dict:
    xml = out / "junit.xml"
    res = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *TESTS],
               LIMITS["tests"], out / "tests.log")
    if xml.exists():
        cases = ET.parse(xml).getroot().iter("testcase")
        outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
        for case in cases:
            name = f"{case.get('classname')}::{case.get('name')}"
            kind = ("failed" if case.find("failure") is not None or case.find("error") is not None
                    else "skipped" if case.find("skipped") is not None else "passed")
            outcome[kind].append(name)
        res.update({k: len(v) for k, v in outcome.items()}, failed_names=outcome["failed"],
                   skipped_names=outcome["skipped"],
                   real_pool_int64=next((k for k, v in outcome.items()
                                         if any("test_kernels_at_a_real_pool_size" in n for n in v)), "not run"),
                   real_cuda_graph=next((k for k, v in outcome.items()
                                         if any("test_query_recording_under_a_real_cuda_graph" in n for n in v)),
                                        "not run"))
    return res


def step_compile(out: Path) -> dict:
    """The offline compile check with this machine's Triton (the same report CI makes),
    so its registers, spills and shared memory sit on file beside the runtime figures."""
    path = out / "compile_check.json"
    res = _run([sys.executable, "-m", "vase_sglang.compile_check", "--jobs", str(os.cpu_count() or 1),
                "--json", str(path)], LIMITS["compile"], out / "compile.log")
    if path.exists():
        report = json.loads(path.read_text())
        res.update(summary=report["summary"], failures=report["failures"], triton=report["triton"])
    return res


def step_bench(out: Path) -> dict:
    path = out / "kernel_bench.json"
    res = _run([sys.executable, "-m", "vase_sglang.bench.kernels", "--budgets", "4096", "--recent", "64",
                "--requests", "1,8,32,64", "--json", str(path)], LIMITS["bench"], out / "bench.log")
    if path.exists():
        res["rows"] = json.loads(path.read_text())
    return res


def step_sanitizer(out: Path) -> dict:
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return {"rc": "absent", "note": "compute-sanitizer is not on PATH"}
    env = {**os.environ, "TRITON_DISABLE_LINE_INFO": "0"}
    res = _run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, __file__, "--one-round"],
               LIMITS["sanitizer"], out / "sanitizer.log", env=env)
    m = re.search(r"ERROR SUMMARY: (\d+) error", (out / "sanitizer.log").read_text(errors="replace"))
    res["errors"] = int(m.group(1)) if m else None
    return res


def one_round() -> None:
    """One VaSE round on the Triton path at a small Qwen-like geometry, checked."""
    import torch

    sys.path.insert(0, str(REPO))
    from vase_sglang.config import PolicyConfig
    from vase_sglang.kernels import ops, reference
    from vase_sglang.policies import Regions, make_policy

    cfg = PolicyConfig(policy="vase", budget=512, recent=64)
    g = torch.Generator().manual_seed(0)
    shape = (2, 4, 8, cfg.region_size, 128)
    keys, values = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    queries = torch.randn((2, 4, 32, cfg.recent, 128), generator=g)
    regions, small = (Regions.from_dense(keys.cuda().bfloat16(), values.cuda().bfloat16(), queries.cuda().bfloat16(),
                                         shuffle_slots=torch.Generator().manual_seed(1)) for _ in range(2))
    keep = make_policy(cfg, backend="triton").select(regions)
    ops.compact(regions.k_buf, regions.v_buf, regions.slots, keep, backend="triton")
    reference.compact(small.k_buf, small.v_buf, small.slots, keep)
    torch.cuda.synchronize()
    assert torch.equal(regions.k_buf, small.k_buf) and torch.equal(regions.v_buf, small.v_buf)
    print("one round: ok")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", default=os.environ.get("OUT", "out"))
    p.add_argument("--steps", default="compile,tests,bench,sanitizer")
    p.add_argument("--one-round", action="store_true")
    args = p.parse_args()
    if args.one_round:
        one_round()
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"environment": environment()}
    steps = {"compile": step_compile, "tests": step_tests, "bench": step_bench, "sanitizer": step_sanitizer}
    for name in args.steps.split(","):
        print(f"== {name}", flush=True)
        report[name] = steps[name](out)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2))  # partial results survive a kill
        print(json.dumps({k: v for k, v in report[name].items() if k != "rows"}, indent=1)[:3000], flush=True)
    ok = (report.get("compile", {}).get("rc", 0) == 0
          and report.get("tests", {}).get("failed", 0) == 0 and report.get("tests", {}).get("rc", 0) in (0,)
          and report.get("bench", {}).get("rc", 0) == 0 and report.get("sanitizer", {}).get("errors") in (None, 0))
    report["ok"] = ok
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'gpu_check.json'}; ok={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
