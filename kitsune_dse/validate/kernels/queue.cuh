// Ring-queue synchronisation for the persistent pipeline kernel.
//
// Counters are monotonic u32 sequence numbers in global memory (the control block `ctrl`):
//   full[slot]        +1 (red.release.gpu) per finished producer item (sub-tile) of the row-block
//   empty[slot]       +1 per consumer CTA that is done reading the slot's row-block
//   slab[slot][j]     = generation+1 (st.release.gpu) once column slab j of the slot is written
// Publish: the team's barrier, then its thread 0 releases. Consume: thread 0 spins with
// ld.acquire.gpu, then the team's barrier (bar.red.and carries the spin's verdict to the team).
// A "team" is the 256 threads working on one tile (common.cuh); the persistent kernel has two
// per CTA, and each counts as one producer / consumer worker. Every spin has a
// %globaltimer timeout; on expiry it writes an error record to ctrl[0..5] (the first one wins)
// and returns false; every spin also gives up once ctrl[0] is set, so a deadlock ends the launch
// within one timeout and the host reports it.
#pragma once
#include "common.cuh"

#define KDSE_ERR_FULL 1u
#define KDSE_ERR_EMPTY 2u
#define KDSE_ERR_SLAB 3u

KDSE_INLINE u32 ld_acquire(const u32* p) {
    u32 v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
KDSE_INLINE u32 ld_relaxed(const u32* p) {
    u32 v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
KDSE_INLINE void st_release(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
KDSE_INLINE void red_release_add(u32* p, u32 v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// One thread: wait until *p >= target (wrap-safe). False on timeout or a reported error.
KDSE_INLINE bool spin_geq(const u32* p, u32 target, u32* ctrl, u64 timeout_ns, u32 code, u32 what, u32 rb,
                          u32 who) {
    u32 v = ld_acquire(p);
    if ((int)(v - target) >= 0) return true;
    const u64 t0 = globaltimer();
    for (u32 it = 1;; ++it) {
        v = ld_acquire(p);
        if ((int)(v - target) >= 0) return true;
        if ((it & 31u) == 0u) {
            if (ld_relaxed(ctrl) != 0u) return false;
            if (globaltimer() - t0 > timeout_ns) {
                if (atomicCAS(ctrl, 0u, code) == 0u) {
                    ctrl[1] = who; ctrl[2] = what; ctrl[3] = rb; ctrl[4] = target; ctrl[5] = v;
                    __threadfence();
                }
                return false;
            }
        }
    }
}

KDSE_INLINE u32 atom_add_acq_rel(u32* p, u32 v) {
    u32 old; asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Whole team: thread 0 spins, the barrier hands its verdict (and the acquired data) to all.
// `who` (the team's worker index) goes into the error record.
KDSE_INLINE bool team_wait_geq(const Team& tm, const u32* p, u32 target, u32* ctrl, u64 timeout_ns, u32 code,
                               u32 what, u32 rb, u32 who) {
    int ok = 1;
    if (tm.tid == 0) ok = spin_geq(p, target, ctrl, timeout_ns, code, what, rb, who) ? 1 : 0;
    return team_and(tm, ok) != 0;
}

// Whole team: after the team's stores of a sub-tile (or its last reads of a slot).
KDSE_INLINE void team_arrive(const Team& tm, u32* counter) {
    team_sync(tm);
    if (tm.tid == 0) red_release_add(counter, 1u);
}
KDSE_INLINE void team_publish(const Team& tm, u32* full, u32* slab_flag, u32 gen_plus_1) {
    team_sync(tm);
    if (tm.tid == 0) {
        if (slab_flag) st_release(slab_flag, gen_plus_1);
        red_release_add(full, 1u);
    }
}

// GEMM main-loop hook of a split-K consumer: before k-tile kt is loaded, thread 0 waits until
// the column slab that holds it has been published (flags[j] >= gen+1).
struct SlabWait {
    const u32* flags; u32 target; int ktiles_per_slab; u32* ctrl; u64 timeout_ns; u32 what; u32 rb; u32 who;
    int tid;
    mutable bool bad;
    KDSE_INLINE void operator()(int kt) const {
        if (tid == 0 && !bad && kt % ktiles_per_slab == 0)
            bad = !spin_geq(flags + kt / ktiles_per_slab, target, ctrl, timeout_ns, KDSE_ERR_SLAB, what, rb, who);
    }
    KDSE_INLINE void before_epilogue(const Team&) const {}
};

// A GEMM producer's wait for its output ring slot (the consumers' releases of the slot's last
// generation: *flag >= target), once per row-block, just before the epilogue writes the slot:
// the main loop overlaps the consumers' reads of the previous generation. A timeout records
// the error (the host reports it) and lets the team go on.
template <class Inner>
struct SlotWait {
    Inner inner; const u32* flag; u32 target; u32* ctrl; u64 timeout_ns; u32 what; u32 rb; u32 who;
    mutable bool done;
    KDSE_INLINE void operator()(int kt) const { inner(kt); }
    KDSE_INLINE void before_epilogue(const Team& tm) const {
        inner.before_epilogue(tm);
        if (!done && target > 0u)
            team_wait_geq(tm, flag, target, ctrl, timeout_ns, KDSE_ERR_EMPTY, what, rb, who);
        done = true;
    }
};
