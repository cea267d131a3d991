#!/usr/bin/env python3
"""Render the Grafana dashboard's panels from a Prometheus server to one PNG.

    python scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 --start 1796520000 --end 1796521800 \
        --out docs/images/dashboard.png

Grafana itself cannot be installed from this project's package registries, so this draws
what the dashboard would: every panel of ``monitoring/grafana/vase-sglang.json`` at its
grid position, every target's PromQL run through Prometheus's ``query_range`` API over
[start, end] (``$__rate_interval`` and the ``$policy`` variable substituted), each series
labelled by the target's ``legendFormat``. It exits 1 when a target returns no series,
so a rendered image shows every query answering on real data. Needs requests and matplotlib.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "monitoring" / "grafana" / "vase-sglang.json"


def substitute(expr: str, rate_interval: str, policy: str) -> str:
    return expr.replace("$__rate_interval", rate_interval).replace("$policy", policy)


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or json.dumps(labels)


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    r = requests.get(url.rstrip("/") + "/api/v1/query_range",
                     params={"query": expr, "start": start, "end": end, "step": step}, timeout=60)
    r.raise_for_status()
    body = r.json()
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def render(dashboard: dict, url: str, start: float, end: float, step: float, rate_interval: str, policy: str,
           out: Path, data: list[dict] | None = None) -> list[str]:
    """Draw every panel; returns the targets that answered with no series. ``data``, when
    given, receives every target's query and the series it answered."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.42))
    grid = GridSpec(rows, 24, figure=fig, hspace=1.6, wspace=2.5)
    empty = []
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_subplot(grid[g["y"] : g["y"] + g["h"] - 1, g["x"] : g["x"] + g["w"]])
        for target in p.get("targets", []):
            expr = substitute(target["expr"], rate_interval, policy)
            series = query_range(url, expr, start, end, step)
            if data is not None:
                data.append({"panel": p["title"], "expr": expr, "series": series})
            if not series:
                empty.append(f"{p['title']}: {expr}")
            for s in series:
                ts = [float(t) - start for t, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                ax.plot([t / 60 for t in ts], ys, lw=1.2, label=legend(target.get("legendFormat", ""), s["metric"]))
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit == "percentunit":
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.set_title(p["title"], fontsize=10, loc="left")
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=5, ncol=3, loc="upper left", framealpha=0.5)
    fig.suptitle(f"{dashboard['title']}  (rendered from Prometheus by scripts/render_dashboard.py)", fontsize=12,
                 y=0.93)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return empty


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/render_dashboard.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    p.add_argument("--dashboard", type=Path, default=DASHBOARD, help="the dashboard JSON")
    p.add_argument("--start", type=float, required=True, help="unix seconds")
    p.add_argument("--end", type=float, required=True, help="unix seconds")
    p.add_argument("--step", type=float, default=15.0, help="seconds between points (15)")
    p.add_argument("--rate-interval", default="2m", help="what $__rate_interval stands for (2m)")
    p.add_argument("--policy", default=".*", help="the $policy variable, a regex (all)")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--data-out", type=Path, default=None, help="also write every query and its series (JSON)")
    args = p.parse_args(argv)
    if args.end <= args.start:
        p.error("--end must be after --start")
    dashboard = json.loads(args.dashboard.read_text())
    data: list[dict] = []
    empty = render(dashboard, args.prometheus, args.start, args.end, args.step, args.rate_interval, args.policy,
                   args.out, data)
    if args.data_out is not None:
        args.data_out.parent.mkdir(parents=True, exist_ok=True)
        args.data_out.write_text(json.dumps({"prometheus": args.prometheus, "start": args.start, "end": args.end,
                                             "step": args.step, "rate_interval": args.rate_interval,
                                             "targets": data}, indent=1) + "\n")
    print(f"wrote {args.out}: {len(dashboard['panels'])} panels, {len(data)} queries, "
          f"{sum(1 for d in data if d['series'])} answered with data")
    for e in empty:
        print(f"render_dashboard: no series for {e}", file=sys.stderr)
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
