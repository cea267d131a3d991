"""Offline GPU compile check: every Triton kernel variant a server can launch, compiled for
A100 (sm_80), H100/H200 (sm_90) and B200 (sm_100) on a machine without a GPU.

    python -m vase_sglang.compile_check                 # CI: the default settings, see --help
    python -m vase_sglang.compile_check --full          # every geometry, dtype and R, all archs

Two phases, each in its own process:

1. **record** (``TRITON_INTERPRET=1``, a few seconds): for each setting (model geometry,
   pool dtype, R, ``--kv-budget``), build the scheduler on a one-slot pool of that
   geometry and run its ``warm_up()``, the start-up code that launches one round per
   kernel variant a request can reach. A launch hook (``kernels._common.LAUNCH_HOOKS``)
   turns each launch into Triton's specialization for a CUDA target (signature,
   constexprs, divisibility of every int and pointer), computed by the CUDA backend's own
   binder from the real arguments, with the constexprs a GPU launch passes; the kernels
   themselves do not run (``RECORD_ONLY``). A variant the warm-up does not launch cannot
   escape the check, and neither can one it does; no round after the warm-up launches
   another (tests/kernels/test_compile_check.py; the CLI test is tests/tools/test_compile_check_cli.py).
2. **compile** (no interpreter, ``--jobs`` processes, each variant x architecture one
   job): ``triton.compile`` each distinct variant for each architecture with the installed
   Triton (ptxas ships in its wheel), and read registers, spills (``cuobjdump
   -res-usage``: STACK and LOCAL bytes), shared memory against the architecture's
   per-block limit, and whether ``tl.dot`` lowered to tensor-core instructions (``mma``
   in the PTX).

It fails on a compile error, on shared memory over the limit, and on spills in a variant
reachable at ``--kv-budget`` <= 4,096, on any of the architectures. Triton caches compiled kernels
(``~/.triton/cache``, or ``TRITON_CACHE_DIR``), so a second run mostly reads them back.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

# Per-block shared memory limit (opt-in maximum) of each architecture, in bytes.
ARCHS: dict[int, tuple[str, int]] = {80: ("A100", 166_912), 90: ("H100/H200", 232_448), 100: ("B200", 232_448)}
SPILL_FREE_BUDGET = 4096  # variants reachable at budgets up to this must not spill, on any arch
# The binder's target: the specialization (divisibility, constexprs) is the same on every
# NVIDIA architecture, only the compiled code differs.
BINDER_ARCH = 90


@dataclass(frozen=True)
class Geometry:
    """The attention shape one scheduler process sees (per tensor-parallel rank)."""

    name: str
    n_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int


GEOMETRIES = {
    g.name: g
    for g in (
        Geometry("qwen3-8b", 36, 32, 8, 128),  # GQA group 4
        Geometry("qwen3-32b", 64, 64, 8, 128),  # group 8
        Geometry("group16", 36, 32, 2, 128),  # the largest group the flags promise
        Geometry("qwen3-8b-tp8", 36, 4, 1, 128),  # one KV head per rank
        Geometry("smollm2-135m", 30, 9, 3, 64),  # head_dim 64, group 3
        Geometry("gemma2-9b", 42, 16, 8, 256),  # head_dim 256, group 2
    )
}
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Setting:
    """One server configuration: a geometry, the KV pool's dtype, ``--kv-recent`` and
    ``--kv-budget`` (the warm-up covers every smaller budget a request may ask for)."""

    geometry: str
    dtype: str
    recent: int
    budget: int

    @property
    def label(self) -> str:
        return f"{self.geometry}/{self.dtype}/R{self.recent}/B{self.budget}"


def default_settings() -> list[Setting]:
    """CI's settings: the default geometry in bf16 at the paper's R = 64 up to B = 4,096,
    every other geometry (GQA groups 1-16, head_dim 64-256) in bf16 and every pool dtype
    on the default geometry at R = 64, and the widest rows (head_dim 256 in fp32)."""
    out = [Setting("qwen3-8b", "bfloat16", 64, SPILL_FREE_BUDGET)]
    out += [Setting(g, "bfloat16", 64, 512) for g in GEOMETRIES if g != "qwen3-8b"]
    out += [Setting("qwen3-8b", d, 64, 512) for d in DTYPES if d != "bfloat16"]
    out += [Setting("gemma2-9b", "float32", 64, 512)]  # the widest rows: head_dim 256 in fp32
    # 512 stacked rows in fp32, which overflowed sm_90 in one tile: R = 128 with a group
    # of 4, and R = 64 with a group of 8.
    out += [Setting("qwen3-8b", "float32", 128, 512), Setting("qwen3-32b", "float32", 64, 512)]
    return out


def full_settings() -> list[Setting]:
    """Every geometry x pool dtype x R in {32, 64, 128} at B = 4,096. The window kernels'
    tiles stop growing at 64 stacked rows, so a larger R adds no variant."""
    return [Setting(g, d, r, SPILL_FREE_BUDGET) for g in GEOMETRIES for d in DTYPES for r in (32, 64, 128)]


# ---- phase 1: record (runs under TRITON_INTERPRET=1) -----------------------------------

@dataclass
class Variant:
    """One compiled binary: a kernel and Triton's specialization of its arguments."""

    module: str
    name: str
    signature: dict[str, str]
    constexprs: dict[Any, Any]
    attrs: dict[Any, Any]
    options: dict[str, Any]
    settings: list[str] = field(default_factory=list)  # the settings whose warm-up launches it
    smallest_budget: int = 0  # the smallest --kv-budget among those settings

    @property
    def key(self) -> str:
        return repr((self.module, self.name, sorted(self.signature.items()), sorted(self.constexprs.items()),
                     sorted(self.attrs.items()), sorted(self.options.items())))

    @property
    def label(self) -> str:
        named = {k: v for k, v in self.named_constexprs().items() if k.isupper()}
        pointers = sorted({t for t in self.signature.values() if t.startswith("*") and t != "*i64"})
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in sorted(named.items()))}]{''.join(pointers)}"

    def named_constexprs(self) -> dict[str, Any]:
        names = list(self.signature)
        return {names[path[0]]: value for path, value in self.constexprs.items() if len(path) == 1}


_OPTION_KWARGS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _jit(kernel: Any) -> Any:
    """``kernel`` as a JITFunction: under the interpreter it is an InterpretedFunction, and
    a JITFunction twin of the same Python function, with the same ``do_not_specialize``
    lists, specializes and compiles as the GPU would."""
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    kw = getattr(kernel, "kwargs", {}) or {}
    return JITFunction(kernel.fn, do_not_specialize=kw.get("do_not_specialize"),
                       do_not_specialize_on_alignment=kw.get("do_not_specialize_on_alignment"))


def specialization(kernel: Any, args: tuple[Any, ...], constexprs: dict[str, Any]) -> Variant:
    """What Triton compiles for a CUDA GPU when ``kernel`` is launched with these arguments
    (the CUDA backend's own binder; see ``_jit`` for the interpreter)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = getattr(kernel, "fn", kernel)
    jit = _jit(kernel)
    backend = make_backend(GPUTarget("cuda", BINDER_ARCH, 32))
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, spec, options = binder(*args, **constexprs)
    _, signature, consts, attrs = jit._pack_args(backend, dict(constexprs), bound, spec, options)
    return Variant(fn.__module__, fn.__name__, dict(signature), dict(consts), dict(attrs),
                   {k: v for k, v in constexprs.items() if k in _OPTION_KWARGS})


@contextmanager
def recording() -> Iterator[dict[str, Variant]]:
    """Collect, keyed by variant, what each kernel launch inside the block would compile
    on a GPU (the launches themselves run as usual, e.g. in the interpreter)."""
    from .kernels import _common

    variants: dict[str, Variant] = {}

    def hook(kernel: Any, args: tuple[Any, ...], constexprs: dict[str, Any]) -> None:
        v = specialization(kernel, args, constexprs)
        variants.setdefault(v.key, v)

    _common.LAUNCH_HOOKS.append(hook)
    try:
        yield variants
    finally:
        _common.LAUNCH_HOOKS.remove(hook)


def warm_up_setting(setting: Setting) -> dict[str, Variant]:
    """The variants a server of ``setting`` compiles at start-up: its scheduler's warm-up,
    run on a one-slot pool of the setting's geometry. The pool's size reaches the kernels
    only through strides, which are multiples of 16 at any size (head_dim is)."""
    from types import SimpleNamespace

    import torch

    from .plugin.flags import config_from_flags
    from .plugin.scheduler import VaseScheduler, build_engine
    from .plugin.settings import ServerSettings
    from .plugin.telemetry import TelemetryOptions

    g = GEOMETRIES[setting.geometry]
    settings = ServerSettings(config_from_flags("vase", setting.budget, setting.recent, None),
                              telemetry=TelemetryOptions(enabled=True))
    # One slot (the warm-up runs on padding slot 0) and two request rows, as a one-slot pool has.
    k = torch.zeros((g.n_layers, 1, g.kv_heads, g.head_dim), dtype=getattr(torch, setting.dtype))
    engine = build_engine(settings, k, torch.zeros_like(k), 2, g.q_heads, backend="triton")
    sched = VaseScheduler(settings, engine, SimpleNamespace(size=1))
    with recording() as variants:
        sched.warm_up()
    return variants


def record(settings: list[Setting]) -> list[Variant]:
    """Run each setting's warm-up under the interpreter and collect the variants."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the record phase runs the warm-up in the Triton interpreter: set TRITON_INTERPRET=1")
    from .kernels import _common

    variants: dict[str, Variant] = {}
    _common.RECORD_ONLY = True  # the arguments decide the variant; running the kernels would not
    try:
        for s in tqdm(settings, desc="record", unit="setting"):
            for key, v in warm_up_setting(s).items():
                v = variants.setdefault(key, v)
                v.settings.append(s.label)
                v.smallest_budget = min(v.smallest_budget or s.budget, s.budget)
    finally:
        _common.RECORD_ONLY = False
    return list(variants.values())


# ---- phase 2: compile (runs without the interpreter) -----------------------------------

def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _resource_usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    line = next(ln for ln in out.splitlines() if "REG:" in ln)
    fields = dict(part.split(":") for part in line.split() if ":" in part)
    return {"registers": int(fields["REG"]), "stack": int(fields["STACK"]), "local": int(fields["LOCAL"])}


def compile_variant(variant: Variant, arch: int) -> dict[str, Any]:
    """Compile one variant for ``sm_<arch>`` and measure what it needs."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    if os.environ.get("TRITON_INTERPRET") == "1":  # its helpers would be interpreted functions
        raise RuntimeError("the compile phase runs without the Triton interpreter: unset TRITON_INTERPRET")
    jit = _jit(getattr(importlib.import_module(variant.module), variant.name))
    target = GPUTarget("cuda", arch, 32)
    options = make_backend(target).parse_options(dict(variant.options))
    t0 = time.perf_counter()
    row: dict[str, Any] = {"variant": variant.label, "arch": f"sm_{arch}", "settings": variant.settings,
                           "smallest_budget": variant.smallest_budget}
    try:
        k = triton.compile(ASTSource(jit, variant.signature, variant.constexprs, variant.attrs), target=target,
                           options=options.__dict__)
    except Exception as e:  # noqa: BLE001 - every compile error is a finding, reported by name
        row.update(error=f"{type(e).__name__}: {str(e).strip()[:2000]}", seconds=round(time.perf_counter() - t0, 2))
        return row
    usage = _resource_usage(k.asm["cubin"])
    uses_dot = "tt.dot" in k.asm.get("ttir", "")
    ptx = k.asm.get("ptx", "")
    row.update(usage, shared=k.metadata.shared, shared_limit=ARCHS[arch][1], num_warps=k.metadata.num_warps,
               uses_dot=uses_dot, tensor_cores=("mma" in ptx) if uses_dot else None,
               seconds=round(time.perf_counter() - t0, 2))
    return row


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """What makes the check fail, one line per finding."""
    out = []
    for r in rows:
        where = f"{r['variant']} on {r['arch']}"
        if "error" in r:
            out.append(f"{where}: does not compile: {r['error'].splitlines()[0]}")
            continue
        if r["shared"] > r["shared_limit"]:
            out.append(f"{where}: needs {r['shared']:,} bytes of shared memory, above the {r['shared_limit']:,}-byte "
                       "per-block limit")
        spilled = r["stack"] + r["local"]
        if spilled and r["smallest_budget"] <= SPILL_FREE_BUDGET:
            out.append(f"{where}: spills ({r['stack']} stack + {r['local']} local bytes, {r['registers']} registers; "
                       f"reached by {r['settings'][0]})")
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_arch: dict[str, Any] = {}
    for r in rows:
        a = by_arch.setdefault(r["arch"], {"variants": 0, "errors": 0, "max_registers": 0, "max_shared": 0,
                                           "spilling": 0, "seconds": 0.0})
        a["variants"] += 1
        a["seconds"] = round(a["seconds"] + r["seconds"], 1)
        if "error" in r:
            a["errors"] += 1
            continue
        a["max_registers"] = max(a["max_registers"], r["registers"])
        a["max_shared"] = max(a["max_shared"], r["shared"])
        a["spilling"] += bool(r["stack"] + r["local"])
    return by_arch


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'variant':72} {'arch':7} {'regs':>4} {'spill':>6} {'shared':>7} {'tc':>3} {'s':>6}"]
    for r in sorted(rows, key=lambda r: (r["variant"], r["arch"])):
        if "error" in r:
            lines.append(f"{r['variant'][:72]:72} {r['arch']:7} ERROR {r['error'].splitlines()[0][:60]}")
            continue
        tc = "-" if r["tensor_cores"] is None else ("yes" if r["tensor_cores"] else "NO")
        lines.append(f"{r['variant'][:72]:72} {r['arch']:7} {r['registers']:>4} {r['stack'] + r['local']:>6} "
                     f"{r['shared']:>7} {tc:>3} {r['seconds']:>6}")
    return "\n".join(lines)


# ---- orchestration ----------------------------------------------------------------------

def _record_in_interpreter(settings: list[Setting], workdir: Path) -> list[Variant]:
    spec, out = workdir / "settings.json", workdir / "variants.pkl"
    spec.write_text(json.dumps([asdict(s) for s in settings]))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-m", "vase_sglang.compile_check", "--record", str(spec), str(out)], env=env,
                   check=True)
    with out.open("rb") as f:
        variants: list[Variant] = pickle.load(f)
    return variants


def _compile_one(job: tuple[Variant, int]) -> dict[str, Any]:
    return compile_variant(*job)


def run(settings: list[Setting], archs: list[int], jobs: int, progress: bool = True) -> dict[str, Any]:
    """Record the variants of ``settings`` and compile each for ``archs``: the report."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        variants = _record_in_interpreter(settings, Path(tmp))
    recorded = time.perf_counter() - t0
    work = [(v, a) for v in variants for a in archs]
    # Compile workers must import the kernels as JIT functions, not interpreted ones.
    os.environ.pop("TRITON_INTERPRET", None)
    import multiprocessing

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = list(tqdm(pool.map(_compile_one, work), total=len(work), desc="compile", disable=not progress))
    import triton

    return {"kind": "vase-sglang-compile-check", "triton": triton.__version__,
            "settings": [s.label for s in settings], "archs": [f"sm_{a}" for a in archs],
            "spill_free_budget": SPILL_FREE_BUDGET, "record_seconds": round(recorded, 1),
            "seconds": round(time.perf_counter() - t0, 1), "summary": summarize(rows), "failures": failures(rows),
            "variants": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vase_sglang.compile_check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true",
                   help="every geometry x pool dtype x R in {32, 64, 128} at B = 4,096 (default: CI's settings: "
                        + "; ".join(s.label for s in default_settings()) + ")")
    p.add_argument("--arch", default="80,90,100", help="comma-separated compute capabilities, from "
                   + ", ".join(f"{a} ({n})" for a, (n, _) in ARCHS.items()))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--record", nargs=2, metavar=("SETTINGS", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.record:
        settings = [Setting(**s) for s in json.loads(Path(args.record[0]).read_text())]
        # Through the module, not ``__main__``: the parent unpickles ``compile_check.Variant``.
        from vase_sglang import compile_check

        with open(args.record[1], "wb") as f:
            pickle.dump(compile_check.record(settings), f)
        return 0
    try:
        archs = [int(a) for a in args.arch.split(",")]
    except ValueError:
        p.error(f"invalid --arch {args.arch!r}: comma-separated integers, e.g. 80,90,100")
    unknown = [a for a in archs if a not in ARCHS]
    if unknown:
        p.error(f"invalid --arch {unknown[0]}: must be one of {', '.join(map(str, ARCHS))}")
    if args.jobs < 1:
        p.error(f"invalid --jobs {args.jobs}: must be at least 1")
    report = run(full_settings() if args.full else default_settings(), archs, args.jobs)
    print(_table(report["variants"]))
    for arch, s in report["summary"].items():
        print(f"{arch}: {s['variants']} variants, {s['errors']} errors, max {s['max_registers']} registers, "
              f"max {s['max_shared']:,} bytes shared, {s['spilling']} spilling, {s['seconds']} s of compiling")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    for line in report["failures"]:
        print("FAIL", line, file=sys.stderr)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
