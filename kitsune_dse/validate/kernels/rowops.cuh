// Row tiles (WPR warps per row, 16-byte vectors of 8 elements) and elementwise tiles.
//
// A row group G supplies, for a row r (local to the row-block base its pointers were set to) and
// a first column c (a multiple of 8):
//   G::pre(r, c, x, store)  the row op's input: x[8] (loads operands, applies the elementwise ops
//                           before the row op; stores values needed outside the group if store)
//   G::post(r, c, y)        the ops after the row op, and the stores
// KIND: 0 layernorm (gamma, beta optional), 1 rmsnorm (gamma optional), 2 softmax.
// CACHE: the row (VPL vectors per thread) stays in registers between the statistics and the
// output pass; otherwise the second pass recomputes pre() from memory (L1/L2 hits).
// WPR (1, 2, 4, 8) warps share a row so that VPL stays <= 16 for rows up to 32768 columns.
#pragma once
#include "common.cuh"

#define ROW_LN 0
#define ROW_RMS 1
#define ROW_SOFTMAX 2

// Sum / max over the WPR warps that share a row (red: 8 floats of shared memory per CTA).
template <int WPR> KDSE_INLINE float group_sum(float v, float* red, const Team& tm) {
    v = warp_sum(v);
    if (WPR == 1) return v;
    const int warp = tm.tid >> 5, grp = warp / WPR;
    if ((tm.tid & 31) == 0) red[warp] = v;
    named_barrier(tm.rbar + grp, WPR * 32);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < WPR; ++i) s += red[grp * WPR + i];
    named_barrier(tm.rbar + grp, WPR * 32);
    return s;
}
template <int WPR> KDSE_INLINE float group_max(float v, float* red, const Team& tm) {
    v = warp_max(v);
    if (WPR == 1) return v;
    const int warp = tm.tid >> 5, grp = warp / WPR;
    if ((tm.tid & 31) == 0) red[warp] = v;
    named_barrier(tm.rbar + grp, WPR * 32);
    float s = KDSE_NEG_INF;
#pragma unroll
    for (int i = 0; i < WPR; ++i) s = fmaxf(s, red[grp * WPR + i]);
    named_barrier(tm.rbar + grp, WPR * 32);
    return s;
}

// One row r, computed by the WPR consecutive warps of a row group (8 / WPR rows per CTA pass).
// CACHE: the row's VPL vectors per thread stay in registers; else two passes over memory.
template <int KIND, int WPR, bool CACHE, int VPL, class G>
KDSE_INLINE void row_tile(const G& g, int r, int cols, float eps,
                          const elem_t* __restrict__ gamma, const elem_t* __restrict__ beta, float* red,
                          const Team& tm) {
    constexpr int T = WPR * 32;                     // threads per row
    const int t = (tm.tid & 31) + ((tm.tid >> 5) % WPR) * 32;
    float mean = 0.f, scale = 1.f;
    float xc[CACHE ? VPL : 1][8];
    if (CACHE) {
#pragma unroll
        for (int v = 0; v < VPL; ++v) {
            const int c = (v * T + t) * 8;
            if (c < cols) g.pre(r, c, xc[v], true);
            else {
#pragma unroll
                for (int q = 0; q < 8; ++q) xc[v][q] = KIND == ROW_SOFTMAX ? KDSE_NEG_INF : 0.f;
            }
        }
        if (KIND == ROW_LN) {
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) s0 += xc[v][q];
            mean = group_sum<WPR>(s0, red, tm) / cols;
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                if ((v * T + t) * 8 < cols)
#pragma unroll
                    for (int q = 0; q < 8; ++q) { const float d = xc[v][q] - mean; s1 += d * d; }
            }
            scale = rsqrtf(group_sum<WPR>(s1, red, tm) / cols + eps);
        } else if (KIND == ROW_RMS) {
            float s1 = 0.f;
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += xc[v][q] * xc[v][q];
            scale = rsqrtf(group_sum<WPR>(s1, red, tm) / cols + eps);
        } else {
            float m = KDSE_NEG_INF, s1 = 0.f;
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) m = fmaxf(m, xc[v][q]);
            mean = group_max<WPR>(m, red, tm);
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += __expf(xc[v][q] - mean);
            scale = 1.f / group_sum<WPR>(s1, red, tm);
        }
    } else {
        float m = KDSE_NEG_INF, s0 = 0.f, s1 = 0.f;
        for (int c = t * 8; c < cols; c += T * 8) {
            float x[8];
            g.pre(r, c, x, false);
            if (KIND == ROW_LN) {
#pragma unroll
                for (int q = 0; q < 8; ++q) { s0 += x[q]; s1 += x[q] * x[q]; }
            } else if (KIND == ROW_RMS) {
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += x[q] * x[q];
            } else {  // online softmax statistics
                float mx = m;
#pragma unroll
                for (int q = 0; q < 8; ++q) mx = fmaxf(mx, x[q]);
                s1 = (m == KDSE_NEG_INF) ? 0.f : s1 * __expf(m - mx);
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += __expf(x[q] - mx);
                m = mx;
            }
        }
        if (KIND == ROW_LN) {
            mean = group_sum<WPR>(s0, red, tm) / cols;
            const float var = fmaxf(group_sum<WPR>(s1, red, tm) / cols - mean * mean, 0.f);
            scale = rsqrtf(var + eps);
        } else if (KIND == ROW_RMS) {
            scale = rsqrtf(group_sum<WPR>(s1, red, tm) / cols + eps);
        } else {
            const float mx = group_max<WPR>(m, red, tm);
            s1 = (m == KDSE_NEG_INF) ? 0.f : s1 * __expf(m - mx);
            mean = mx;
            scale = 1.f / group_sum<WPR>(s1, red, tm);
        }
    }
    // output pass
#pragma unroll
    for (int v = 0; v < (CACHE ? VPL : 1); ++v) {
        for (int c = (v * T + t) * 8; c < cols; c += (CACHE ? cols : T * 8)) {
            float x[8];
            if (CACHE) {
#pragma unroll
                for (int q = 0; q < 8; ++q) x[q] = xc[v][q];
            } else {
                g.pre(r, c, x, true);
            }
            float y[8];
            if (KIND == ROW_SOFTMAX) {
#pragma unroll
                for (int q = 0; q < 8; ++q) y[q] = __expf(x[q] - mean) * scale;
            } else {
                float gm[8], bt[8];
                if (gamma) load8<false>(gamma + c, gm);
                else {
#pragma unroll
                    for (int q = 0; q < 8; ++q) gm[q] = 1.f;
                }
                if (KIND == ROW_LN && beta) load8<false>(beta + c, bt);
                else {
#pragma unroll
                    for (int q = 0; q < 8; ++q) bt[q] = 0.f;
                }
#pragma unroll
                for (int q = 0; q < 8; ++q) y[q] = (x[q] - mean) * scale * gm[q] + bt[q];
            }
            g.post(r, c, y);
        }
    }
}

// Elementwise tile: every thread of the team takes 8-column vectors of rows [0, rows) x [c0, c1).
template <class G>
KDSE_INLINE void ew_tile(const G& g, int rows, int c0, int c1, const Team& tm) {
    const int nv = (c1 - c0) / 8;
    const int total = rows * nv;
    for (int i = tm.tid; i < total; i += TEAM_THREADS) {
        const int r = i / nv, c = c0 + (i - r * nv) * 8;
        g.apply(r, c);
    }
}
