"""Estimate: what every cost model returns (SI units throughout)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class Estimate:
    latency_s: float
    dram_read_bytes: float
    dram_write_bytes: float
    l2_bytes: float = 0.0          # peak bytes this plan keeps resident in L2 (queues, reuse)
    kernel_launches: int = 0
    sm_busy_fraction: float = 0.0  # mean fraction of SM-time doing work over the makespan
    flops: float = 0.0
    breakdown: dict = field(default_factory=dict, compare=False)
    # of dram_write_bytes, what is still dirty in L2 when the plan ends (cost.reuse.dirty_residue):
    # written to DRAM after it, so not seen by a measurement of this run alone (ncu's range)
    dram_deferred_write_bytes: float = 0.0

    @property
    def dram_bytes_in_run(self) -> float:
        """The DRAM bytes moved while it runs (what ncu's range around it counts)."""
        return self.dram_bytes - self.dram_deferred_write_bytes

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    def check(self) -> "Estimate":
        """Every numeric field finite and non-negative (a cost-model bug otherwise)."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and (not math.isfinite(v) or v < 0):
                raise ValueError(f"Estimate.{f.name} = {v!r}")
        return self

    def with_breakdown(self, **kw) -> "Estimate":
        return replace(self, breakdown={**self.breakdown, **kw})

    def as_row(self) -> dict:
        return {"latency_s": self.latency_s, "dram_read_bytes": self.dram_read_bytes,
                "dram_write_bytes": self.dram_write_bytes, "dram_bytes": self.dram_bytes,
                "l2_bytes": self.l2_bytes, "kernel_launches": self.kernel_launches,
                "sm_busy_fraction": self.sm_busy_fraction, "flops": self.flops}


def sequential(parts: list[Estimate], overlap_s: float = 0.0, **breakdown) -> Estimate:
    """Regions run one after another: latencies and bytes add up, less `overlap_s` for each
    region after the first (a launch latency the previous region's run hides)."""
    lat = sum(p.latency_s for p in parts) - overlap_s * max(0, len(parts) - 1)
    busy = sum(p.sm_busy_fraction * p.latency_s for p in parts) / lat if lat > 0 else 0.0
    return Estimate(latency_s=lat, dram_read_bytes=sum(p.dram_read_bytes for p in parts),
                    dram_write_bytes=sum(p.dram_write_bytes for p in parts),
                    l2_bytes=max((p.l2_bytes for p in parts), default=0.0),
                    kernel_launches=sum(p.kernel_launches for p in parts),
                    sm_busy_fraction=busy, flops=sum(p.flops for p in parts), breakdown=breakdown,
                    dram_deferred_write_bytes=sum(p.dram_deferred_write_bytes for p in parts))
