"""The GPU end-to-end kit rehearsed on CPU, before any GPU time is spent.

    python scripts/gpu_e2e/rehearse.py --carry .gpu_e2e --out DIR

1. A stand-in for the H200's image: python 3.12 with torch 2.11, triton 3.6, transformers 5.17 and
   the rest of ``h200_base.txt``, installed once into the cache, then stripped of every distribution
   the image lacks (``h200_image_packages.txt``), so nothing here can hide a gap in the carry.
2. The carry installed on top, exactly as ``run.py`` installs it on the GPU machine.
3. ``trace_imports.py``: every module of the GPU serving path imported under a faked CUDA, with the
   stand-in ``sgl_kernel`` and no flashinfer, and the plugin's hook manifest checked there.
4. ``run.py --device cpu`` twice: the bundled trained model in ``arms`` mode (a ``none`` and a
   ``vase`` server, greedy equality before the first round, 300-token outputs), then random weights
   of a tiny Qwen3 shape (``--load-format dummy``, the GPU run's loader) in ``switch`` mode.

Writes ``DIR/rehearsal.json`` (the carry's contents, each step, the trace) and each run's
``gpu_e2e.json`` and server logs under ``DIR``; exit status 0 when every step passed.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pack import cache_root, requirements  # noqa: E402
from run import KIT_ENV  # noqa: E402


def python312() -> str:
    """``$VASE_PYTHON312``, else pyenv's 3.12, else ``python3.12`` on PATH."""
    candidates = [os.environ.get("VASE_PYTHON312", "")]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")), reverse=True)
    candidates.append(shutil.which("python3.12") or "")
    for exe in filter(None, candidates):
        probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                               capture_output=True, text=True)
        if probe.stdout.strip() == "True":
            return exe
    raise SystemExit("rehearse: no python 3.12 found (set VASE_PYTHON312); the H200 runs python 3.12")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    return {_normalise(n) for line in requirements(HERE / "h200_image_packages.txt") for n in line.split()}


def prune(target: Path, keep: set[str]) -> list[str]:
    """Removes from a ``pip --target`` folder every distribution whose name is not in ``keep``."""
    removed = []
    for info in sorted(target.glob("*.dist-info")):
        meta = (info / "METADATA").read_text(errors="replace")
        name = _normalise(re.search(r"^Name: (.+)$", meta, re.M).group(1).strip())
        if name in keep:
            continue
        for line in (info / "RECORD").read_text().splitlines():
            path = (target / line.split(",")[0]).resolve()
            if path.is_relative_to(target.resolve()) and path.is_file():
                path.unlink()
        shutil.rmtree(info, ignore_errors=True)
        removed.append(name)
    for folder in sorted((p for p in target.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    return removed


def h200_base(python: str) -> Path:
    """The image's stand-in, cached by the hash of the two files that define it."""
    digest = hashlib.sha256((HERE / "h200_base.txt").read_bytes() + (HERE / "h200_image_packages.txt").read_bytes())
    base = cache_root() / "gpu-e2e" / f"h200-base-py312-{digest.hexdigest()[:12]}"
    if (base / ".complete").exists():
        return base
    partial = base.with_name(base.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"installing the H200 stand-in (torch 2.11 and its CUDA libraries, ~5 GB) into {base} ...", flush=True)
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
                          "--target", str(partial), "-r", str(HERE / "h200_base.txt")],
                         capture_output=True, text=True, timeout=1800)
    if pip.returncode != 0:
        raise SystemExit(f"rehearse: pip could not install h200_base.txt:\n{pip.stderr[-3000:]}")
    removed = prune(partial, image_packages())
    (partial / ".complete").write_text(json.dumps({"removed_not_on_the_image": removed}) + "\n")
    shutil.rmtree(base, ignore_errors=True)
    partial.rename(base)
    return base


def step(report: dict, name: str, cmd: list[str], env: dict[str, str], timeout: float, cwd: Path) -> str | None:
    """Runs one step; records it in ``report``; returns its standard output, or None when it failed."""
    print(f"rehearse: {name}", flush=True)
    t = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, stdout, stderr = 124, "", f"timed out after {timeout:.0f} s"
    tail = (stdout + stderr)[-4000:]
    report["steps"].append({"name": name, "ok": rc == 0, "rc": rc, "seconds": round(time.monotonic() - t, 1),
                            "output_tail": tail})
    if rc != 0:
        print(tail, file=sys.stderr, flush=True)
    return stdout if rc == 0 else None


def bundled_model() -> Path:
    import vase_sglang.bundled

    return Path(vase_sglang.bundled.__file__).resolve().parent / "chain-qwen3"


def rehearse(carry: Path, out: Path, model: Path) -> dict:
    python = python312()
    out.mkdir(parents=True, exist_ok=True)
    base = h200_base(python)
    report: dict = {"python": python, "base": str(base), "carry": json.loads((carry / "carry.json").read_text()),
                    "steps": []}
    with tempfile.TemporaryDirectory(prefix="vase-rehearsal-site-") as site:
        return _rehearse(report, python, base, carry, out, Path(site), model)


def _rehearse(report: dict, python: str, base: Path, carry: Path, out: Path, target: Path, model: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONHOME")}
    env["PYTHONPATH"] = str(base)  # the image's site-packages; run.py puts the carry in front
    env["VASE_SGLANG_DRAIN_TIMEOUT"] = env.get("VASE_SGLANG_DRAIN_TIMEOUT", "5")
    run = [python, str(HERE / "run.py"), "--carry", str(carry), "--device", "cpu", "--target", str(target)]
    installed = step(report, "install the carry", [*run, "--install-only", "--out", str(target / "install")], env,
                     300, out)
    trace_env = {**env, **KIT_ENV, "PYTHONPATH": f"{target}{os.pathsep}{base}"}
    trace = step(report, "import trace under a faked CUDA", [python, str(HERE / "trace_imports.py")], trace_env, 900,
                 out)
    report["trace"] = json.loads(trace) if trace else None
    # Time limits far above the GPU run's: a rehearsal checks that the kit works, not how fast, and
    # the test run rehearses at the lowest CPU priority beside its server tests (support.background).
    common = [*run, "--no-install", "--budget", "64", "--recent", "32", "--prompt-len", "16",
              "--startup-timeout", "2400", "--short-phase-timeout", "1200", "--time-budget", "5400"]
    arms = step(report, "bundled model, none and vase servers, 300 tokens",
                [*common, "--model-path", str(model), "--output-len", "300", "--requests", "6", "--fits", "2",
                 "--out", str(out / "bundled-arms")], env, 5500, out)
    switch = step(report, "random weights (--load-format dummy), one server switching kv_policy per request",
                  [*common, "--shape", "tiny", "--fallback-shape", "off", "--mode", "switch", "--output-len", "256",
                   "--requests", "4", "--fits", "1", "--out", str(out / "dummy-switch")], env, 5500, out)
    report["ok"] = all(x is not None for x in (installed, trace, arms, switch))
    (out / "rehearsal.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_e2e/rehearse.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--carry", type=Path, default=HERE.parents[1] / ".gpu_e2e")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-path", type=Path, default=None, help="a real model to serve (default: the bundled one)")
    args = p.parse_args(argv)
    report = rehearse(args.carry.resolve(), args.out.resolve(), (args.model_path or bundled_model()).resolve())
    for s in report["steps"]:
        print(f"  {'ok  ' if s['ok'] else 'FAIL'} {s['seconds']:6.1f} s  {s['name']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
