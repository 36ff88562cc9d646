"""A plan over time, from the models' own numbers: the bars of plan.png and the events of
trace.json.

Regions run one after another. A pipeline region is re-simulated with the queue model (the same
per-unit stage times, depths and hand-off latency the prediction used), giving every tile's
start and finish on every stage, the hand-offs between stages and each queue's occupancy. Other
regions show their kernels back to back on all SMs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kitsune_dse.cost.queues import simulate
from kitsune_dse.hw.spec import HwSpec

MAX_UNITS_DRAWN = 4096


@dataclass
class Bar:
    track: str
    name: str
    start_s: float
    end_s: float
    kind: str = "work"          # work | blocked | kernel
    region: int = 0


@dataclass
class Timeline:
    tracks: list[str] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    flows: list[tuple[str, float, str, float]] = field(default_factory=list)  # (from track, t, to track, t)
    counters: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # queue -> (t, tiles)
    makespan_s: float = 0.0

    def track(self, name: str) -> str:
        if name not in self.tracks:
            self.tracks.append(name)
        return name


def _kernels_of_region(rd: dict, graph, spec: HwSpec) -> list[tuple[str, float]]:
    from kitsune_dse.cost.region import Region
    from kitsune_dse.report.plan import STRATEGY_FUNCS
    if graph is None or rd["strategy"] not in STRATEGY_FUNCS:
        return [(f"{rd['strategy']} ({len(rd['ops'])} ops)", rd["predicted"]["latency_s"])]
    est = STRATEGY_FUNCS[rd["strategy"]](Region.of(graph, rd["ops"]), spec)
    ks = est.breakdown.get("kernels")
    if not ks:
        return [(f"{rd['strategy']} ({len(rd['ops'])} ops)", rd["predicted"]["latency_s"])]
    total = sum(k["latency_s"] for k in ks)
    scale = rd["predicted"]["latency_s"] / total if total > 0 else 1.0  # launch gaps spread over kernels
    return [(k["kernel"], k["latency_s"] * scale) for k in ks]


def plan_timeline(plan: dict, spec: HwSpec, graph=None) -> Timeline:
    tl = Timeline()
    t0 = 0.0
    for rd in plan["regions"]:
        lat = rd["predicted"]["latency_s"]
        if rd["strategy"] == "pipeline" and rd.get("stages"):
            stages = rd["stages"]
            units = rd["pipeline"]["row_blocks"] * rd["pipeline"]["slabs"]
            # a stage of c servers holds each of its c units in flight for c unit times
            srv = np.array([int(s.get("servers", 1)) for s in stages])
            t = np.array([s["predicted_unit_latency_s"] for s in stages]) * srv
            depths = [q["depth"] for q in rd["queues"]]
            slabs = int(rd["pipeline"]["slabs"])
            sim = simulate(np.repeat(t[:, None], units, axis=1), depths, spec.ring_handoff_cost_s,
                           servers=srv, group=[slabs] * len(depths))
            names = [tl.track(f"r{rd['id']} stage {s['id']} ({s['sms']} SMs)") for s in stages]
            step = max(1, units // MAX_UNITS_DRAWN)
            for j, tr in enumerate(names):
                for n in range(0, units, step):
                    s0 = t0 + sim.starts[j][n]
                    tl.bars.append(Bar(tr, f"{'+'.join(stages[j]['ops'])} tile {n}", s0, s0 + t[j],
                                       "work", rd["id"]))
                    if sim.departures[j][n] > sim.starts[j][n] + t[j] * (1 + 1e-9):
                        tl.bars.append(Bar(tr, f"blocked on queue {j}", s0 + t[j],
                                           t0 + sim.departures[j][n], "blocked", rd["id"]))
                    if j + 1 < len(names):
                        tl.flows.append((tr, t0 + sim.departures[j][n], names[j + 1],
                                         t0 + sim.starts[j + 1][n]))
            for q in range(len(stages) - 1):
                enter, leave = sim.departures[q], sim.departures[q + 1]
                ev = sorted([(t0 + x, 1) for x in enter] + [(t0 + x, -1) for x in leave],
                            key=lambda e: (e[0], e[1]))
                occ, pts = 0, [(t0, 0.0)]
                for tt, d in ev:
                    occ += d
                    pts.append((tt, float(occ)))
                tl.counters[f"r{rd['id']} queue {q} (stage {q} -> {q + 1})"] = pts
        else:
            tr = tl.track("all SMs")
            cur = t0
            for name, dt in _kernels_of_region(rd, graph, spec):
                tl.bars.append(Bar(tr, name, cur, cur + dt, "kernel", rd["id"]))
                cur += dt
        t0 += lat
    tl.makespan_s = t0
    return tl
