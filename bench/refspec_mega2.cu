// A one-launch pass of SmolLM2-135M with two grid barriers a layer, not five (issue 40's next step).
//
// refspec_mega.cu walks five phases a layer, each ended by a grid barrier: ~2-6 µs a phase, mostly
// the barrier and the dependent L2 round trips around it, so that structure floors near 300 µs + the
// head. Here the grid is clusters of 8 blocks (8 warps each) and a layer is two phases:
//
//   attention block (a cluster per query head, 9 clusters): x = bf(x_mid + bf(Σ down partials)),
//     RMSNorm, the head's Q rows and its group's K and V rows (3 rows a warp), pushed into every
//     block of the cluster through distributed shared memory; cluster barrier; RoPE; attention a
//     warp per (row, 32-slot chunk), each chunk's max, sum and P·V pushed to every block; cluster
//     barrier; every block combines the chunks in chunk order and computes its 72 outputs of
//     o_proj over the head's 64 columns: a per-head partial sum (fp32) to global memory.
//   MLP block (every cluster, a slice of the 1536 intermediate columns each): x_mid = bf(x +
//     bf(Σ_heads o_proj partials)), RMSNorm, the slice's gate and up rows pushed to every block;
//     cluster barrier; SiLU·up; each block's 72 outputs of down over the slice: a per-cluster
//     partial sum (fp32) to global memory.
//
// The grid barrier sits only where all of a layer's heads (or slices) meet. Partial sums are added
// in a fixed order (heads 0..8, slices 0..n) and rounded once, as a projection's fp32 sum is;
// every other rounding point is refspec's (HF Llama in bf16). Weights for the next phase are loaded
// into registers between a block's arrival at the grid barrier and its wait, as in refspec_mega.cu.
// A chain row's bits do not depend on the pass's row count (every reduction's order is fixed by the
// row and position alone), and every run gives the same bits.
//
// Variants, each a -D macro: PK=N (partial sums a thread loads at once, 8 by default), FENCE (a
// __threadfence before the barrier's arrival). Tried and dropped (git history, docs/BENCHMARKS.md):
// K/V or weights loaded (into registers, or by cp.async into shared memory) before a barrier's wait
// or a phase ahead, a flag a block as the grid barrier, partial sums carrying their layer in each
// word in place of the barrier (LL), an L2 prefetch of the head.
//
// Built and timed by bench/refspec_mega.py (--kernel mega2); not part of refspec.

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "mega_common.cuh"

namespace cg = cooperative_groups;

constexpr int H = 576, INTER = 1536, NH = 9, NKV = 3, D = 64, GROUP = NH / NKV;
constexpr int WARPS = 8, THREADS = WARPS * 32, RMAX = 16;
constexpr int CL = 8, CW = CL * WARPS;  // blocks and warps a cluster
constexpr int OUTS = H / CL;            // 72 outputs of o_proj and down a block, 9 a warp
constexpr int ICMAX = 128;              // intermediate columns a cluster at most (>= 12 clusters)
constexpr int GU_ROWS = 2 * ICMAX / CW; // gate/up rows a warp at most
constexpr int MAX_ITEMS = 192;          // (row, chunk) attention items a pass at most (128 at one row)
constexpr int PART = D + 2;             // a chunk's max, sum and P·V
#ifndef PK
#define PK 8                            // partial sums a thread loads at once in `stage`
#endif

struct Params {  // refspec_mega.cu's Params, then this pass's own buffers
  const __nv_bfloat16 *embed, *head, *norm, *ln1, *wqkv, *wo, *ln2, *wgu, *wd;
  const float *cos, *sin;
  __nv_bfloat16 *kc, *vc;  // [layers, NKV, S, D]
  const int *tokens, *posn, *start;
  __nv_bfloat16 *x, *q_unused, *o_unused, *h_unused;
  unsigned long long *best;
  long long *out;
  unsigned *bar;
  unsigned long long *timeline;
  float *part_unused;
  unsigned *acnt_unused;
  int R, L, S, V;
  float eps, qk_scale;
  float *po, *pd;          // [NH, R, H] o_proj partials; [clusters, R, H] down partials
  __nv_bfloat16 *xa, *xb;  // the residual stream entering a layer's attention block (xa), its MLP block (xb)
  int* err;                // 1: the pass did not run (start + R > S, or too many attention items)
};

namespace {

// A warp's 9 output rows of a narrow GEMV (o_proj over a head's 64 columns, down over a slice of
// the intermediate columns): 4 lanes a row, a lane up to U 16-byte chunks (chunk sub + 4u of n8).
// Rows 0..7 in pass 0 (lane group g = row g), row 8 in pass 1 (group 0).
template <int U>
struct Slice {
  uint4 w[2][U];
  __device__ __forceinline__ void load(const __nv_bfloat16* row0, size_t stride, int n8, int lane, bool on = true) {
    const int g = lane / 4, sub = lane % 4;
#pragma unroll
    for (int ps = 0; ps < 2; ps++) {
      const int i = ps == 0 ? g : 8;
      const bool live = on && (ps == 0 || g == 0);
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = sub + 4 * u;
        if (live && c < n8) {
          const uint4* s = reinterpret_cast<const uint4*>(row0 + (size_t)i * stride) + c;
          asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                       : "=r"(w[ps][u].x), "=r"(w[ps][u].y), "=r"(w[ps][u].z), "=r"(w[ps][u].w) : "l"(s));
        } else {
          w[ps][u] = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
  // dst[r * H + out0 + i] = row i · xs[r] (xs: [R, ld] floats), for the warp's 9 rows and R rows
  __device__ __forceinline__ void run(const float* xs, int ld, int n8, int R, float* dst, int out0, int lane) const {
    const int g = lane / 4, sub = lane % 4;
#pragma unroll
    for (int ps = 0; ps < 2; ps++) {
      for (int r = 0; r < R; r++) {
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int c = sub + 4 * u;
          if (c < n8) acc = dot8(w[ps][u], xs + (size_t)r * ld + 8 * c, acc);
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (sub == 0 && (ps == 0 || g == 0)) dst[(size_t)r * H + out0 + (ps == 0 ? g : 8)] = acc;
      }
    }
  }
};

template <int RM, int K>  // RM: the kernel's rows at most (1: the one-row build)
__device__ __forceinline__ float dots(const Row<K>& w, const float* xs, int R, int lane) {
  if constexpr (RM == 1) return warp_sum(w.dot(xs, lane));
  if (R == 1) return warp_sum(w.dot(xs, lane));
  float v[RMAX];
#pragma unroll
  for (int r = 0; r < RMAX; r++) v[r] = r < R ? w.dot(xs + r * K, lane) : 0.f;
  return reduce16(v, lane);
}


// -- the grid barrier: a counter that only grows; barrier k waits for k · gridDim.x arrivals
__device__ __forceinline__ void arrive(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
#ifdef FENCE
    __threadfence();
#endif
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
  }
}
__device__ __forceinline__ void wait(unsigned* bar, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

// xs[r] = the residual stream's row r as floats: bf(base[r] + bf(Σ_k parts[k][r])) (the sum in k's
// order; no parts: base[r]), written as bf16 to keep[r] too when keep is given; then, with ln,
// HF's RMSNorm of each row in place: bf(ln · bf(x · rstd)).
__device__ void norm_rows(float* xs, const __nv_bfloat16* ln, int R, float eps);

__device__ void stage(float* xs, const __nv_bfloat16* base, const int* tok, const float* parts, int nparts,
                      __nv_bfloat16* keep, const __nv_bfloat16* ln, int R, float eps) {
  for (int i = threadIdx.x; i < R * H / 4; i += THREADS) {
    const int r = i / (H / 4), n = 4 * (i % (H / 4));
    const __nv_bfloat16* src = tok != nullptr ? base + (size_t)tok[r] * H + n : base + (size_t)r * H + n;
    uint2 u = tok != nullptr ? *reinterpret_cast<const uint2*>(src) : __ldcg(reinterpret_cast<const uint2*>(src));
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k0 = 0; k0 < nparts; k0 += PK) {  // PK partial sums' loads in flight, added in k's order
      float4 pk[PK];
#pragma unroll
      for (int k = 0; k < PK; k++)
        if (k0 + k < nparts) pk[k] = __ldcg(reinterpret_cast<const float4*>(parts + ((size_t)(k0 + k) * R + r) * H + n));
#pragma unroll
      for (int k = 0; k < PK; k++)
        if (k0 + k < nparts) s.x += pk[k].x, s.y += pk[k].y, s.z += pk[k].z, s.w += pk[k].w;
    }
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
    float2 b0 = __bfloat1622float2(b[0]), b1 = __bfloat1622float2(b[1]);
    float4 x = make_float4(b0.x, b0.y, b1.x, b1.y);
    if (nparts > 0) x = make_float4(bf(x.x + bf(s.x)), bf(x.y + bf(s.y)), bf(x.z + bf(s.z)), bf(x.w + bf(s.w)));
    *reinterpret_cast<float4*>(xs + (size_t)r * H + n) = x;
    if (keep != nullptr) {
      __nv_bfloat162 k0 = __floats2bfloat162_rn(x.x, x.y), k1 = __floats2bfloat162_rn(x.z, x.w);
      uint2 o;
      o.x = *reinterpret_cast<unsigned*>(&k0), o.y = *reinterpret_cast<unsigned*>(&k1);
      *reinterpret_cast<uint2*>(keep + (size_t)r * H + n) = o;
    }
  }
  __syncthreads();
  if (ln != nullptr) norm_rows(xs, ln, R, eps);
}

// HF's RMSNorm of each row of xs in place: bf(ln · bf(x · rstd))
__device__ void norm_rows(float* xs, const __nv_bfloat16* ln, int R, float eps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int N = H / 8, C = (N + 31) / 32;
  for (int r = warp; r < R; r += WARPS) {
    float v[C][8];
    uint4 g[C];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = lane + 32 * c;
      if (i < N) {
        g[c] = *reinterpret_cast<const uint4*>(ln + 8 * i);
        const float4 a = reinterpret_cast<const float4*>(xs + (size_t)r * H + 8 * i)[0];
        const float4 b = reinterpret_cast<const float4*>(xs + (size_t)r * H + 8 * i)[1];
        v[c][0] = a.x, v[c][1] = a.y, v[c][2] = a.z, v[c][3] = a.w;
        v[c][4] = b.x, v[c][5] = b.y, v[c][6] = b.z, v[c][7] = b.w;
#pragma unroll
        for (int e = 0; e < 8; e += 2) ss += v[c][e] * v[c][e] + v[c][e + 1] * v[c][e + 1];
      }
    }
    const float rstd = rsqrtf(warp_sum(ss) / H + eps);
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = lane + 32 * c;
      if (i < N) {
        const __nv_bfloat16* gw = reinterpret_cast<const __nv_bfloat16*>(&g[c]);
#pragma unroll
        for (int e = 0; e < 8; e++) xs[(size_t)r * H + 8 * i + e] = bf(__bfloat162float(gw[e]) * bf(v[c][e] * rstd));
      }
    }
  }
  __syncthreads();
}

// row r's value y of a GEMV (lanes 2r and 2r + 1 hold it; every lane with one row) to offset
// i + r · ld of every cluster block's copy of buf: the lanes holding a value share the stores
template <int RM>
__device__ __forceinline__ void push(cg::cluster_group& cl, float* buf, size_t i, size_t ld, float y, int R, int lane) {
  if (RM == 1 || R == 1) {
    if (lane < CL) cl.map_shared_rank(buf, lane)[i] = y;
  } else if ((lane >> 1) < R) {
#pragma unroll
    for (int k = 0; k < CL / 2; k++) cl.map_shared_rank(buf, (lane & 1) * (CL / 2) + k)[i + (lane >> 1) * ld] = y;
  }
}

__device__ __forceinline__ int chunks_of(int start, int r) { return (start + r + 32) / 32; }

// Shared memory of the RM-row build (floats)
template <int RM>
struct Smem {
  static constexpr int ITEMS = RM == 1 ? 128 : MAX_ITEMS;
  static constexpr int XS = 0, QKV = XS + RM * H, GU = QKV + 3 * RM * D, HS = GU + RM * 2 * ICMAX,
                       OS = HS + RM * ICMAX, PARTS = OS + RM * D, ROPE = PARTS + ITEMS * PART, FLOATS = ROPE + RM * D;
  static constexpr size_t BYTES = sizeof(float) * FLOATS;
};

__device__ __forceinline__ unsigned long long pack_best(float v, int idx) {
  unsigned u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned)(~idx);
}

// RM: the rows a pass has at most; the one-row build (RM = 1) is the decode step, with its
// registers to itself (the R-row reductions are not compiled into it)
template <int RM>
__global__ void __launch_bounds__(THREADS, 1) mega2_kernel(Params p) {
  cg::cluster_group cl = cg::this_cluster();
  extern __shared__ float smem[];
  const int R = RM == 1 ? 1 : p.R, start = *p.start;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rank = (int)cl.block_rank(), cid = blockIdx.x / CL, ncl = gridDim.x / CL;
  const int cw = rank * WARPS + warp;                      // the warp's index in its cluster
  const int IC = ((INTER + ncl - 1) / ncl + 7) / 8 * 8;    // intermediate columns a cluster
  const int j0 = cid * IC, icn = max(0, min(IC, INTER - j0));
  const int nslices = (INTER + IC - 1) / IC;              // clusters with columns: down partials
  using SM = Smem<RM>;
  constexpr int RS = RM;                   // rows of the shared buffers
  float* xs = smem + SM::XS;               // [R, H]
  float* qkv = smem + SM::QKV;             // [3, R, D]: q, k, v of the cluster's head (pushed)
  float* gu = smem + SM::GU;               // [R, 2 · ICMAX]: gate, then up (pushed)
  float* hs = smem + SM::HS;               // [R, ICMAX]
  float* os = smem + SM::OS;               // [R, D]: attention's output
  float* part = smem + SM::PARTS;          // [ITEMS, PART] (pushed)
  float* rope = smem + SM::ROPE;           // [R, D / 2, 2]: cos and sin of each row's position
  int items = 0;
  for (int r = 0; r < R; r++) items += chunks_of(start, r);
  if (start + R > p.S || items > SM::ITEMS) {  // every block sees the same and leaves before any barrier
    if (blockIdx.x == 0 && threadIdx.x == 0) *p.err = 1;
    return;
  }
  const bool attn = cid < NH;  // this cluster's head in the attention block
  const int hh = cid, kvh = hh / GROUP;
  unsigned nbar = 0;
  auto stamp = [&](int k) {
    if (p.timeline != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      p.timeline[k] = t;
    }
  };
  auto sync = [&]() { arrive(p.bar); nbar++; };
  auto done = [&]() { wait(p.bar, nbar * gridDim.x); stamp(nbar); };
  // with a timeline: block 0's SM clock at step k of layer l (timeline[64 + 16 l + k]); its clock at
  // the pass's start and end in timeline[62], [63] (the global timer's ns per clock from them)
  auto tick = [&](int l, int k) {
    if (p.timeline != nullptr && blockIdx.x == 0 && threadIdx.x == 0) p.timeline[64 + 16 * l + k] = clock64();
  };
  stamp(0);
  if (p.timeline != nullptr && blockIdx.x == 0 && threadIdx.x == 0) p.timeline[62] = clock64();
  for (int i = threadIdx.x; i < R * (D / 2); i += THREADS) {  // positions do not change within a pass
    const int pos = p.posn[i / (D / 2)], j = i % (D / 2);
    rope[2 * i] = p.cos[pos * (D / 2) + j], rope[2 * i + 1] = p.sin[pos * (D / 2) + j];
  }
  __syncthreads();

  Row<H> wq[3];  // the warp's Q, K and V rows (row cw of each)
  Slice<2> wo;   // the warp's 9 rows of o_proj over the head's columns
  auto load_attn = [&](int l) {  // (a cluster without a head loads nothing: zeros)
    const __nv_bfloat16* w = p.wqkv + (size_t)l * (NH + 2 * NKV) * D * H;
    wq[0].load(w + (size_t)(hh * D + cw) * H, lane, attn);
    wq[1].load(w + (size_t)(NH * D + kvh * D + cw) * H, lane, attn);
    wq[2].load(w + (size_t)((NH + NKV) * D + kvh * D + cw) * H, lane, attn);
    wo.load(p.wo + (size_t)l * H * H + (size_t)(rank * OUTS + warp * 9) * H + hh * D, H, D / 8, lane, attn);
  };
  Row<H> wg[GU_ROWS];  // the warp's gate/up rows: row cw + CW·i of the cluster's 2 · IC
  Slice<ICMAX / 32> wd;
  auto load_mlp = [&](int l) {
    const __nv_bfloat16* w = p.wgu + (size_t)l * 2 * INTER * H;
#pragma unroll
    for (int i = 0; i < GU_ROWS; i++) {
      const int k = cw + CW * i, j = k < IC ? k : k - IC;
      wg[i].load(w + (size_t)((k < IC ? 0 : INTER) + j0 + j) * H, lane, k < 2 * IC && j < icn);
    }
    wd.load(p.wd + (size_t)l * H * INTER + (size_t)(rank * OUTS + warp * 9) * INTER + j0, INTER, icn / 8, lane, icn > 0);
  };
  load_attn(0);

  for (int l = 0; l < p.L; l++) {
    __nv_bfloat16* kc = p.kc + (size_t)l * NKV * p.S * D;
    __nv_bfloat16* vc = p.vc + (size_t)l * NKV * p.S * D;
    // ---- the attention block: a cluster per head
    tick(l, 0);
    if (attn) {
      __nv_bfloat16* keep = blockIdx.x == 0 ? p.xa : nullptr;
      if (l == 0) stage(xs, p.embed, p.tokens, nullptr, 0, keep, p.ln1, R, p.eps);
      else stage(xs, p.xb, nullptr, p.pd, nslices, keep, p.ln1 + l * H, R, p.eps);
      tick(l, 1);
#pragma unroll
      for (int i = 0; i < 3; i++) push<RM>(cl, qkv, (size_t)i * RS * D + cw, D, bf(dots<RM>(wq[i], xs, R, lane)), R, lane);
      tick(l, 2);
      cl.sync();
      tick(l, 3);
      // RoPE on q and k (every block its own copy); the new K and V into the cache (one block a group)
      for (int i = threadIdx.x; i < 2 * R * (D / 2); i += THREADS) {
        const int which = i / (R * (D / 2)), r = i / (D / 2) % R, j = i % (D / 2);
        float* row = qkv + ((size_t)which * RS + r) * D;
        const float c = rope[2 * (r * (D / 2) + j)], s = rope[2 * (r * (D / 2) + j) + 1];
        const float lo = row[j], hi = row[j + 32];
        row[j] = bf(lo * c - hi * s), row[j + 32] = bf(hi * c + lo * s);
      }
      __syncthreads();
      tick(l, 4);
      if (hh % GROUP == 0 && rank == 0) {
        for (int i = threadIdx.x; i < 2 * R * D; i += THREADS) {
          const int which = i / (R * D), r = i / D % R, d = i % D;
          __nv_bfloat16* dst = (which == 0 ? kc : vc) + ((size_t)kvh * p.S + start + r) * D + d;
          *dst = __float2bfloat16(qkv[((size_t)(1 + which) * RS + r) * D + d]);
        }
      }
      // attention: a warp per (row, 32-slot chunk), a lane per slot; slots before `start` from the
      // cache (earlier passes wrote them), the pass's own from the pushed K and V
      const __nv_bfloat16* kb = kc + (size_t)kvh * p.S * D;
      const __nv_bfloat16* vb = vc + (size_t)kvh * p.S * D;
      for (int item = cw; item < items; item += CW) {
        int it = item, r = 0;
        while (it >= chunks_of(start, r)) it -= chunks_of(start, r), r++;
        const int c = it, len = start + r + 1, s = 32 * c + lane;
        const float* qr = qkv + (size_t)r * D;
        const int n = min(32, len - 32 * c);
        unsigned vv[32];  // this lane's two dims of each slot's V
#pragma unroll
        for (int j = 0; j < 32; j++) {
          const int sj = 32 * c + j;
          if (j >= n) {
            vv[j] = 0u;
          } else if (sj < start) {
            vv[j] = __ldcg(reinterpret_cast<const unsigned*>(vb + (size_t)sj * D + 2 * lane));
          } else {
            const float* vr = qkv + ((size_t)2 * RS + (sj - start)) * D + 2 * lane;
            __nv_bfloat162 b = __floats2bfloat162_rn(vr[0], vr[1]);
            vv[j] = *reinterpret_cast<unsigned*>(&b);
          }
        }
        float sc = -INFINITY;
        if (s < len) {
          float acc = 0.f;
          if (s < start) {
            uint4 kr[D / 8];
#pragma unroll
            for (int k = 0; k < D / 8; k++) kr[k] = __ldcg(reinterpret_cast<const uint4*>(kb + (size_t)s * D + 8 * k));
#pragma unroll
            for (int k = 0; k < D / 8; k++) acc = dot8(kr[k], qr + 8 * k, acc);
          } else {
            const float* kn = qkv + ((size_t)RS + (s - start)) * D;
#pragma unroll
            for (int d = 0; d < D; d++) acc = fmaf(qr[d], kn[d], acc);
          }
          sc = acc * p.qk_scale;
        }
        const float m = warp_max(sc);
        const float pr = s < len ? exp2f(sc - m) : 0.f;
        const float lsum = warp_sum(pr);
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int j = 0; j < 32; j++) {
          const float pj = __shfl_sync(0xffffffffu, pr, j);
          float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&vv[j]));
          a0 = fmaf(pj, f.x, a0), a1 = fmaf(pj, f.y, a1);
        }
#pragma unroll
        for (int k = 0; k < CL; k++) {
          float* dst = cl.map_shared_rank(part, k) + (size_t)item * PART;
          if (lane == 0) dst[0] = m, dst[1] = lsum;
          reinterpret_cast<float2*>(dst + 2)[lane] = make_float2(a0, a1);
        }
      }
      tick(l, 5);
      cl.sync();
      tick(l, 6);
      // each (row, dim pair): the chunks' largest max first, then their sums and P·V scaled to it,
      // added in chunk order; bf16 as o is
      for (int i = threadIdx.x; i < R * 32; i += THREADS) {
        const int r = i / 32, dp = i % 32, chunks = chunks_of(start, r);
        int base = 0;
        for (int rr = 0; rr < r; rr++) base += chunks_of(start, rr);
        const float* pr = part + (size_t)base * PART;
        float M = -INFINITY;
        for (int c0 = 0; c0 < chunks; c0 += 16) {
          float ms[16];
#pragma unroll
          for (int k = 0; k < 16; k++) ms[k] = c0 + k < chunks ? pr[(size_t)(c0 + k) * PART] : -INFINITY;
#pragma unroll
          for (int k = 0; k < 16; k++) M = fmaxf(M, ms[k]);
        }
        float L = 0.f, o0 = 0.f, o1 = 0.f;
        for (int c0 = 0; c0 < chunks; c0 += 16) {
          float f[16], ls[16];
          float2 as[16];
#pragma unroll
          for (int k = 0; k < 16; k++) {
            const float* q = pr + (size_t)(c0 + k) * PART;
            const bool live = c0 + k < chunks;
            f[k] = live ? exp2f(q[0] - M) : 0.f;
            ls[k] = live ? q[1] : 0.f;
            as[k] = live ? reinterpret_cast<const float2*>(q + 2)[dp] : make_float2(0.f, 0.f);
          }
#pragma unroll
          for (int k = 0; k < 16; k++) L = fmaf(ls[k], f[k], L), o0 = fmaf(as[k].x, f[k], o0), o1 = fmaf(as[k].y, f[k], o1);
        }
        os[(size_t)r * D + 2 * dp] = bf(o0 / L), os[(size_t)r * D + 2 * dp + 1] = bf(o1 / L);
      }
      __syncthreads();
      tick(l, 7);
      wo.run(os, D, D / 8, R, p.po + (size_t)hh * R * H, rank * OUTS + warp * 9, lane);
      tick(l, 8);
    }
    sync();
    load_mlp(l);
    done();

    // ---- the MLP block: a cluster per slice of the intermediate columns
    tick(l, 9);
    stage(xs, p.xa, nullptr, p.po, NH, blockIdx.x == 0 ? p.xb : nullptr, p.ln2 + l * H, R, p.eps);
    tick(l, 10);
#pragma unroll
    for (int i = 0; i < GU_ROWS; i++) {
      const int k = cw + CW * i, j = k < IC ? k : k - IC;
      if (k < 2 * IC && j < icn) push<RM>(cl, gu, k, 2 * ICMAX, bf(dots<RM>(wg[i], xs, R, lane)), R, lane);
    }
    tick(l, 11);
    cl.sync();
    tick(l, 12);
    for (int i = threadIdx.x; i < R * IC; i += THREADS) {
      const int r = i / IC, j = i % IC;
      float hv = 0.f;
      if (j < icn) {
        const float g = gu[(size_t)r * 2 * ICMAX + j], u = gu[(size_t)r * 2 * ICMAX + IC + j];
        hv = bf(bf(g / (1.f + __expf(-g))) * u);
      }
      hs[(size_t)r * ICMAX + j] = hv;
    }
    __syncthreads();
    tick(l, 13);
    if (icn > 0) wd.run(hs, ICMAX, icn / 8, R, p.pd + (size_t)cid * R * H, rank * OUTS + warp * 9, lane);
    tick(l, 14);
    sync();
    load_attn(min(l + 1, p.L - 1));  // the next attention block's weights, before the wait (after the last layer: unused)
    done();
  }

  // ---- the final RMSNorm, the head (4 vocabulary rows a warp at a time) and each row's argmax
  stage(xs, p.xb, nullptr, p.pd, nslices, blockIdx.x == 0 ? p.x : nullptr, p.norm, R, p.eps);
  const int gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int v0 = gw; v0 < p.V; v0 += 4 * nw) {
    Row<H> w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int v = v0 + k * nw;
      if (v < p.V) w[k].load(p.head + (size_t)v * H, lane);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int v = v0 + k * nw;
      if (v < p.V) {
        const float z = bf(dots<RM>(w[k], xs, R, lane));
        if (z > bv || (z == bv && v < bi)) bv = z, bi = v;
      }
    }
  }
  if ((lane & 1) == 0 && (lane >> 1) < R && bi != 0x7fffffff) atomicMax(p.best + (lane >> 1), pack_best(bv, bi));
  sync();
  done();
  if (p.timeline != nullptr && blockIdx.x == 0 && threadIdx.x == 0) p.timeline[63] = clock64();
  if (blockIdx.x == 0 && threadIdx.x < R) {
    const unsigned long long b = atomicAdd(p.best + threadIdx.x, 0ull);
    p.out[threadIdx.x] = (long long)(unsigned)(~(unsigned)(b & 0xffffffffu));
  }
  cl.sync();  // no block leaves while another may still write its shared memory
}

cudaLaunchConfig_t config(int clusters, size_t smem, cudaStream_t s, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(clusters * CL), c.blockDim = dim3(THREADS), c.dynamicSmemBytes = smem, c.stream = s;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  c.attrs = attr, c.numAttrs = 1;
  return c;
}

int clusters_ = 0;  // clusters of the grid: as many as can be resident at once, at most 16

}  // namespace

// The grid this pass launches (blocks), or a negative CUDA error code; at least 12 clusters of 8
// must fit at once (the MLP block's slices are at most 128 columns).
extern "C" int mega_blocks() {
  if (clusters_ == 0) {
    cudaError_t e = cudaFuncSetAttribute(mega2_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Smem<1>::BYTES);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(mega2_kernel<RMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Smem<RMAX>::BYTES);
    if (e != cudaSuccess) return -(int)e;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t c = config(16, Smem<RMAX>::BYTES, nullptr, attr);
    int n = 0;
    e = cudaOccupancyMaxActiveClusters(&n, mega2_kernel<RMAX>, &c);
    if (e != cudaSuccess) return -(int)e;
    if (n < 12) return -(int)cudaErrorInvalidConfiguration;
    clusters_ = n < 16 ? n : 16;
  }
  return clusters_ * CL;
}

// Zero the barrier, the argmax slots and the error flag, then run the pass of p->R rows on
// `stream` (tokens, positions and start in device memory: one captured graph serves every step).
// `grid` is ignored (mega_blocks() decides). Returns a CUDA error code (0: launched).
extern "C" int mega_pass(const Params* p, int grid, void* stream) {
  (void)grid;
  if (p->R < 1 || p->R > RMAX) return (int)cudaErrorInvalidValue;
  const int blocks = mega_blocks();
  if (blocks < 0) return -blocks;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaMemsetAsync(p->bar, 0, sizeof(unsigned), s);
  cudaMemsetAsync(p->best, 0, p->R * sizeof(unsigned long long), s);
  cudaMemsetAsync(p->err, 0, sizeof(int), s);
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t c = config(blocks / CL, p->R == 1 ? Smem<1>::BYTES : Smem<RMAX>::BYTES, s, attr);
  if (p->R == 1) return (int)cudaLaunchKernelEx(&c, mega2_kernel<1>, *p);
  return (int)cudaLaunchKernelEx(&c, mega2_kernel<RMAX>, *p);
}
