"""The offline GPU compile check, run as CI runs it: every variant the warm-up of the
default settings launches, compiled for sm_80, sm_90 and sm_100 by the installed Triton,
from an empty Triton cache (so every variant really goes through ptxas)."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton
from support.background import Finished, Job, background_job

from vase_sglang import compile_check as cc
from vase_sglang.kernels import compact, cur, evicted_mass, select, value_stat, window_attention

# Every kernel a module launches (``launch(_kernel, ...)``), read from the source.
KERNELS = {name for m in (compact, cur, evicted_mass, select, value_stat, window_attention)
           for name in re.findall(r"\blaunch\((_\w+)", inspect.getsource(m))}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vase_sglang.compile_check", *args], capture_output=True, text=True,
                          env=env, timeout=1500)


@background_job
def compile_check_from_an_empty_cache(folder: Path) -> Job:
    """``python -m vase_sglang.compile_check`` with a Triton cache of its own, empty."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(folder / "triton-cache")}
    return Job([sys.executable, "-m", "vase_sglang.compile_check", "--json", str(folder / "report.json")], env=env,
               timeout=1500, expected_s=120)


@pytest.fixture(scope="module")
def report(compile_check_from_an_empty_cache: Finished) -> dict:
    run = compile_check_from_an_empty_cache
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((run.folder / "report.json").read_text())


def test_every_kernel_compiles_for_every_architecture_within_its_limits(report: dict) -> None:
    assert report["failures"] == []
    assert (report["kind"], report["triton"]) == ("vase-sglang-compile-check", triton.__version__)
    assert report["archs"] == ["sm_80", "sm_90", "sm_100"]
    assert report["settings"] == [s.label for s in cc.default_settings()]
    rows = report["variants"]
    assert {r["variant"].split("[")[0] for r in rows} == KERNELS
    per_arch = {arch: sum(r["arch"] == arch for r in rows) for arch in report["archs"]}
    assert len(set(per_arch.values())) == 1, f"not every variant compiled for every architecture: {per_arch}"
    for r in rows:
        assert "error" not in r, r
        assert r["shared"] <= r["shared_limit"], r
        if r["uses_dot"]:
            assert r["tensor_cores"], f"{r['variant']} on {r['arch']}: tl.dot did not lower to mma"


def test_selection_does_not_spill_at_the_papers_largest_budget(report: dict) -> None:
    widest = [r for r in report["variants"] if r["variant"].startswith("_select_kernel[BLOCK=4096,")]
    assert {r["arch"] for r in widest} == {"sm_80", "sm_90", "sm_100"}
    for r in widest:
        assert r["stack"] + r["local"] == 0, r
        assert r["num_warps"] == select.warps(4096)


# The window kernel given shapes that cannot work: all 512 fp32 rows of a group of 8 at
# R = 64 in one tile (more shared memory than sm_90 has), and a head_dim block that is
# not a power of two. Compiled for sm_90 in a process without the interpreter.
PLANTED = """
import json, sys, torch
from vase_sglang import compile_check as cc
from vase_sglang.kernels import window_attention as w

q = torch.zeros((1, 1, 8, 64, 128)); k = torch.zeros((1, 8, 1, 128))
slots = torch.zeros((1, 64), dtype=torch.int64); rows = torch.zeros(1, dtype=torch.int64); lse = torch.zeros(512)
args = (q, rows, k, slots, lse, 1, 64, 64, 128, 8, 0.1, *q.stride(), *k.stride(), *slots.stride())
out = []
for block_m, block_d in ((512, 128), (64, 100)):
    v = cc.specialization(w._window_lse, args, dict(BLOCK_M=block_m, BLOCK_C=16, BLOCK_D=block_d,
                                                    DOT_PRECISION="tf32", DOT_FP32=False))
    v.settings, v.smallest_budget = ["planted"], 512
    out.append(cc.compile_variant(v, 90))
json.dump({"rows": out, "failures": cc.failures(out)}, sys.stdout)
"""


def test_the_check_fails_on_planted_shapes_that_cannot_work() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", PLANTED], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout)
    too_big, bad_shape = got["rows"]
    assert too_big["shared"] > too_big["shared_limit"] == cc.ARCHS[90][1]
    assert "error" in bad_shape
    failures = got["failures"]
    assert any("BLOCK_M=512" in f and "bytes of shared memory, above the 232,448-byte" in f for f in failures)
    assert any("BLOCK_D=100" in f and "does not compile" in f for f in failures)


@pytest.mark.parametrize(("args", "message"), [
    (["--arch", "75"], "invalid --arch 75: must be one of 80, 90, 100"),
    (["--arch", "sm90"], "invalid --arch 'sm90'"),
    (["--jobs", "0"], "invalid --jobs 0: must be at least 1"),
])
def test_bad_flags_are_refused_by_name(args: list[str], message: str) -> None:
    run = _cli(*args)
    assert run.returncode == 2
    assert message in run.stderr


def test_help_names_the_settings() -> None:
    run = _cli("--help")
    assert run.returncode == 0
    assert "qwen3-8b/bfloat16/R64/B4096" in run.stdout

