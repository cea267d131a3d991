"""Summaries of an eval run: per-arm metrics, the markdown table, the accuracy/budget plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from vase_sglang.eval.runner import Arm, Sample
from vase_sglang.fidelity.outputs import save_png


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarize(arm: Arm, samples: list[Sample]) -> dict:
    """pass@1 over k samples (mean correctness), its spread over the sample seeds, mean
    generated length, the share of outputs that loop (by the text definition and by the
    server's online detector, and how often the two agree) or never close </think>, and the
    server's mean evicted attention and estimated KL."""
    seeds = sorted({s.seed for s in samples})
    per_seed = {seed: statistics.fmean(s.correct for s in samples if s.seed == seed) for seed in seeds}
    served = [s for s in samples if s.served_loop is not None]
    return {
        "policy": arm.policy,
        "budget": arm.budget,
        "label": arm.label,
        "samples": len(samples),
        "pass@1": statistics.fmean(s.correct for s in samples),
        "pass@1_by_seed": {str(k): v for k, v in per_seed.items()},
        "pass@1_std_over_seeds": statistics.pstdev(per_seed.values()) if len(per_seed) > 1 else 0.0,
        "mean_tokens": statistics.fmean(s.tokens for s in samples),
        "loop_share": statistics.fmean(s.loop for s in samples),
        "served_loop_share": _mean([s.served_loop for s in served]),
        "loop_agreement": _mean([s.served_loop == s.loop for s in served]),
        "evicted_attention_mean": _mean([s.evicted_attention for s in samples]),
        "estimated_kl_mean": _mean([s.estimated_kl for s in samples]),
        "unclosed_share": statistics.fmean(s.unclosed for s in samples),
        "truncated_share": statistics.fmean(s.finish_reason == "length" for s in samples),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown_table(results: list[dict], full_tokens: float | None) -> str:
    """One row per policy, one column per budget: pass@1 % (± std over seeds), then the
    failure signatures (mean tokens, loop %, unclosed-think %) per cell."""
    budgets = sorted({r["budget"] for r in results if r["budget"] is not None}, reverse=True)
    by_key = {(r["policy"], r["budget"]): r for r in results}
    policies = list(dict.fromkeys(r["policy"] for r in results))

    def head(b: int) -> str:
        ratio = f", {full_tokens / b:.1f}x" if full_tokens else ""
        return f"B={b}{ratio}"

    lines = ["| policy | " + " | ".join(head(b) for b in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for p in policies:
        cells = []
        for b in budgets:
            r = by_key.get((p, b)) or (by_key.get(("none", None)) if p == "none" else None)
            cells.append("-" if r is None else
                         f"{_pct(r['pass@1'])} ± {_pct(r['pass@1_std_over_seeds'])} "
                         f"({r['mean_tokens']:.0f} tok, loop {_pct(r['loop_share'])}"
                         + (f" / served {_pct(r['served_loop_share'])}" if r.get("served_loop_share") is not None
                            else "")
                         + f", open {_pct(r['unclosed_share'])})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_plot(results: list[dict], path: Path, title: str) -> str | None:
    """Accuracy against budget per policy (full cache as a line); returns why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'vase-sglang[eval]')"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r["policy"] for r in results if r["budget"] is not None):
        rows = sorted((r for r in results if r["policy"] == policy and r["budget"] is not None),
                      key=lambda r: r["budget"])
        ax.errorbar([r["budget"] for r in rows], [100 * r["pass@1"] for r in rows],
                    yerr=[100 * r["pass@1_std_over_seeds"] for r in rows], marker="o", capsize=3, label=policy)
    for r in results:
        if r["budget"] is None:
            ax.axhline(100 * r["pass@1"], color="black", linestyle="--", label="none (full cache)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV budget B (generated tokens per layer and KV head)")
    ax.set_ylabel("pass@1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return None
