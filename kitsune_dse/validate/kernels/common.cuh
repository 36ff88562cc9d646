// kitsune-dse validation kernels: common helpers (types, vector memory access, PTX wrappers).
// Compiled by NVRTC through cupy.RawModule; no standard-library headers.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef KDSE_ELEM
#define KDSE_ELEM __half
#endif
typedef KDSE_ELEM elem_t;

#define KDSE_INLINE __device__ __forceinline__
#define KDSE_NEG_INF (__int_as_float(0xff800000))

// ---- element conversions -----------------------------------------------------------------------
KDSE_INLINE float to_f(__half x) { return __half2float(x); }
KDSE_INLINE float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> KDSE_INLINE T from_f(float x);
template <> KDSE_INLINE __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> KDSE_INLINE __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// two elements packed in 32 bits <-> two floats
template <typename T> KDSE_INLINE void unpack2(u32 v, float& a, float& b);
template <> KDSE_INLINE void unpack2<__half>(u32 v, float& a, float& b) {
    __half2 h = *reinterpret_cast<__half2*>(&v);
    float2 f = __half22float2(h); a = f.x; b = f.y;
}
template <> KDSE_INLINE void unpack2<__nv_bfloat16>(u32 v, float& a, float& b) {
    a = __uint_as_float(v << 16); b = __uint_as_float(v & 0xffff0000u);
}
template <typename T> KDSE_INLINE u32 pack2(float a, float b);
template <> KDSE_INLINE u32 pack2<__half>(float a, float b) {
    __half2 h = __floats2half2_rn(a, b); return *reinterpret_cast<u32*>(&h);
}
template <> KDSE_INLINE u32 pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b); return *reinterpret_cast<u32*>(&h);
}

// ---- 16-byte (8-element) and 4-byte (2-element) loads and stores -------------------------------
// "nc": read-only path for region inputs and weights; "cg": L2 only, for ring-queue slots written
// by other CTAs during the same launch (L1 is not coherent).
KDSE_INLINE uint4 ld16_nc(const void* p) {
    uint4 v; asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v;
}
KDSE_INLINE uint4 ld16_cg(const void* p) {
    uint4 v; asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v;
}
KDSE_INLINE u32 ld4_nc(const void* p) {
    u32 v; asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p)); return v;
}
KDSE_INLINE u32 ld4_cg(const void* p) {
    u32 v; asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p)); return v;
}
KDSE_INLINE void st16(void* p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
KDSE_INLINE void st4(void* p, u32 v) { asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory"); }

template <typename T> KDSE_INLINE void unpack8(uint4 v, float (&f)[8]) {
    unpack2<T>(v.x, f[0], f[1]); unpack2<T>(v.y, f[2], f[3]);
    unpack2<T>(v.z, f[4], f[5]); unpack2<T>(v.w, f[6], f[7]);
}
template <typename T> KDSE_INLINE uint4 pack8(const float (&f)[8]) {
    uint4 v; v.x = pack2<T>(f[0], f[1]); v.y = pack2<T>(f[2], f[3]);
    v.z = pack2<T>(f[4], f[5]); v.w = pack2<T>(f[6], f[7]); return v;
}
// load 8 elements as floats; CG selects the L2-only path
template <bool CG> KDSE_INLINE void load8(const elem_t* p, float (&f)[8]) {
    uint4 v = CG ? ld16_cg(p) : ld16_nc(p); unpack8<elem_t>(v, f);
}
template <bool CG> KDSE_INLINE void load2(const elem_t* p, float& a, float& b) {
    u32 v = CG ? ld4_cg(p) : ld4_nc(p); unpack2<elem_t>(v, a, b);
}
KDSE_INLINE void store8(elem_t* p, const float (&f)[8]) { st16(p, pack8<elem_t>(f)); }
KDSE_INLINE void store2(elem_t* p, float a, float b) { st4(p, pack2<elem_t>(a, b)); }

// ---- activations (the reference in kitsune_dse/validate/reference.py uses the same forms) -------
KDSE_INLINE float act_gelu(float x) {  // tanh form
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return 0.5f * x * (1.f + tanhf(k0 * (x + k1 * x * x * x)));
}
KDSE_INLINE float act_silu(float x) { return x / (1.f + __expf(-x)); }
KDSE_INLINE float act_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
KDSE_INLINE float act_relu(float x) { return fmaxf(x, 0.f); }

// ---- PTX wrappers ---------------------------------------------------------------------------------
KDSE_INLINE u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte async copy global -> shared, L2 only (.cg); src_bytes 0 zero-fills (predicated off)
KDSE_INLINE void cp_async16(void* smem, const void* gmem, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(smem)), "l"(gmem), "r"(n) : "memory");
}
KDSE_INLINE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> KDSE_INLINE void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

KDSE_INLINE void ldmatrix_x4(u32 (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(smem)));
}
KDSE_INLINE void ldmatrix_x4_trans(u32 (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(smem)));
}

template <typename T> struct Mma;
template <> struct Mma<__half> {
    static KDSE_INLINE void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma<__nv_bfloat16> {
    static KDSE_INLINE void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

KDSE_INLINE u32 smid() { u32 r; asm volatile("mov.u32 %0, %%smid;" : "=r"(r)); return r; }
KDSE_INLINE u64 globaltimer() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

// ---- warp reductions -------------------------------------------------------------------------------
KDSE_INLINE float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
KDSE_INLINE float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- teams: 256 threads (8 warps) that work on one tile together ---------------------------------
// A standalone kernel's CTA is one team; the persistent kernel runs two teams per CTA (512
// threads), each with its own named barrier and half of the shared memory, so that one SM keeps
// two tiles in flight (what two CTAs per SM give a standalone kernel).
#define TEAM_THREADS 256
struct Team {
    int tid;    // thread index within the team
    int bar;    // named barrier id (1 or 2; 0 is __syncthreads)
    int rbar;   // first named barrier id of the row groups of this team (4 ids)
};
KDSE_INLINE void named_barrier(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(nthreads) : "memory");
}
KDSE_INLINE void team_sync(const Team& tm) { named_barrier(tm.bar, TEAM_THREADS); }
// barrier of the team that returns the AND of pred over its threads
KDSE_INLINE int team_and(const Team& tm, int pred) {
    int r;
    asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.s32 p, %1, 0;\n\tbar.red.and.pred q, %2, %3, p;\n\tselp.s32 %0, 1, 0, q;\n\t}"
                 : "=r"(r) : "r"(pred), "r"(tm.bar), "n"(TEAM_THREADS) : "memory");
    return r;
}
KDSE_INLINE int team_or(const Team& tm, int pred) {
    int r;
    asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.s32 p, %1, 0;\n\tbar.red.or.pred q, %2, %3, p;\n\tselp.s32 %0, 1, 0, q;\n\t}"
                 : "=r"(r) : "r"(pred), "r"(tm.bar), "n"(TEAM_THREADS) : "memory");
    return r;
}
KDSE_INLINE Team solo_team() { Team t; t.tid = threadIdx.x; t.bar = 1; t.rbar = 3; return t; }

// A hook the GEMM main loop calls (by every thread, before the barrier that precedes loading
// k-tile kt): the pipeline's split-K consumer waits there for the column slab holding kt.
struct NoWait {
    KDSE_INLINE void operator()(int kt) const {}
    KDSE_INLINE void before_epilogue(const Team&) const {}
    KDSE_INLINE bool failed() const { return false; }
};
