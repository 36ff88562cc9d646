// Tensor-core GEMM tile: C[BM x BN] = A[BM x K] @ B[K x BN] (+ a fused epilogue), fp16/bf16 in,
// fp32 accumulate. mma.sync m16n8k16, ldmatrix (.trans for the row-major B), a STAGES-deep
// cp.async.cg shared-memory pipeline, 8 warps laid out 2 (M) x 4 (N). The epilogue stages the fp32
// accumulators through shared memory so that it reads extra inputs and writes outputs as 16-byte
// vectors of 8 consecutive columns; it calls `epi.apply(row, col, v)` with v[NB][8].
//
// NB = 2 computes two products that share A (the gate and up projections of a SwiGLU MLP) and
// hands both to the epilogue. Used by the standalone kernels and by the persistent pipeline kernel.
#pragma once
#include "common.cuh"

// TB_: B is stored transposed, [N x K] row-major (a bmm with trans_b: Q K^T); it is staged as BN
// rows of BK (+8) and read with ldmatrix without .trans.
// NV_: a product narrower than the tile (nerf's rgb_fc, N = 3 padded to 8) stores only NV_
// 8-column vectors a row; its epilogue spreads those over the threads, where the tile's BN / 8 a
// row left 15 of 16 threads idle and the rest applying 64 sigmoids each in turn (30 us of 53 on
// rgb_fc: bench/narrow_gemm_probe.py).
template <int BM_, int BN_, int BK_, int STAGES_, int NB_, bool TB_ = false, int NV_ = 0>
struct GemmCfg {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_, NB = NB_;
    static constexpr bool TB = TB_;
    static constexpr int NV = NV_ > 0 ? NV_ : BN_ / 8;          // 8-column vectors a row stores
    static constexpr int THREADS = 256;
    static constexpr int WM = BM / 2, WN = BN / 4;
    static constexpr int MI = WM / 16, NI = WN / 8;
    static constexpr int A_LD = BK + 8, B_LD = TB ? BK + 8 : BN + 8;   // padded rows: no ldmatrix bank conflicts
    static constexpr int A_STAGE = BM * A_LD, B_STAGE = (TB ? BN : BK) * B_LD;  // elements
    static constexpr int STAGE = A_STAGE + NB * B_STAGE;
    static constexpr int PIPE_BYTES = STAGES * STAGE * 2;
    static constexpr int C_LD = BN + 8;                          // fp32 staging row stride
    static constexpr int STAGE_C_BYTES = WM * C_LD * 4 * NB;     // one warp-row of accumulators
    static constexpr int SMEM_BYTES = PIPE_BYTES > STAGE_C_BYTES ? PIPE_BYTES : STAGE_C_BYTES;
    static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0, "tile too small for 8 warps");
    static_assert((BM * BK / 8) % THREADS == 0 && (BK * BN / 8) % THREADS == 0, "tile/threads");
};

// One team (256 threads) computes the output tile at columns [n0, n0+BN) of a row-block.
// A points at row 0 of the row-block (lda elements per row); rows >= rows_valid are zero-filled
// and not stored. K-tiles [k_begin/BK, ceil(k_end/BK)) are accumulated. `hook(kt)` is called by
// every thread before the barrier that precedes loading k-tile kt (a split-K consumer waits there).
template <class Cfg, class Epi, class Hook>
KDSE_INLINE void gemm_tile(const elem_t* __restrict__ A, int lda, int rows_valid,
                           const elem_t* __restrict__ B0, const elem_t* __restrict__ B1, int ldb,
                           int N, int k_begin, int k_end, int n0,
                           const Epi& epi, const Hook& hook, unsigned char* smem_raw, const Team& tm) {
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, NB = Cfg::NB;
    constexpr int MI = Cfg::MI, NI = Cfg::NI, WM = Cfg::WM, WN = Cfg::WN;
    elem_t* smem = reinterpret_cast<elem_t*>(smem_raw);
    const int tid = tm.tid, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int kt0 = k_begin / BK, kt1 = (k_end + BK - 1) / BK, nkt = kt1 - kt0;

    float acc[NB][MI][NI][4];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[b][i][j][q] = 0.f;

    auto load_stage = [&](int stage, int kt) {
        elem_t* As = smem + stage * Cfg::STAGE;
        const int kb = kt * BK;
#pragma unroll
        for (int i = 0; i < BM * BK / 8 / Cfg::THREADS; ++i) {
            const int c = tid + i * Cfg::THREADS;
            const int r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
            const bool ok = r < rows_valid && kb + kc + 8 <= k_end;
            const elem_t* src = ok ? A + (size_t)r * lda + kb + kc : A;
            cp_async16(As + r * Cfg::A_LD + kc, src, ok);
        }
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const elem_t* B = b == 0 ? B0 : B1;
            elem_t* Bs = As + Cfg::A_STAGE + b * Cfg::B_STAGE;
#pragma unroll
            for (int i = 0; i < BK * BN / 8 / Cfg::THREADS; ++i) {
                const int c = tid + i * Cfg::THREADS;
                if constexpr (Cfg::TB) {
                    const int nr = c / (BK / 8), kc = (c % (BK / 8)) * 8;
                    const bool ok = n0 + nr < N && kb + kc + 8 <= k_end;
                    const elem_t* src = ok ? B + (size_t)(n0 + nr) * ldb + kb + kc : B;
                    cp_async16(Bs + nr * Cfg::B_LD + kc, src, ok);
                } else {
                    const int kr = c / (BN / 8), nc = (c % (BN / 8)) * 8;
                    const bool ok = kb + kr < k_end && n0 + nc + 8 <= N;
                    const elem_t* src = ok ? B + (size_t)(kb + kr) * ldb + n0 + nc : B;
                    cp_async16(Bs + kr * Cfg::B_LD + nc, src, ok);
                }
            }
        }
    };

    // prologue: STAGES-1 k-tiles in flight
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < nkt) hook(kt0 + s);
    team_sync(tm);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nkt) load_stage(s, kt0 + s);
        cp_async_commit();
    }

    for (int i = 0; i < nkt; ++i) {
        cp_async_wait<STAGES - 2>();
        const int pf = i + STAGES - 1;
        if (pf < nkt) hook(kt0 + pf);
        team_sync(tm);
        if (pf < nkt) load_stage(pf % STAGES, kt0 + pf);
        cp_async_commit();

        const elem_t* As = smem + (i % STAGES) * Cfg::STAGE;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            u32 af[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                ldmatrix_x4(af[mi], As + (wm * WM + mi * 16 + (lane & 15)) * Cfg::A_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const elem_t* Bs = As + Cfg::A_STAGE + b * Cfg::B_STAGE;
                u32 bf[NI][2];
#pragma unroll
                for (int nj = 0; nj < NI / 2; ++nj) {
                    u32 r[4];
                    if constexpr (Cfg::TB)   // [n][k] rows: matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15)
                        ldmatrix_x4(r, Bs + (wn * WN + nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * Cfg::B_LD
                                           + kk * 16 + ((lane >> 3) & 1) * 8);
                    else
                        ldmatrix_x4_trans(r, Bs + (kk * 16 + (lane & 15)) * Cfg::B_LD + wn * WN + nj * 16 + (lane >> 4) * 8);
                    bf[2 * nj][0] = r[0]; bf[2 * nj][1] = r[1];
                    bf[2 * nj + 1][0] = r[2]; bf[2 * nj + 1][1] = r[3];
                }
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
                        Mma<elem_t>::run(acc[b][mi][ni], af[mi], bf[ni][0], bf[ni][1]);
            }
        }
    }
    cp_async_wait<0>();
    team_sync(tm);
    hook.before_epilogue(tm);     // a producer's output slot free (queue.cuh SlotWait)

    // epilogue: one warp-row (WM rows) at a time through fp32 shared memory, then 8-wide vectors
    float* cs = reinterpret_cast<float*>(smem_raw);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        if (wm == half) {
#pragma unroll
            for (int b = 0; b < NB; ++b)
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int r = mi * 16 + g + h * 8, c = wn * WN + ni * 8 + t * 2;
                            float2 v = make_float2(acc[b][mi][ni][2 * h], acc[b][mi][ni][2 * h + 1]);
                            *reinterpret_cast<float2*>(cs + (b * WM + r) * Cfg::C_LD + c) = v;
                        }
        }
        team_sync(tm);
        constexpr int VEC = WM * Cfg::NV;
        for (int e = tid; e < VEC; e += Cfg::THREADS) {
            const int r = e / Cfg::NV, c = (e % Cfg::NV) * 8;
            const int row = half * WM + r, col = n0 + c;
            if (row < rows_valid && col < N) {
                float v[NB][8];
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    const float4 x = *reinterpret_cast<const float4*>(cs + (b * WM + r) * Cfg::C_LD + c);
                    const float4 y = *reinterpret_cast<const float4*>(cs + (b * WM + r) * Cfg::C_LD + c + 4);
                    v[b][0] = x.x; v[b][1] = x.y; v[b][2] = x.z; v[b][3] = x.w;
                    v[b][4] = y.x; v[b][5] = y.y; v[b][6] = y.z; v[b][7] = y.w;
                }
                epi.apply(row, col, v);
            }
        }
        team_sync(tm);
    }
}

// Split-K partial epilogue: fp32 partial sums to a workspace [splits][NB][M][N].
template <int NB>
struct PartialEpi {
    float* ws; int M, N, m0, split;
    KDSE_INLINE void apply(int r, int c, const float (&v)[NB][8]) const {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            float* p = ws + (((size_t)split * NB + b) * M + m0 + r) * N + c;
            reinterpret_cast<float4*>(p)[0] = make_float4(v[b][0], v[b][1], v[b][2], v[b][3]);
            reinterpret_cast<float4*>(p)[1] = make_float4(v[b][4], v[b][5], v[b][6], v[b][7]);
        }
    }
};

// Split-K reduction: sums the partials of vector e (8 columns) and applies the epilogue.
template <int NB, class Epi>
KDSE_INLINE void splitk_reduce_vec(const float* __restrict__ ws, int splits, int M, int N, size_t e,
                                   const Epi& epi) {
    const int nv = N / 8;
    const int r = (int)(e / nv), c = (int)(e % nv) * 8;
    float v[NB][8];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int q = 0; q < 8; ++q) v[b][q] = 0.f;
    for (int s = 0; s < splits; ++s)
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            const float* p = ws + (((size_t)s * NB + b) * M + r) * N + c;
            const float4 x = __ldcg(reinterpret_cast<const float4*>(p));
            const float4 y = __ldcg(reinterpret_cast<const float4*>(p) + 1);
            v[b][0] += x.x; v[b][1] += x.y; v[b][2] += x.z; v[b][3] += x.w;
            v[b][4] += y.x; v[b][5] += y.y; v[b][6] += y.z; v[b][7] += y.w;
        }
    epi.apply(r, c, v);
}

// Split-K fixup of one output tile inside the persistent kernel: the team that finished a
// tile's last K range sums the `splits` fp32 partials (workspace planes [split][NB][bm][N], L2
// reads) and applies the epilogue to rows [0, rows_valid) x columns [n0, n0 + bn).
template <int NB, class Epi>
KDSE_INLINE void splitk_fixup(const float* __restrict__ ws, int splits, int bm, int N, int rows_valid,
                              int n0, int bn, const Epi& epi, const Team& tm) {
    const int nv = bn / 8;
    for (int e = tm.tid; e < rows_valid * nv; e += TEAM_THREADS) {
        const int r = e / nv, c = n0 + (e % nv) * 8;
        if (c >= N) continue;
        float v[NB][8];
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int q = 0; q < 8; ++q) v[b][q] = 0.f;
        for (int s = 0; s < splits; ++s)
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const float* p = ws + (((size_t)s * NB + b) * bm + r) * N + c;
                const float4 x = __ldcg(reinterpret_cast<const float4*>(p));
                const float4 y = __ldcg(reinterpret_cast<const float4*>(p) + 1);
                v[b][0] += x.x; v[b][1] += x.y; v[b][2] += x.z; v[b][3] += x.w;
                v[b][4] += y.x; v[b][5] += y.y; v[b][6] += y.z; v[b][7] += y.w;
            }
        epi.apply(r, c, v);
    }
}
