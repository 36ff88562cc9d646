"""Is it the hardware or the compiled code? One-stage persistent GEMMs whose workers each keep
fixed column tiles (workers <= column tiles) ran ~10% slower per item than with one worker more
(bench/sm_sweep_probe.sh: 4096^3 on 16 SMs 105.3 us per item against 95.4 on 17). The two
sources differ only in the item bookkeeping: with fewer workers than items per row-block the
generator leaves out the wrap of the item offset, which cannot trigger, and nvcc allocates the
registers differently (no 16-byte spill). This times each case as generated and with the
source patched to the other form (the wrap added where it is a no-op). Since harness 8 the
generator emits the wrap itself, so the default cases compare a source with itself (the
harness-7 run is results/validation/h100/codegen_probe/codegen_probe.json); --form adds other
transforms (a live pointer, the tile as a called function, another fragment order).

    here:    python bench/codegen_probe.py --precompile [--case M,N,K@SMS ...]
    device:  python3 bench/codegen_probe.py --out $OUT [--runs 15]   # -> codegen_probe.json
    (--case KIND:M,N,K@SMS and --form NAME for other cases and source transforms; each row gets
    its GEMM main loops' scores, bench/sass_loops.py)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

DEFAULT_CASES = ["4096,4096,4096@16", "4096,4096,4096@8", "4096,2048,4096@8", "4096,8192,4096@32", "4096,4096,4096@17"]


def with_wrap(src: str) -> str:
    """The source with the item offset's wrap where the generator left it out (a no-op there:
    the offset never reaches the row-block's item count)."""
    for sid, n in re.findall(r"// step (\d+): [^\n]*?, (\d+) items per row-block", src):
        wrap = f"if (nx_{sid} >= {n}) {{{{ rb_{sid} {{op}}= nx_{sid} / {n}; nx_{sid} %= {n}; }}}}"
        src = re.sub(rf"(int nx_{sid} = c, rb_{sid} = 0;)(?! if)", lambda m: m.group(1) + " " + wrap.format(op=""), src)
        src = re.sub(rf"(\+\+rb_{sid};)(?! if)", lambda m: m.group(1) + " " + wrap.format(op="+"), src)
    return src


def with_live_pointer(src: str) -> str:
    """The source with one more pointer kept live across every GEMM tile's main loop (loaded
    before the tile, compared after it: a branch that is never taken), as an epilogue's bias or
    residual pointer is: does that alone move nvcc's schedule of the loop, and the tile's time?"""
    return re.sub(r"(\n(\s*)gemm_tile<[^;]*;)",
                  lambda m: (f"\n{m.group(2)}const void* kdse_live = bufs[0];" + m.group(1)
                             + f"\n{m.group(2)}if (kdse_live == (const void*)ctrl) ctrl[1] = 7u;"), src)


def with_noinline(src: str) -> str:
    """The source with the GEMM tile compiled as a called function (__noinline__): its main
    loop's registers allocated apart from the stage code around the call."""
    from kitsune_dse.validate.runtime import expand_includes
    out = expand_includes(src)
    assert "KDSE_INLINE void gemm_tile(" in out
    return out.replace("KDSE_INLINE void gemm_tile(", "__device__ __noinline__ void gemm_tile(")


# the main loop's inner k-step as gemm.cuh has it (all A fragments, then each B's and the MMAs)
# and with B's fragments first and A's one row of warp tiles at a time: 12 fragment registers
# live instead of 24 for one product (a candidate for register headroom)
_KSTEP_ALL_A = """            u32 af[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                ldmatrix_x4(af[mi], As + (wm * WM + mi * 16 + (lane & 15)) * Cfg::A_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const elem_t* Bs = As + Cfg::A_STAGE + b * Cfg::B_STAGE;
                u32 bf[NI][2];"""
_KSTEP_B_FIRST = """            u32 bfs[NB][NI][2];
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const elem_t* Bs = As + Cfg::A_STAGE + b * Cfg::B_STAGE;
                u32 (&bf)[NI][2] = bfs[b];"""
_MMA_ALL_A = """#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
                        Mma<elem_t>::run(acc[b][mi][ni], af[mi], bf[ni][0], bf[ni][1]);
            }"""
_MMA_A_ROWS = """            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                u32 af[4];
                ldmatrix_x4(af, As + (wm * WM + mi * 16 + (lane & 15)) * Cfg::A_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int b = 0; b < NB; ++b)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
                        Mma<elem_t>::run(acc[b][mi][ni], af, bfs[b][ni][0], bfs[b][ni][1]);
            }"""


def with_a_rows(src: str) -> str:
    """The source with the main loop's k-step loading B's fragments first and A's one row of
    warp tiles at a time (the same MMAs in another order, fewer fragment registers live)."""
    from kitsune_dse.validate.runtime import expand_includes
    out = expand_includes(src)
    assert _KSTEP_ALL_A in out and _MMA_ALL_A in out
    return out.replace(_KSTEP_ALL_A, _KSTEP_B_FIRST).replace(_MMA_ALL_A, _MMA_A_ROWS)


_U32_HELPERS = """
KDSE_INLINE void ldmatrix_x4_u(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
KDSE_INLINE void ldmatrix_x4_trans_u(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
"""


def with_u32_lds(src: str) -> str:
    """The source with the main loop's ldmatrix addresses as 32-bit shared-memory offsets from
    a base computed once per tile (not generic 64-bit pointers converted at every load): fewer
    registers live across the loop."""
    from kitsune_dse.validate.runtime import expand_includes
    out = expand_includes(src)
    loop = "    for (int i = 0; i < nkt; ++i) {\n"
    a_stage = "        const elem_t* As = smem + (i % STAGES) * Cfg::STAGE;\n"
    a_load = "ldmatrix_x4(af[mi], As + (wm * WM + mi * 16 + (lane & 15)) * Cfg::A_LD + kk * 16 + (lane >> 4) * 8);"
    b_load = ("ldmatrix_x4_trans(r, Bs + (kk * 16 + (lane & 15)) * Cfg::B_LD + wn * WN + nj * 16 + (lane >> 4) * 8);")
    for t in (loop, a_stage, a_load, b_load, "template <class Cfg, class Epi, class Hook>"):
        assert out.count(t) == 1, t
    out = out.replace("template <class Cfg, class Epi, class Hook>", _U32_HELPERS + "template <class Cfg, class Epi, class Hook>")
    out = out.replace(loop, "    const u32 kdse_sbase = smem_u32(smem);\n"
                      "    const u32 kdse_aoff = ((wm * WM + (lane & 15)) * Cfg::A_LD + (lane >> 4) * 8) * 2;\n"
                      "    const u32 kdse_boff = ((lane & 15) * Cfg::B_LD + wn * WN + (lane >> 4) * 8) * 2;\n" + loop)
    out = out.replace(a_stage, a_stage + "        const u32 kdse_as = kdse_sbase + (u32)((i % STAGES) * Cfg::STAGE * 2);\n")
    out = out.replace(a_load, "ldmatrix_x4_u(af[mi], kdse_as + kdse_aoff + (u32)((mi * 16 * Cfg::A_LD + kk * 16) * 2));")
    out = out.replace(b_load, "ldmatrix_x4_trans_u(r, kdse_as + (u32)((Cfg::A_STAGE + b * Cfg::B_STAGE) * 2) + kdse_boff"
                              " + (u32)((kk * 16 * Cfg::B_LD + nj * 16) * 2));")
    return out


FORMS = {"wrap added": with_wrap,
         "u32 lds": with_u32_lds,
         "u32 lds + live pointer": lambda s: with_u32_lds(with_live_pointer(s)),
         "live pointer": with_live_pointer,
         "noinline": with_noinline,
         "noinline + live pointer": lambda s: with_noinline(with_live_pointer(s)),
         "a rows": with_a_rows,
         "a rows + live pointer": lambda s: with_a_rows(with_live_pointer(s))}


def variants(info, cases, forms=("wrap added",)):
    from gemm_probe import parse_cases, variants as gemm_variants

    from kitsune_dse.validate.runtime import PipelineVariant

    def transformed(form):
        class Transformed(PipelineVariant):
            def build(self):
                super().build()
                self.source = FORMS[form](self.source)
                return self.source
        return Transformed

    out = []
    for (series, dims, sms, flush, reg, v), case in zip(gemm_variants(info, parse_cases(cases)), cases):
        kind = case.rpartition(":")[0] or "matmul"
        out.append((dims, sms, "as generated", reg, v, kind))
        out += [(dims, sms, form, reg, transformed(form)("plan", reg, v.tensors, info, v.plan_region, 1.0), kind)
                for form in forms]
    return out


def precompile(cases, forms) -> None:
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    for dims, sms, form, _, v, kind in variants(info, cases, forms):
        src = v.build()
        print(kind, dims, sms, form, compile_one(src, "sm_90", ROOT / "bench/.cubin_cache")[:160], flush=True)


def measure(out: Path, runs: int, cases, forms) -> None:
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import cache_dirs, gpu_info, source_key
    from rowop_probe import save_rows
    from sass_loops import loops_of
    info, env = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flusher = L2Flusher()
    rows = []
    with stream:
        for dims, sms, form, reg, v, kind in variants(info, cases, forms):
            m, n, k = dims
            row = {"kind": kind, "dims": list(dims), "sms": sms, "form": form}
            v.prepare()
            chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
            t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flusher, poison_every=False)
            items = (m // 128) * -(-n // 128)
            row.update(time_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, correct=chk["correct"],
                       item_s_per_worker=t.median_s / max(1.0, items / (2 * sms)),
                       key=source_key(v.source, info.arch))
            cubin = next((d / f"{row['key']}.cubin" for d in cache_dirs() if (d / f"{row['key']}.cubin").exists()), None)
            if cubin is not None:
                sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
                row["sass_lines"] = sass.count("\n")
                row["loop_scores"] = [x["hmma_before_ldsm"] for x in loops_of(sass) if x["hmma"] >= 64]
            rows.append(row)
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    save_rows(str(out), "codegen_probe.json", env, runs, rows, echo=False)
    print(f"{'kind':>10s} {'m x n x k':>16s} {'SMs':>4s} {'form':>13s} {'time us':>9s} {'us/item/worker':>15s} loop scores")
    for r in rows:
        print(f"{r['kind']:>10s} {'x'.join(map(str, r['dims'])):>16s} {r['sms']:4d} {r['form']:>13s} {r['time_s'] * 1e6:9.1f} "
              f"{r['item_s_per_worker'] * 1e6:15.2f} {r.get('loop_scores')} {'' if r['correct'] else 'WRONG'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--case", action="append", default=[], help="[KIND:]M,N,K@SMS (gemm_probe's cases)")
    ap.add_argument("--form", action="append", default=[], choices=sorted(FORMS),
                    help="source transforms to time beside the generated source (default: wrap added)")
    a = ap.parse_args()
    cases = a.case or DEFAULT_CASES
    forms = tuple(a.form) or ("wrap added",)
    if a.precompile:
        precompile(cases, forms)
    else:
        measure(Path(a.out), a.runs, cases, forms)


if __name__ == "__main__":
    main()
