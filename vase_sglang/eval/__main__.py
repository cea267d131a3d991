"""Accuracy under a KV budget: ``python -m vase_sglang.eval``.

Runs a suite for every (policy, budget) arm and reports pass@1 over k samples, mean
generated length, the share of outputs that loop (by the text definition, and by the
server's own detector when it reports one) or never close ``</think>``, and the server's
evicted attention and estimated KL (``--kv-telemetry``, ``--kv-calibration``).

    # the bundled model on CPU: launch one server per policy and budget
    python -m vase_sglang.eval --policies none,vase,streamingllm --budgets 512,256

    # against a running server (started with an evicting policy and the largest budget)
    python -m vase_sglang.eval --server http://127.0.0.1:30000 --budgets 2048,4096 \\
        --suite aime --data aime25.jsonl --k 8 --max-tokens 32768

Writes ``results.json`` (every arm's numbers), ``results.raw.json`` (every sample's, without
its text), ``results.md`` (the table), and ``accuracy.png`` (pass@1 against budget per
policy) to ``--out``, and prints the table.
Exit status: 0 done, 1 server failure or rejected request, 2 bad option or dataset.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from vase_sglang.cli import OneLineParser, positive_int
from vase_sglang.fidelity.outputs import write_split
from vase_sglang.registry import POLICY_NAMES

PROG = "python -m vase_sglang.eval"
RAW_PATHS = (("samples",),)  # per-sample records: results.raw.json


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICY_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {', '.join(map(repr, bad)) or repr(text)}; "
                                         f"choose from {', '.join(POLICY_NAMES)}")
    return names


def _budgets(text: str) -> list[int]:
    try:
        values = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive budgets, got {text!r}")
    return sorted(set(values), reverse=True)


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_argument_group("what to run")
    what.add_argument("--suite", default="chain", choices=("chain", "aime", "math500", "gsm8k"),
                      help="chain: the generated task the bundled model was trained on (default); aime, math500, "
                           "gsm8k: a local JSONL file given with --data, graded with math-verify")
    what.add_argument("--data", type=Path, default=None,
                      help="JSONL file of the benchmark (needed for aime/math500/gsm8k)")
    what.add_argument("--limit", type=positive_int, default=None, help="use only the first N problems of --data")
    what.add_argument("--problems", type=positive_int, default=32, help="chain suite: held-out problems (default: 32)")
    what.add_argument("--chain-steps", type=positive_int, default=125,
                      help="chain suite: steps per problem, 8 tokens each (default: 125, a 1,004-token answer)")
    what.add_argument("--lookback", type=positive_int, default=24,
                      help="chain suite: minimum distance of the far operand in steps; it also picks the dependency "
                           "graph, and the bundled model knows only the default one (default: 24)")
    what.add_argument("--policies", type=_policies, default=list(POLICY_NAMES),
                      help=f"comma-separated policies (default: all: {','.join(POLICY_NAMES)})")
    what.add_argument("--budgets", type=_budgets, default=[512, 256],
                      help="comma-separated KV budgets B for the evicting policies (default: 512,256, about 2x and "
                           "4x compression of the chain suite); each must be a multiple of --recent")
    what.add_argument("--recent", type=positive_int, default=64, help="recent window R (default: 64)")
    samp = ap.add_argument_group("sampling")
    samp.add_argument("--k", type=positive_int, default=4,
                      help="samples per problem, seeds --seed..--seed+k-1 (default: 4)")
    samp.add_argument("--seed", type=int, default=0, help="first sample seed, for the sampler and kv_seed (default: 0)")
    samp.add_argument("--temperature", type=float, default=0.6, help="sampling temperature; 0 = greedy (default: 0.6)")
    samp.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (default: 0.95)")
    samp.add_argument("--max-tokens", type=positive_int, default=None,
                      help="generation limit (default: chain answer length + 64 for chain, 32768 otherwise)")
    srv = ap.add_argument_group("server")
    srv.add_argument("--server", default=None, metavar="URL",
                     help="use this running server (every arm through per-request custom_params; start it with "
                          "an evicting policy such as vase and --kv-budget >= the largest budget); "
                          "default: launch servers")
    srv.add_argument("--shared-server", action="store_true",
                     help="launch one server (vase, largest budget) for all arms instead of one per policy and budget")
    srv.add_argument("--model-path", default=None, help="model to launch (default: the bundled chain-qwen3)")
    srv.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                     help="auto: CUDA when torch sees a GPU, else SGLang's CPU engine (default: auto)")
    srv.add_argument("--server-args", default="", help="extra sglang.launch_server flags, one quoted string")
    srv.add_argument("--concurrency", type=positive_int, default=16, help="requests in flight (default: 16)")
    srv.add_argument("--startup-timeout", type=positive_int, default=600,
                     help="seconds for a server to start (default: 600)")
    out = ap.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None, help="output folder (default: a new temporary folder)")
    out.add_argument("--save-outputs", action="store_true", help="also write every output text to samples.jsonl")
    return ap


def _validate(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.suite != "chain" and args.data is None:
        ap.error(f"--suite {args.suite} needs --data FILE.jsonl")
    if args.suite == "chain" and args.data is not None:
        ap.error("--data is for --suite aime, math500 or gsm8k")
    bad = [b for b in args.budgets if b % args.recent]
    if bad:
        ap.error(f"budget {bad[0]} is not a multiple of --recent {args.recent}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        ap.error("need --temperature >= 0 and 0 < --top-p <= 1")
    if args.server and (args.shared_server or args.model_path):
        ap.error("--server uses a running server; --shared-server and --model-path are for launched servers")


def _problems(args: argparse.Namespace):
    from vase_sglang.eval.suites import chain_suite, load_benchmark

    if args.suite == "chain":
        return chain_suite(args.problems, steps=args.chain_steps, lookback=args.lookback)
    return load_benchmark(args.suite, args.data, args.limit)


def _arms(args: argparse.Namespace):
    from vase_sglang.eval.runner import Arm

    arms = [Arm("none", None)] if "none" in args.policies else []
    return arms + [Arm(p, b) for b in args.budgets for p in args.policies if p != "none"]


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _server_flags(arm, args: argparse.Namespace, shared: bool) -> list[str]:
    """A shared server runs vase at the largest budget (it captures the queries every policy
    needs); otherwise the server runs the arm itself."""
    policy, budget = ("vase", max(args.budgets)) if shared else (arm.policy, arm.budget)
    kv = (["--kv-policy", "none"] if budget is None else
          ["--kv-policy", policy, "--kv-budget", str(budget), "--kv-recent", str(args.recent)])
    return kv + ["--max-running-requests", str(args.concurrency), *shlex.split(args.server_args)]


def _on_sigterm(signum, frame):  # so the finally blocks stop the servers
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from vase_sglang.bundled.tasks.chain import ChainTask
    from vase_sglang.eval.report import markdown_table, summarize, write_plot
    from vase_sglang.eval.runner import EvalError, Sampling, run_arm, served_model
    from vase_sglang.eval.suites import SuiteError
    from vase_sglang.server_process import ServerError, ServerProcess

    try:
        problems = _problems(args)
    except (SuiteError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    out = (args.out or Path(tempfile.mkdtemp(prefix="vase-eval-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    chain_len = ChainTask(steps=args.chain_steps).completion_tokens if args.suite == "chain" else None
    sampling = Sampling(k=args.k, seed=args.seed, temperature=args.temperature, top_p=args.top_p,
                        max_tokens=args.max_tokens or (chain_len + 64 if chain_len else 32768))
    arms = _arms(args)
    model_path = args.model_path
    if args.server is None and model_path is None:
        from vase_sglang.bundled.model import bundled_model_path

        model_path = str(bundled_model_path())
    device = "" if args.server else _device(args.device)  # no device: the running server has one
    if args.server:
        where = f"server {args.server}"
    else:
        where = ("one shared server" if args.shared_server else "one server per arm") + f" on {device}"
    print(f"{PROG}: {len(problems)} {args.suite} problems x {args.k} samples, {len(arms)} arms "
          f"({', '.join(a.label for a in arms)}); {where}; output in {out}", flush=True)
    results, all_samples, started = [], [], time.monotonic()
    server = None
    workdir = Path(tempfile.mkdtemp(prefix="vase-eval-work-"))
    try:
        for i, arm in enumerate(arms):
            url = args.server
            if url is None:
                if server is None or not args.shared_server:
                    if server is not None:
                        server.stop()
                    name = "shared" if args.shared_server else arm.label.replace("@", "-")
                    assert model_path is not None  # set above when no --server
                    server = ServerProcess(name, model_path, _server_flags(arm, args, args.shared_server), device,
                                           out / f"server-{name}.log", workdir)
                    server.launch()
                    server.wait_healthy(time.monotonic() + args.startup_timeout)
                url = server.url
            model = served_model(url)
            t0 = time.monotonic()
            samples = run_arm(url, model, problems, arm, sampling, args.concurrency)
            summary = summarize(arm, samples)
            summary["wall_s"] = round(time.monotonic() - t0, 1)
            results.append(summary)
            all_samples += [dict(s.record(), arm=arm.label, text=s.text) for s in samples]
            print(f"[{i + 1}/{len(arms)}] {arm.label}: pass@1 {100 * summary['pass@1']:.1f}% "
                  f"(± {100 * summary['pass@1_std_over_seeds']:.1f} over seeds), {summary['mean_tokens']:.0f} tokens, "
                  f"loop {100 * summary['loop_share']:.1f}%"
                  + (f" (server's detector {100 * summary['served_loop_share']:.1f}%)"
                     if summary["served_loop_share"] is not None else "")
                  + f", unclosed {100 * summary['unclosed_share']:.1f}%, "
                  f"{summary['wall_s']:.0f} s", flush=True)
    except (EvalError, ServerError) as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        if isinstance(e, ServerError):
            print(str(e), file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    full = next((r["mean_tokens"] for r in results if r["budget"] is None), chain_len)
    table = markdown_table(results, full)
    command = " ".join([PROG, *map(shlex.quote, argv)])
    doc = {"command": command, "suite": args.suite, "problems": len(problems),
           "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "sampling": vars(sampling), "model": model_path or args.server, "results": results,
           "samples": [{k: v for k, v in s.items() if k != "text"} for s in all_samples],
           "total_s": round(time.monotonic() - started, 1)}
    write_split(out / "results.json", doc, RAW_PATHS, indent=2)
    (out / "results.md").write_text(table + "\n\nreproduce: `" + command + "`\n")
    if args.save_outputs:
        with (out / "samples.jsonl").open("w") as f:
            for s in all_samples:
                f.write(json.dumps(s) + "\n")
    skipped = write_plot(results, out / "accuracy.png", f"{args.suite}: pass@1 over {args.k} samples")
    print()
    print(table)
    print()
    print(f"wrote {out / 'results.json'}, {out / 'results.raw.json'}, {out / 'results.md'}"
          + ("" if skipped else f", {out / 'accuracy.png'}"))
    if skipped:
        print(skipped)
    print(f"reproduce: {command}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    args = ap.parse_args(argv)
    _validate(ap, args)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return run(args, argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
