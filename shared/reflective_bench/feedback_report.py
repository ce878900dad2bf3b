"""Report of `reflective-memory bench feedback`: Markdown tables, learning curves, JSON, PNG.

Reads the per-split results `reflective_bench.feedback.run` collects (coverage before,
and per condition a `_Run` with its learning curve, teaching-half
coverage and timings) and renders them; nothing here runs the engine.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.config import MemoryConfig
from reflective_memory.io import Conversation

__all__ = ["report", "as_json", "curves_of", "plot_curves", "CURVE_BUDGETS"]

#: Budgets (words) of the learning curves (the teaching budget and below).
CURVE_BUDGETS = (250, 500, 1000)


def plot_curves(
    curves: dict[str, list[tuple[float, float]]],
    path: Path,
    title: str,
    ylabel: str,
    xlabel: str = "feedback episodes per user (teaching half)",
) -> Path:
    """Draw learning curves as a PNG with Pillow (no plotting library needed)."""
    from PIL import Image, ImageDraw

    w, h, ml, mr, mt, mb = 760, 440, 70, 170, 40, 55
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    xs = [x for c in curves.values() for x, _ in c]
    ys = [y for c in curves.values() for _, y in c]
    x0, x1 = 0, max(xs) or 1
    lo, hi = min(ys), max(ys)
    pad = max(1.0, (hi - lo) * 0.15)
    y0, y1 = lo - pad, hi + pad

    def px(x: float, y: float) -> tuple[float, float]:
        return (
            ml + (x - x0) / (x1 - x0) * (w - ml - mr),
            h - mb - (y - y0) / (y1 - y0) * (h - mt - mb),
        )

    d.rectangle([ml, mt, w - mr, h - mb], outline="black")
    for i in range(6):
        yv = y0 + (y1 - y0) * i / 5
        _, yy = px(0, yv)
        d.line([ml - 4, yy, ml, yy], fill="black")
        d.text((8, yy - 6), f"{yv:.1f}", fill="black")
        xv = x0 + (x1 - x0) * i / 5
        xx, _ = px(xv, y0)
        d.line([xx, h - mb, xx, h - mb + 4], fill="black")
        d.text((xx - 10, h - mb + 8), f"{xv:.0f}", fill="black")
    d.text((ml, 12), title, fill="black")
    d.text((w // 2 - 120, h - 22), xlabel, fill="black")
    d.text((8, mt - 20), ylabel, fill="black")
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for n, (name, pts) in enumerate(curves.items()):
        col = colors[n % len(colors)]
        pp = [px(x, y) for x, y in pts]
        if len(pp) > 1:
            d.line(pp, fill=col, width=2)
        for x, y in pp:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=col)
        d.line([w - mr + 12, mt + 20 * n + 8, w - mr + 32, mt + 20 * n + 8], fill=col, width=3)
        d.text((w - mr + 38, mt + 20 * n + 2), name, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def _mean(dicts: Sequence[dict[int, float]], b: int) -> float:
    return float(np.mean([d[b] for d in dicts])) if dicts else float("nan")


def _changes(
    per_split: list[dict[str, Any]], c: str, b: int, user: str | None = None
) -> list[float]:
    """Per split, held-out coverage change at budget `b` (of one user's questions if given)."""
    if user is None:
        return [p["runs"][c].curve[-1][1][b] - p["before"][b] for p in per_split]
    return [
        p["runs"][c].test_by_user[user][b] - p["before_by_user"][user][b]
        for p in per_split
        if user in p["before_by_user"]
    ]


def _per_user(
    per_split: list[dict[str, Any]], conditions: Sequence[str], budgets: Sequence[int]
) -> list[str]:
    """Per user, the held-out coverage change (condition minus prior alone): mean (worst split)."""
    users = list(dict.fromkeys(u for p in per_split for u in p["before_by_user"]))
    lines = [
        "",
        "Per user, held-out coverage (%) before learning, and its change by each condition: "
        "mean over splits (worst split):",
        "",
        "| user | run | " + " | ".join(f"cov@{b}" for b in budgets) + " |",
        "|---|---|" + "---|" * len(budgets),
    ]
    for u in users:
        own = [p["before_by_user"][u] for p in per_split if u in p["before_by_user"]]
        cells = " | ".join(f"{_mean(own, b):.1f}" for b in budgets)
        lines.append(f"| {u} | before | {cells} |")
        for c in conditions:
            ch = [_changes(per_split, c, b, u) for b in budgets]
            cells = " | ".join(f"{np.mean(x):+.2f} ({min(x):+.2f})" for x in ch)
            lines.append(f"| {u} | {c}, change | {cells} |")
    return lines


def report(
    args: argparse.Namespace,
    cfg: MemoryConfig,
    protocol: str,
    convs: Sequence[Conversation],
    per_split: list[dict[str, Any]],
    conditions: Sequence[str],
    ingest_s: float,
    embedder_name: str,
    *,
    budgets: Sequence[int],
    precision: float,
    recall: float,
) -> str:
    """The Markdown report of a run (and its PNG learning curves with `--plot`)."""
    sp0 = per_split[0]["split"]
    rr = cfg.rerank
    lines = [
        f"data: {args.data} ({len(convs)} users; protocol: {protocol}; per split "
        f"{len(sp0.train)} teaching / {len(sp0.test)} test questions), "
        f"units={list(cfg.units.granularities)}, denoiser={args.denoiser}, "
        f"embedder={embedder_name}, retrieval={cfg.search.mode}; turn ranker: start "
        f"{args.start}, scope={rr.scope}, update={rr.turn_update}, lr={rr.turn_learning_rate}, "
        f"user lr={rr.turn_user_learning_rate}, pull={rr.turn_pull}, "
        f"prior pull={rr.turn_prior_pull}, explore tau={rr.tau}; "
        f"epochs={args.epochs}, splits={[p['split'].seed for p in per_split]}; "
        f"simulated citations: precision {precision}, recall {recall}; ingest {ingest_s:.0f} s",
        "",
        "Held-out coverage (%), mean over splits:",
        "",
        "| run | " + " | ".join(f"cov@{b}" for b in budgets) + " | teaching half cov@1000 |",
        "|---|" + "---|" * (len(budgets) + 1),
    ]
    befores = [p["before"] for p in per_split]
    tb = [p["runs"][c].train_before for p in per_split for c in conditions[:1]]
    lines.append(
        "| before | "
        + " | ".join(f"{_mean(befores, b):.1f}" for b in budgets)
        + f" | {_mean(tb, 1000):.1f} |"
    )
    for c in conditions:
        afters = [p["runs"][c].curve[-1][1] for p in per_split]
        tr_a = [p["runs"][c].train_after for p in per_split]
        cells = " | ".join(f"{_mean(afters, b):.1f}" for b in budgets)
        lines.append(f"| {c}, after | {cells} | {_mean(tr_a, 1000):.1f} |")
        delta = " | ".join(f"{_mean(afters, b) - _mean(befores, b):+.1f}" for b in budgets)
        lines.append(f"| **{c}, change** | {delta} | {_mean(tr_a, 1000) - _mean(tb, 1000):+.1f} |")
    for c in conditions:
        worst = " | ".join(f"{min(_changes(per_split, c, b)):+.2f}" for b in budgets)
        tr_w = min(
            p["runs"][c].train_after[1000] - p["runs"][c].train_before[1000] for p in per_split
        )
        lines.append(f"| {c}, worst split | {worst} | {tr_w:+.2f} |")
    lines += _per_user(per_split, conditions, budgets)
    lines += [
        "",
        "Per split, change of held-out coverage@1000 (and @500):",
        "",
        "| split | before @1000 | "
        + " | ".join(f"{c} Δ@1000 | {c} Δ@500" for c in conditions)
        + " |",
        "|---|---|" + "---|---|" * len(conditions),
    ]
    for p in per_split:
        cells = " | ".join(
            f"{p['runs'][c].curve[-1][1][1000] - p['before'][1000]:+.1f} | "
            f"{p['runs'][c].curve[-1][1][500] - p['before'][500]:+.1f}"
            for c in conditions
        )
        lines.append(f"| {p['split'].seed} | {p['before'][1000]:.1f} | {cells} |")
    lines += [
        "",
        "Gates after teaching, per split: the shared offsets' mean gain in standard errors "
        "(they rank above the gate), and users whose own offsets rank:",
        "",
        "| split | " + " | ".join(f"{c}: shared t | {c}: users ranking" for c in conditions) + " |",
        "|---|" + "---|---|" * len(conditions),
    ]
    for p in per_split:
        cells = []
        for c in conditions:
            g = p["runs"][c].gates
            if not g:
                cells.append("- | -")
                continue
            sh = g["shared"]
            mark = " (ranks)" if sh["serves"] else ""
            shared = f"{sh['t']:+.2f} of {sh['judged']} judged{mark}"
            cells.append(f"{shared} | {g['users_serving']} of {g['users']}")
        lines.append(f"| {p['split'].seed} | " + " | ".join(cells) + " |")
    curves = curves_of(per_split, conditions)
    for b in CURVE_BUDGETS:
        lines += ["", f"Learning curve, held-out coverage@{b}, mean over splits:", ""]
        at = curves_of(per_split, conditions, b)
        head = at[conditions[0]]
        lines.append("| episodes per user | " + " | ".join(f"{x:.1f}" for x, _ in head) + " |")
        lines.append("|---|" + "---|" * len(head))
        for c in conditions:
            lines.append(f"| {c} | " + " | ".join(f"{y:.1f}" for _, y in at[c]) + " |")
    fb = [x for p in per_split for c in conditions for x in p["runs"][c].feedback_ms]
    ms_b = [x for p in per_split for x in p["ms"]]
    ms_a = [x for p in per_split for c in conditions for x in p["runs"][c].retrieve_ms_after]
    lines += [
        "",
        f"feedback: {np.mean(fb):.2f} ms per episode (median {np.median(fb):.2f}, "
        f"p95 {np.percentile(fb, 95):.2f}, {len(fb)} episodes); retrieval (1,000 words): "
        f"median {np.median(ms_b):.2f} ms before learning, {np.median(ms_a):.2f} ms after "
        f"(ratio {np.median(ms_a) / max(np.median(ms_b), 1e-9):.2f})",
    ]
    if args.plot:
        png = plot_curves(
            {c: curves[c] for c in conditions},
            Path(args.plot),
            f"held-out coverage at 1000 words ({Path(args.data).name}, {protocol})",
            "coverage %",
        )
        lines.append(f"plot: {png}")
    return "\n".join(lines)


def curves_of(
    per_split: list[dict[str, Any]], conditions: Sequence[str], budget: int = 1000
) -> dict[str, list[tuple[float, float]]]:
    """Per condition, the learning curve (episodes per user, coverage@budget) over splits."""
    out = {}
    for c in conditions:
        n = min(len(p["runs"][c].curve) for p in per_split)
        out[c] = [
            (
                float(np.mean([p["runs"][c].curve[i][0] for p in per_split])),
                float(np.mean([p["runs"][c].curve[i][1][budget] for p in per_split])),
            )
            for i in range(n)
        ]
    return out


def as_json(per_split: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-split results as JSON-ready dicts (`--json`)."""
    return [
        {
            "split": p["split"].seed,
            "before": p["before"],
            "before_by_user": p["before_by_user"],
            "runs": {
                c: {
                    "curve": [{"episodes_per_user": x, "test": cov} for x, cov in r.curve],
                    "train_before": r.train_before,
                    "train_after": r.train_after,
                    "test_by_user": r.test_by_user,
                    "feedback_ms_mean": float(np.mean(r.feedback_ms)) if r.feedback_ms else None,
                    "gates": r.gates,
                }
                for c, r in p["runs"].items()
            },
        }
        for p in per_split
    ]
