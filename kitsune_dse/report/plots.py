"""PNG pictures written next to the CSVs: pareto.png, plan.png, strategies.png, sweep.png."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kitsune_dse.report.timeline import Timeline  # noqa: E402

# ten strong colours first, then their light variants: neighbouring groups stay distinct
COLORS = tuple(plt.get_cmap("tab10").colors) + tuple(plt.get_cmap("tab20").colors[1::2])
STRATEGY_COLORS = {"bsp": "#7f7f7f", "bsp-eager": "#c7c7c7", "fusion": "#1f77b4",
                   "tilesync": "#17becf", "concurrent": "#9467bd", "pipeline": "#d62728",
                   "plan": "#2ca02c"}


def _save(fig, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    tmp.replace(path)


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points (minimise both columns), sorted by the first."""
    order = np.lexsort((points[:, 1], points[:, 0]))
    front, best = [], np.inf
    for i in order:
        if points[i, 1] < best:
            front.append(i)
            best = points[i, 1]
    return np.array(front, dtype=int)


def plan_neighbours(plan: dict, candidates) -> np.ndarray:
    """Whole-model (latency, DRAM) of every plan one region swap away from the chosen plan:
    each chosen region replaced by each other candidate covering the same ops."""
    lat, dram = plan["predicted"]["latency_s"], plan["predicted"]["dram_bytes"]
    pts = []
    by_ops: dict[tuple, list] = {}
    for c in candidates:
        by_ops.setdefault(tuple(c.ops), []).append(c)
    for r in plan["regions"]:
        for c in by_ops.get(tuple(r["ops"]), []):
            pts.append((lat - r["predicted"]["latency_s"] + c.estimate.latency_s,
                        dram - r["predicted"]["dram_bytes"] + c.estimate.dram_bytes))
    return np.array(pts) if pts else np.zeros((0, 2))


def pareto_png(path: Path, plan: dict, strategies: list[dict], candidates=(), extra_plans=()):
    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    cloud = plan_neighbours(plan, candidates)
    pts = [cloud] if len(cloud) else []
    if len(cloud):
        ax.scatter(cloud[:, 0] * 1e6, cloud[:, 1] / 1e6, s=12, c="#bbbbbb", alpha=0.6,
                   label="plans one region swap from the pick")
    for p in extra_plans:
        xy = np.array([[p["predicted"]["latency_s"], p["predicted"]["dram_bytes"]]])
        pts.append(xy)
        ax.scatter(xy[:, 0] * 1e6, xy[:, 1] / 1e6, s=30, marker="s", facecolors="none",
                   edgecolors="#555555", label=None)
    for r in strategies:
        xy = np.array([[r["latency_s"], r["dram_bytes"]]])
        pts.append(xy)
        if r["strategy"] == "plan":
            continue
        ax.scatter(xy[:, 0] * 1e6, xy[:, 1] / 1e6, s=60, marker="D",
                   c=STRATEGY_COLORS.get(r["strategy"], "k"), label=f"whole model: {r['strategy']}",
                   zorder=3)
    # name the whole-model points in place; points that (nearly) coincide share one label
    groups: list[list] = []
    for r in strategies:
        if r["strategy"] == "plan":
            continue
        for grp in groups:
            if (abs(grp[0]["latency_s"] / r["latency_s"] - 1) < 0.02
                    and abs(grp[0]["dram_bytes"] / max(r["dram_bytes"], 1) - 1) < 0.02):
                grp.append(r)
                break
        else:
            groups.append([r])
    for grp in groups:
        ax.annotate(", ".join(r["strategy"] for r in grp),
                    (grp[0]["latency_s"] * 1e6, grp[0]["dram_bytes"] / 1e6),
                    textcoords="offset points", xytext=(8, 6), fontsize=8)
    allp = np.vstack(pts) if pts else np.zeros((0, 2))
    if len(allp):
        f = allp[pareto_front(allp)]
        ax.step(f[:, 0] * 1e6, f[:, 1] / 1e6, where="post", c="k", lw=1, label="Pareto front")
    ax.scatter([plan["predicted"]["latency_s"] * 1e6], [plan["predicted"]["dram_bytes"] / 1e6],
               s=220, marker="*", c=STRATEGY_COLORS["plan"], edgecolors="k", zorder=4,
               label="chosen plan")
    ax.set_xlabel("predicted latency (µs)")
    ax.set_ylabel("predicted DRAM traffic (MB)")
    ax.set_title(f"{plan['model']['name']} on {plan['hw']['name']}: latency vs DRAM traffic")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.margins(x=0.12, y=0.1)
    _save(fig, path)


def strategies_png(path: Path, title: str, rows: list[dict]):
    names = [r["strategy"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    cols = [STRATEGY_COLORS.get(n, "#333333") for n in names]
    y = np.arange(len(names))
    a1.barh(y, [r["latency_s"] * 1e6 for r in rows], color=cols)
    a1.set_yticks(y, names)
    a1.invert_yaxis()
    a1.set_xlabel("predicted latency (µs)")
    for i, r in enumerate(rows):
        a1.text(r["latency_s"] * 1e6, i, f" {r['speedup_vs_bsp']:.2f}x", va="center", fontsize=8)
    a2.barh(y, [r["dram_read_bytes"] / 1e6 for r in rows], color=cols, label="read")
    a2.barh(y, [r["dram_write_bytes"] / 1e6 for r in rows],
            left=[r["dram_read_bytes"] / 1e6 for r in rows], color=cols, alpha=0.45, label="write")
    a2.set_yticks(y, names)
    a2.invert_yaxis()
    a2.set_xlabel("predicted DRAM traffic (MB): read, then write (lighter)")
    for a in (a1, a2):
        a.grid(axis="x", alpha=0.3)
        a.margins(x=0.18)
    fig.suptitle(title)
    _save(fig, path)


def plan_png(path: Path, tl: Timeline, title: str):
    n_tr = max(1, len(tl.tracks))
    n_q = len(tl.counters)
    fig, axes = plt.subplots(2 if n_q else 1, 1, figsize=(11, 1.0 + 0.55 * n_tr + (2.2 if n_q else 0)),
                             sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [max(1.5, 0.55 * n_tr), 2] if n_q else [1]})
    ax = axes[0][0]
    names = sorted({b.name.split(" tile ")[0] for b in tl.bars if b.kind != "blocked"})
    cmap = {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}
    dense: dict[str, int] = {}
    for b in tl.bars:
        dense[b.track] = dense.get(b.track, 0) + 1
    for b in tl.bars:
        y = tl.tracks.index(b.track)
        if b.kind == "blocked":
            ax.barh(y, (b.end_s - b.start_s) * 1e6, left=b.start_s * 1e6, height=0.35,
                    color="#ffcccc", edgecolor="none")
        else:
            ax.barh(y, (b.end_s - b.start_s) * 1e6, left=b.start_s * 1e6, height=0.7,
                    color=cmap[b.name.split(" tile ")[0]],
                    edgecolor="white" if dense.get(b.track, 0) <= 60 else "none", linewidth=0.3)
    ax.set_yticks(range(n_tr), [t if len(t) < 40 else t[:37] + "..." for t in tl.tracks])
    ax.invert_yaxis()
    from matplotlib.patches import Patch
    handles = [Patch(color=cmap[n], label=n if len(n) < 48 else n[:45] + "...") for n in names[:14]]
    if any(b.kind == "blocked" for b in tl.bars):
        handles.append(Patch(color="#ffcccc", label="blocked (queue full)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    if n_q:
        qa = axes[1][0]
        for i, (name, pts) in enumerate(tl.counters.items()):
            arr = np.array(pts)
            qa.step(arr[:, 0] * 1e6, arr[:, 1], where="post", label=name, c=COLORS[i % len(COLORS)],
                    lw=0.8)
        qa.set_ylabel("tiles in queue")
        qa.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        qa.grid(alpha=0.3)
    axes[-1][0].set_xlabel("time (µs)")
    _save(fig, path)


def sweep_png(path: Path, rows: list[dict]):
    ok = [r for r in rows if not r.get("error")]
    models = sorted({r["model"] for r in ok})
    specs = sorted({r["spec"] for r in ok})
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(models) * max(1, len(specs)) / 2), 5))
    w = 0.8 / max(1, len(specs))
    for k, s in enumerate(specs):
        vals = [next((r["speedup_vs_bsp"] for r in ok if r["model"] == m and r["spec"] == s), np.nan)
                for m in models]
        ax.bar(np.arange(len(models)) + k * w, vals, width=w, label=s, color=COLORS[k % len(COLORS)])
    ax.axhline(1.0, c="k", lw=0.8)
    ax.set_xticks(np.arange(len(models)) + 0.4 - w / 2, models, rotation=35, ha="right")
    ax.set_ylabel("predicted speedup of the plan over bsp")
    ax.set_title("sweep: plan speedup per model and GPU")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)
