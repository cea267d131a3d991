"""The fidelity sweep's report: a markdown table and a plot from ``results.json``."""

from __future__ import annotations

import statistics
from pathlib import Path

from vase_sglang.fidelity.outputs import read_json, save_png, write_split

# Token ids of the references and of the free-running outputs: ``results.raw.json``.
RAW_PATHS = (("references", "*", "tokens"), ("free_running", "*", "tokens"))


def load_results(path: Path) -> dict:
    return read_json(path)


def save_results(path: Path, results: dict) -> None:
    write_split(path, results, RAW_PATHS)


def _arms_by_config(arms: dict[str, dict]) -> dict[str, list[dict]]:
    """Group seeds of one configuration: label without the seed -> its arms."""
    groups: dict[str, list[dict]] = {}
    for label, arm in arms.items():
        if not isinstance(arm, dict) or "kl" not in arm:
            continue
        groups.setdefault(label.rsplit(" s", 1)[0] if arm.get("spec") else "full", []).append(arm)
    return groups


def _mean_sd(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def table_rows(arms: dict[str, dict]) -> list[dict]:
    """One row per configuration: means over seeds (± sample sd when several)."""
    rows = []
    for config, group in _arms_by_config(arms).items():
        bands = [b["band"] for b in group[0]["bands"]]
        row = {"config": config, "seeds": len(group), "group": (group[0].get("spec") or {}).get("group", "full"),
               "kl": [a["kl"] for a in group], "agree": [a["agree"] for a in group], "nll": [a["nll"] for a in group],
               "first": [a["first_divergence_median"] for a in group],
               "band_kl": {band: [a["bands"][i]["kl"] for a in group] for i, band in enumerate(bands)},
               "band_agree": {band: [a["bands"][i]["agree"] for a in group] for i, band in enumerate(bands)}}
        rows.append(row)
    return rows


def markdown(results: dict) -> str:
    setup = results.get("setup", {})
    lines = [
        "# Fidelity to the full cache (teacher-forced)", "",
        f"Model `{Path(setup.get('model', '?')).name}`, {setup.get('prompts')} prompts x {setup.get('tokens')} "
        f"reference tokens, R = {setup.get('recent')}; seeded policies: mean ± sd over seeds "
        f"{setup.get('seeds')}. KL(full || policy) in nats per token; agree = top-1 equals the full cache's; "
        "NLL of the reference tokens; first = median first position where the policy's greedy output "
        f"leaves the full cache's ({(setup.get('tokens') or 0) + 1} = never).", "",
        f"Command: `{setup.get('command', '')}`", "",
    ]
    for teacher, per_budget in results.get("teacher_forced", {}).items():
        for budget, arms in per_budget.items():
            rows = table_rows(arms)
            if not rows:
                continue
            bands = list(rows[0]["band_kl"])

            def first(r: dict, teacher: str = teacher) -> str:
                # Only a greedy teacher is the full cache's own free-running output.
                return _mean_sd(r["first"], ".0f") if teacher == "greedy" else "n/a"

            lines += [f"## Teacher: {teacher}, {budget}", "",
                      "| policy | KL | agree | NLL | first | " + " | ".join(f"KL {b}" for b in bands) + " |",
                      "|---|---|---|---|---|" + "---|" * len(bands)]
            for r in sorted(rows, key=lambda r: (r["group"] != "full", r["group"], statistics.mean(r["kl"]))):
                name = r["config"] + (" (pilot)" if r["group"] == "pilot" else "")
                lines.append(f"| {name} | {_mean_sd(r['kl'], '.3f')} | {_mean_sd(r['agree'], '.3f')} | "
                             f"{_mean_sd(r['nll'], '.3f')} | {first(r)} | "
                             + " | ".join(_mean_sd(r["band_kl"][b], ".3f") for b in bands) + " |")
            lines.append("")
    fr = results.get("free_running")
    if fr:
        lines += ["## Free-running greedy: 4-gram repeat share (loops)", "", "| policy | 4-gram repeat share |",
                  "|---|---|"]
        for label, arm in sorted(fr.items(), key=lambda kv: kv[1]["repeat_4gram"]):
            lines.append(f"| {label} | {arm['repeat_4gram']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_budget = results.get("teacher_forced", {}).get("greedy", {})
    if not per_budget:
        return
    fig, axes = plt.subplots(1, len(per_budget), figsize=(5.5 * len(per_budget), 4.2), squeeze=False, sharey=True)
    for ax, (budget, arms) in zip(axes[0], per_budget.items(), strict=True):
        for config, group in _arms_by_config(arms).items():
            if group[0].get("spec") and group[0]["spec"]["group"] != "sweep":
                continue
            xs = group[0]["curve"]["position"]
            ys = [statistics.mean(a["curve"]["kl"][i] for a in group) for i in range(len(xs))]
            ax.plot(xs, ys, label=config.split(" B=")[0], lw=2.2 if config.startswith("vase B") else 1.2)
        ax.set_title(f"{budget} (R={results['setup']['recent']})")
        ax.set_xlabel("generated-token position")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("KL(full || policy), nats")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{Path(results['setup']['model']).name}: teacher-forced on the full cache's greedy output")
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def write_all(results: dict, out: Path) -> None:
    (out / "results.md").write_text(markdown(results) + "\n")
    plot(results, out / "fidelity.png")
