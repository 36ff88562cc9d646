// Row tiles (one warp per row, 16-byte vectors of 8 elements) and elementwise tiles.
//
// A row group G supplies, for a row r (local to the row-block base its pointers were set to) and
// a first column c (a multiple of 8):
//   G::pre(r, c, x, store)  the row op's input: x[8] (loads operands, applies the elementwise ops
//                           before the row op; stores values needed outside the group if store)
//   G::post(r, c, y)        the ops after the row op, and the stores
// KIND: 0 layernorm (gamma, beta optional), 1 rmsnorm (gamma optional), 2 softmax.
// CACHE: the row (VPL vectors per lane) stays in registers between the statistics and the output
// pass; otherwise the second pass recomputes pre() from memory (L1/L2 hits for long rows).
#pragma once
#include "common.cuh"

#define ROW_LN 0
#define ROW_RMS 1
#define ROW_SOFTMAX 2

template <int KIND, bool CACHE, int VPL, class G>
KDSE_INLINE void row_tile(const G& g, int r, int cols, float eps,
                          const elem_t* __restrict__ gamma, const elem_t* __restrict__ beta) {
    const int lane = threadIdx.x & 31;
    float s0 = 0.f, s1 = 0.f;   // LN: sum, then centered sum of squares; RMS: sum sq; softmax: max, sum
    float mean = 0.f, scale = 1.f;
    float xc[CACHE ? VPL : 1][8];
    if (CACHE) {
#pragma unroll
        for (int v = 0; v < VPL; ++v) {
            const int c = (v * 32 + lane) * 8;
            if (c < cols) g.pre(r, c, xc[v], true);
            else {
#pragma unroll
                for (int q = 0; q < 8; ++q) xc[v][q] = KIND == ROW_SOFTMAX ? KDSE_NEG_INF : 0.f;
            }
        }
        if (KIND == ROW_LN) {
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) s0 += xc[v][q];
            mean = warp_sum(s0) / cols;
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                const int c = (v * 32 + lane) * 8;
                if (c < cols)
#pragma unroll
                    for (int q = 0; q < 8; ++q) { const float d = xc[v][q] - mean; s1 += d * d; }
            }
            scale = rsqrtf(warp_sum(s1) / cols + eps);
        } else if (KIND == ROW_RMS) {
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += xc[v][q] * xc[v][q];
            scale = rsqrtf(warp_sum(s1) / cols + eps);
        } else {
            float m = KDSE_NEG_INF;
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) m = fmaxf(m, xc[v][q]);
            mean = warp_max(m);
#pragma unroll
            for (int v = 0; v < VPL; ++v)
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += __expf(xc[v][q] - mean);
            scale = 1.f / warp_sum(s1);
        }
    } else {
        float m = KDSE_NEG_INF;
        for (int c = lane * 8; c < cols; c += 256) {
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
                s1 *= __expf(m - mx);
#pragma unroll
                for (int q = 0; q < 8; ++q) s1 += __expf(x[q] - mx);
                m = mx;
            }
        }
        if (KIND == ROW_LN) {
            mean = warp_sum(s0) / cols;
            const float var = fmaxf(warp_sum(s1) / cols - mean * mean, 0.f);
            scale = rsqrtf(var + eps);
        } else if (KIND == ROW_RMS) {
            scale = rsqrtf(warp_sum(s1) / cols + eps);
        } else {
            const float mx = warp_max(m);
            s1 = (m == KDSE_NEG_INF) ? 0.f : s1 * __expf(m - mx);
            mean = mx;
            scale = 1.f / warp_sum(s1);
        }
    }
    // output pass
#pragma unroll
    for (int v = 0; v < (CACHE ? VPL : 1); ++v) {
        for (int c = (v * 32 + lane) * 8; c < cols; c += (CACHE ? cols : 256)) {
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

// Elementwise tile: every thread of the CTA takes 8-column vectors of rows [0, rows) x [c0, c1).
template <class G>
KDSE_INLINE void ew_tile(const G& g, int rows, int c0, int c1) {
    const int nv = (c1 - c0) / 8;
    const int total = rows * nv;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int r = i / nv, c = c0 + (i - r * nv) * 8;
        g.apply(r, c);
    }
}
