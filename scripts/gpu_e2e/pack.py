"""Build the carry of the GPU end-to-end kit: what ``run.py`` needs on the device tool's H200 that its image lacks.

    scripts/gpu_e2e/pack [--out .gpu_e2e] [--limit-mib 40]

The carry is one folder of wheels, installed there with ``pip install --no-index --no-deps --target``:

* ``sglang-<manifest.SGLANG_VERSION>-py3-none-any.whl``: the PyPI wheel trimmed of its cp311-only Rust extensions
  (the python radix-tree core is used instead), ``multimodal_gen`` and ``test``;
* the cp312 manylinux wheels named in ``carry.txt``;
* ``vase_gpu_e2e_stubs``: the ``sgl_kernel``, ``IPython`` and ``soundfile`` stand-ins of ``stubs/``
  (a real package: SGLang's scheduler processes inherit PYTHONPATH, not ``.pth`` files);
* ``vase_sglang``: this checkout's plugin with its entry point, without the bundled model
  (the GPU run makes random weights with ``--load-format dummy``).

It writes ``carry.json`` (each wheel, its size, what it is for), prints the same, and refuses
(exit 1, the previous carry left as it was) when the folder would exceed ``--limit-mib``.
Downloads are cached in ``$VASE_SGLANG_CACHE/gpu-e2e/downloads`` (default ``~/.cache/vase-sglang``).
"""

from __future__ import annotations

import argparse
import ast
import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _pinned_sglang_version() -> str:
    """``SGLANG_VERSION`` of patches/manifest.py, the one pin, read from the file: pack runs
    under any python3 (``$PYTHON``), where the package need not be installed."""
    tree = ast.parse((REPO / "patches" / "manifest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SGLANG_VERSION" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise SystemExit("patches/manifest.py defines no SGLANG_VERSION")


SGLANG_VERSION = _pinned_sglang_version()
SGLANG = f"sglang=={SGLANG_VERSION}"
STUBS_NAME, STUBS_VERSION = "vase_gpu_e2e_stubs", "0.1.0"
LIMIT_MIB = 40
# manylinux tags pip must match exactly; the H200 image runs glibc >= 2.35.
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
SGLANG_DROPPED = ("sglang/multimodal_gen/", "sglang/test/")


def cache_root() -> Path:
    """The same folder as ``vase_sglang.models.cache_dir()`` (pack runs without the package installed)."""
    if os.environ.get("VASE_SGLANG_CACHE"):
        return Path(os.environ["VASE_SGLANG_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vase-sglang"


def requirements(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pip_download(specs: list[str], dest: Path, binary_for_py312: bool) -> None:
    """``pip download --no-deps`` into ``dest`` (pip skips files already there)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "-d", str(dest)]
    if binary_for_py312:
        cmd += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
    subprocess.run(cmd + specs, check=True, timeout=900)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(dest: Path, files: Iterable[tuple[str, bytes]], dist_info: str) -> Path:
    """A wheel at ``dest`` holding ``files`` (archive name, bytes), with ``dist_info/RECORD`` written anew."""
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for name, data in files:
            out.writestr(name, data)
            writer.writerow([name, _record_hash(data), len(data)])
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        out.writestr(f"{dist_info}/RECORD", record.getvalue())
    return dest


def repack(src: Path, dest: Path, drop: Callable[[str], bool], purelib_tag: bool = False) -> Path:
    """Copy the wheel ``src`` to ``dest`` without the members ``drop`` selects; optionally retag it py3-none-any."""
    with zipfile.ZipFile(src) as whl:
        dist_info = next(n.split("/")[0] for n in whl.namelist() if n.split("/")[0].endswith(".dist-info"))
        kept = []
        for name in whl.namelist():
            if name.endswith("/") or name == f"{dist_info}/RECORD" or drop(name):
                continue
            data = whl.read(name)
            if purelib_tag and name == f"{dist_info}/WHEEL":
                lines = [line for line in data.decode().splitlines()
                         if not line.startswith(("Tag:", "Root-Is-Purelib:"))]
                data = ("\n".join(lines + ["Root-Is-Purelib: true", "Tag: py3-none-any"]) + "\n").encode()
            kept.append((name, data))
    return write_wheel(dest, kept, dist_info)


def trimmed_sglang(downloads: Path, out: Path) -> Path:
    pip_download([SGLANG], downloads, binary_for_py312=False)
    name, version = SGLANG.split("==")
    src = next(downloads.glob(f"{name}-{version}-*.whl"))

    def drop(member: str) -> bool:
        # Every .so in this wheel is a cp311 Rust extension; SGLang falls back to python where they are missing.
        return member.endswith(".so") or member.startswith(SGLANG_DROPPED)

    return repack(src, out / f"{name}-{version}-py3-none-any.whl", drop, purelib_tag=True)


def stubs_wheel(out: Path) -> Path:
    root = HERE / "stubs"
    dist_info = f"{STUBS_NAME}-{STUBS_VERSION}.dist-info"
    files = [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*.py"))]
    files += [
        (f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {STUBS_NAME}\nVersion: {STUBS_VERSION}\n"
                                  "Summary: sgl_kernel, IPython and soundfile stand-ins for the GPU end-to-end kit\n"
                                  .encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: vase-sglang pack\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n"),
    ]
    return write_wheel(out / f"{STUBS_NAME}-{STUBS_VERSION}-py3-none-any.whl", files, dist_info)


def plugin_wheel(out: Path, scratch: Path) -> Path:
    built = scratch / "plugin"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "-w", str(built), str(REPO)], check=True, timeout=900)
    src = next(built.glob("vase_sglang-*.whl"))
    return repack(src, out / src.name, lambda member: member.startswith("vase_sglang/bundled/chain-qwen3/"))


def describe(wheel: Path, dependencies: set[str]) -> str:
    if wheel.name.startswith("sglang-"):
        return "sglang, trimmed (no cp311 Rust .so, multimodal_gen, test)"
    if wheel.name.startswith(STUBS_NAME):
        return "stand-ins: sgl_kernel, IPython.display, soundfile"
    if wheel.name.startswith("vase_sglang-"):
        return "this plugin and its entry point (no bundled model)"
    return "dependency from carry.txt" if wheel.name in dependencies else "?"


def build(out: Path, limit_mib: float) -> dict:
    downloads = cache_root() / "gpu-e2e" / "downloads"
    deps_dir = downloads / "cp312"
    deps_dir.mkdir(parents=True, exist_ok=True)
    specs = requirements(HERE / "carry.txt")
    print(f"downloading {len(specs)} cp312 wheels and {SGLANG} (cached in {downloads}) ...", flush=True)
    pip_download(specs, deps_dir, binary_for_py312=True)
    with tempfile.TemporaryDirectory(prefix="gpu-e2e-pack-") as tmp:
        staging = Path(tmp) / "carry"
        wheels = staging / "wheels"
        wheels.mkdir(parents=True)
        dependencies = set()
        for spec in specs:
            name, version = spec.split("==")
            stem = f"{name.replace('-', '_')}-{version}-"
            match = [w for w in deps_dir.glob("*.whl") if w.name.lower().startswith(stem.lower())]
            if len(match) != 1:
                raise SystemExit(f"pack: expected one wheel for {spec} in {deps_dir}, found {len(match)}")
            shutil.copy2(match[0], wheels / match[0].name)
            dependencies.add(match[0].name)
        print("trimming sglang, building the stand-ins and the plugin ...", flush=True)
        trimmed_sglang(downloads, wheels)
        stubs_wheel(wheels)
        plugin_wheel(wheels, Path(tmp))
        entries = [{"file": f"wheels/{w.name}", "bytes": w.stat().st_size, "what": describe(w, dependencies)}
                   for w in sorted(wheels.iterdir(), key=lambda w: -w.stat().st_size)]
        total = sum(e["bytes"] for e in entries)  # the carry but for carry.json, a few KB
        summary = {"built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sglang": SGLANG,
                   "python": "cp312", "limit_mib": limit_mib, "total_bytes": total, "wheels": entries}
        (staging / "carry.json").write_text(json.dumps(summary, indent=2) + "\n")
        for e in entries:
            print(f"  {e['bytes'] / 2**20:7.2f} MiB  {e['file']}  ({e['what']})")
        print(f"  {total / 2**20:7.2f} MiB  in all, {len(entries)} wheels (limit {limit_mib:g} MiB)")
        if total > limit_mib * 2**20:
            raise SystemExit(f"pack: the carry would be {total / 2**20:.2f} MiB, over the {limit_mib:g} MiB limit; "
                             f"{out} left as it was")
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(staging), str(out))
    print(f"carry written to {out}: name it in the device tool's carry (see docs/gpu.md)")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_e2e/pack", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / ".gpu_e2e", help="the carry folder (default: .gpu_e2e)")
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help=f"refuse a larger carry (default {LIMIT_MIB})")
    args = p.parse_args(argv)
    build(args.out.resolve(), args.limit_mib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
