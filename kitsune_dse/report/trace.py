"""trace.json in the Chrome trace-event format (opens in Perfetto and chrome://tracing).

One thread track per pipeline stage (and one for kernels on all SMs), complete events ("X") for
tiles and kernels, flow events ("s"/"f") for tile hand-offs between stages, and counter events
("C") for queue occupancy. Times are microseconds, as the format requires.
"""
from __future__ import annotations

from kitsune_dse.report.timeline import Timeline

PID = 1


def trace_events(tl: Timeline, title: str) -> dict:
    tid = {name: i + 1 for i, name in enumerate(tl.tracks)}
    ev: list[dict] = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": title}}]
    for name, i in tid.items():
        ev.append({"ph": "M", "pid": PID, "tid": i, "name": "thread_name", "args": {"name": name}})
        ev.append({"ph": "M", "pid": PID, "tid": i, "name": "thread_sort_index",
                   "args": {"sort_index": i}})
    for b in tl.bars:
        ev.append({"ph": "X", "pid": PID, "tid": tid[b.track], "name": b.name,
                   "cat": b.kind, "ts": round(b.start_s * 1e6, 4),
                   "dur": round(max(0.0, b.end_s - b.start_s) * 1e6, 4),
                   "args": {"region": b.region}})
    for k, (src, ts, dst, td) in enumerate(tl.flows):
        common = {"pid": PID, "name": "tile hand-off", "cat": "queue", "id": k}
        ev.append({**common, "ph": "s", "tid": tid[src], "ts": round(ts * 1e6, 4)})
        ev.append({**common, "ph": "f", "bp": "e", "tid": tid[dst], "ts": round(max(td, ts) * 1e6, 4)})
    for name, pts in tl.counters.items():
        for t, v in pts:
            ev.append({"ph": "C", "pid": PID, "name": name, "ts": round(t * 1e6, 4),
                       "args": {"tiles": v}})
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {"generator": "kitsune-dse", "makespan_us": tl.makespan_s * 1e6}}
