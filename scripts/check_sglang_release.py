"""Check the plugin's SGLang pins against another SGLang release, without installing it.

    .venv/bin/python scripts/check_sglang_release.py 0.5.22 0.5.23 [--out results/sglang-upgrade]

For each VERSION: the installed sglang when it is that version, otherwise the release's
wheel from the package index (``pip download --no-deps``), unpacked into ``--work`` and put
first on PYTHONPATH, so that it shadows the installed sglang while torch and every other
dependency come from this environment. With that sglang, in a child process, it records:

* ``manifest.check_all(process)`` for the main and scheduler processes (and ``other``);
* the line each process part would stop with at start-up (``hooks.check_contract`` on its
  entries in the order ``hooks.install`` checks them, before any hook is applied);
* ``contract.check_all()``;
* the release's dependency pins, and those that differ from ``scripts/gpu_e2e/carry.txt``;
* the digest of every target whose source is pinned, pinned and now; the source itself goes
  to ``OUT/sources/VERSION/TARGET.txt`` (TARGET less its ``sglang.srt.``), so ``diff -u``
  between two releases' files shows what changed upstream;
* ``pytest tests/unit/test_manifest.py -q``, then ``pytest -q`` on the other offline unit
  tests that read SGLang (``PYTEST``; other runs with ``--pytest``).

It writes ``OUT/VERSION.json`` and prints a summary. It changes nothing in the checkout but
``OUT``, and starts no server. See docs/upgrading-sglang.md.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROCESSES = ("main", "scheduler", "other")
# The default pytest runs: the manifest and contract tests, then the other unit tests that
# import or read SGLang offline (no server; the e2e tests start servers and are not run here).
PYTEST = ("tests/unit/test_manifest.py",
          "tests/unit/test_cuda_graph_safety.py tests/unit/test_plugin_parts.py tests/unit/test_model_checks.py "
          "tests/unit/test_policy_memory.py tests/unit/test_server_args.py tests/unit/test_cpu_mode.py")


def installed_sglang(python: str) -> str | None:
    """The version of the sglang ``python`` imports without any PYTHONPATH, or None."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                         capture_output=True, text=True, env=env, cwd="/")
    return out.stdout.strip() if out.returncode == 0 else None


def fetch(version: str, python: str, work: Path) -> tuple[Path, dict[str, str]]:
    """The folder holding ``version``'s unpacked wheel (downloaded and unpacked once)."""
    downloads, target = work / "downloads", work / f"sglang-{version}"
    downloads.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                    "-d", str(downloads), f"sglang=={version}"], check=True, timeout=900)
    wheels = sorted(downloads.glob(f"sglang-{version}-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one sglang {version} wheel in {downloads}, found {[w.name for w in wheels]}")
    wheel = wheels[0]
    marker = target / ".unpacked"
    if not marker.exists() or marker.read_text() != wheel.name:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
        marker.write_text(wheel.name)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return target, {"wheel": wheel.name, "wheel_sha256": digest, "unpacked_into": str(target)}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").split("[")[0]


def child(sources_dir: str) -> None:
    """Run in the child process, with the sglang under test first on sys.path: one JSON object."""
    import importlib.metadata
    import inspect

    import sglang
    import torch

    from vase_sglang.patches import hooks, manifest
    from vase_sglang.plugin import contract

    result: dict[str, object] = {
        "sglang": {"version": sglang.__version__, "file": sglang.__file__},
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "pinned_version": manifest.SGLANG_VERSION,
        "vase_sglang_file": sys.modules["vase_sglang"].__file__,
    }
    # The release's own dependency pins, against the versions scripts/gpu_e2e/carry.txt brings
    # to the GPU machine (resolved for the pinned release): a pin that differs must be re-read.
    requires = [r for r in importlib.metadata.requires("sglang") or [] if "extra ==" not in r]
    pins = {_norm(r.split("==")[0]): r.split("==")[1].split(";")[0].strip() for r in requires if "==" in r}
    carry = {}
    for line in (REPO / "scripts" / "gpu_e2e" / "carry.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            carry[_norm(name)] = version
    result["sglang"]["metadata_version"] = importlib.metadata.version("sglang")
    result["requires"] = requires
    result["carry_txt_pins_that_differ"] = {n: {"carry.txt": v, "sglang requires": pins[n]}
                                            for n, v in carry.items() if n in pins and pins[n] != v}
    checks = {}
    for process in PROCESSES:
        entries = [e for e in manifest.MANIFEST if e.process == process]
        problems = manifest.check_all(process)
        checks[process] = {"entries": len(entries),
                           "skipped_not_installed": [e.target for e in entries if not manifest.available(e)],
                           "problems": problems}
    result["manifest_check_all"] = checks
    # What a server would print: hooks.install checks a part's entries in manifest order and
    # stops the process at the first that fails, before it applies any hook.
    hooks.import_patch_modules()
    startup = {}
    for process in ("main", "scheduler"):
        for part in manifest.PARTS:
            entries = hooks.entries_for(process, (part,))
            if not entries:
                continue
            first = None
            for e in entries:
                try:
                    hooks.check_contract(e.target)
                except SystemExit as exc:
                    first = str(exc)
                    break
            startup[f"{process}/{part}"] = {"entries": len(entries), "stops_with": first}
    result["startup"] = startup
    result["contract_check_all"] = {
        "classes": len(contract.CONTRACTS),
        "attributes": sum(len(contract.members(p)) for p, _ in contract.CONTRACTS),
        "problems": contract.check_all(),
    }
    pinned = []
    out = Path(sources_dir)
    out.mkdir(parents=True, exist_ok=True)
    for e in manifest.MANIFEST:
        if not e.source_sha256:
            continue
        row: dict[str, object] = {"target": e.target, "pinned": e.source_sha256}
        try:
            obj = manifest._unwrapped(manifest.resolve(e.target))
            source = inspect.getsource(obj)
            row["now"] = manifest.source_digest(obj)
            row["same"] = row["now"] == e.source_sha256
            path = out / f"{e.target.removeprefix('sglang.srt.')}.txt"
            path.write_text(source)
            row["source_file"] = str(path)
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"
        pinned.append(row)
    result["pinned_sources"] = pinned
    print("\n" + json.dumps(result))  # the last line: anything SGLang prints comes before it


def run_checks(version: str, args: argparse.Namespace, installed: str | None) -> dict[str, object]:
    record: dict[str, object] = {"version": version}
    if version == installed:
        pythonpath = str(REPO)
        record["sglang_from"] = {"installed": True}
    else:
        target, info = fetch(version, args.python, args.work)
        pythonpath = f"{target}{os.pathsep}{REPO}"
        record["sglang_from"] = {"installed": False, **info}
    env = {**os.environ, "PYTHONPATH": pythonpath}
    record["env"] = {"PYTHONPATH": pythonpath, "python": args.python}
    sources = args.out / "sources" / version
    cmd = [args.python, str(Path(__file__).resolve()), "--child", str(sources)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    if proc.returncode != 0:
        record["checks_error"] = {"rc": proc.returncode, "stderr": proc.stderr.splitlines()[-40:]}
    else:
        checks = json.loads(proc.stdout.splitlines()[-1])
        for row in checks.get("pinned_sources", []):
            if "source_file" in row:
                row["source_file"] = os.path.relpath(row["source_file"], REPO)
        record["checks"] = checks
    tests = []
    for paths in args.pytest:
        cmd = [args.python, "-m", "pytest", *paths.split(), "-q", "-p", "no:cacheprovider"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
        lines = proc.stdout.splitlines()
        summary = [line for line in lines if line.startswith(("FAILED ", "ERROR "))] + lines[-1:]
        tests.append({"command": " ".join(["python", *cmd[1:]]), "rc": proc.returncode, "summary": summary,
                      "output": lines, "stderr": proc.stderr.splitlines()[-40:]})
    record["pytest"] = tests
    return record


def git(*argv: str) -> str:
    out = subprocess.run(["git", "--no-optional-locks", *argv], capture_output=True, text=True, cwd=REPO)
    return out.stdout.strip()


def summary(record: dict[str, object]) -> list[str]:
    lines = [f"== sglang {record['version']}"]
    checks = record.get("checks")
    if not isinstance(checks, dict):
        return [*lines, f"   checks failed: {record.get('checks_error')}"]
    for process, c in checks["manifest_check_all"].items():
        lines.append(f"   manifest.check_all({process!r}): {len(c['problems'])} of {c['entries']} entries")
        lines += [f"     {p}" for p in c["problems"]]
    for part, s in checks["startup"].items():
        lines.append(f"   start-up {part}: {s['stops_with'] or 'passes'}")
    c = checks["contract_check_all"]
    lines.append(f"   contract.check_all(): {len(c['problems'])} problems ({c['attributes']} attributes, "
                 f"{c['classes']} classes)")
    lines += [f"     {p}" for p in c["problems"]]
    for row in checks["pinned_sources"]:
        state = "same" if row.get("same") else ("error: " + row["error"] if "error" in row else f"now {row['now']}")
        lines.append(f"   pinned {row['target']}: {state}")
    for name, pins in checks["carry_txt_pins_that_differ"].items():
        lines.append(f"   carry.txt {name}=={pins['carry.txt']}, sglang requires =={pins['sglang requires']}")
    for t in record["pytest"]:
        lines.append(f"   {t['command']}: rc {t['rc']}, {t['summary'][-1] if t['summary'] else ''}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", metavar="VERSION", help="SGLang releases to check, e.g. 0.5.22 0.5.23")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "sglang-upgrade",
                        help="where VERSION.json and sources/VERSION/ go (default results/sglang-upgrade)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/vase-sglang-releases"),
                        help="where wheels are downloaded and unpacked (default /tmp/vase-sglang-releases)")
    parser.add_argument("--python", default=sys.executable, help="the environment's python (default: this one)")
    parser.add_argument("--pytest", action="append", metavar="PATHS",
                        help="one pytest run with each release: test paths, space-separated (repeatable; default: "
                             "tests/unit/test_manifest.py, then the other offline unit tests that read SGLang)")
    parser.add_argument("--child", metavar="SOURCES_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    if not args.versions:
        parser.error("name at least one VERSION")
    args.pytest = args.pytest or list(PYTEST)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    installed = installed_sglang(args.python)
    command = "python scripts/check_sglang_release.py " + " ".join(sys.argv[1:])
    for version in args.versions:
        record = {
            "command": command,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "installed_sglang": installed,
            "checkout": {"head": git("rev-parse", "HEAD"),
                         "uncommitted": git("status", "--porcelain", "--", "patches", "pyproject.toml",
                                            "tests/unit/test_manifest.py").splitlines()},
            **run_checks(version, args, installed),
        }
        path = args.out / f"{version}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print("\n".join(summary(record)))
        print(f"   -> {os.path.relpath(path, Path.cwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
