// A one-launch decode/verify pass of SmolLM2-135M in CUDA C++: the prototype of issue 40's next step.
//
// One block of 8 warps per SM walks the pass's phases (per layer: RMSNorm+QKV+RoPE, attention,
// o_proj+residual, RMSNorm+gate_up+SiLU, down+residual; then the head and the argmax), a grid
// barrier between phases. Unlike the Triton persistent pass (refspec/cuda_persist.py), a warp's
// weights for the next phase are loaded into its registers between its block's arrival at the
// barrier and its wait, so after the barrier a phase only reads its activations (L2) and computes:
// the weights are off the critical path. GEMVs run on CUDA cores, one output row per warp (a lane
// holds 8 bf16 of a row per 16-byte load, fp32 accumulation, a fixed shuffle tree), so every row of
// a pass gets the same bits whatever the pass's row count, and every run the same bits.
//
// Rounding follows refspec's kernels (HF Llama in bf16): RMSNorm in fp32 then bf16(w · bf16(x·r)),
// projections rounded to bf16, RoPE in fp32 on the rounded values, residual adds and silu·up in
// bf16. The summation order differs from the Triton kernels', so a logit can differ in its last
// bits (an argmax only at a near-tie). Chain rows only (row r sees slots < start + r + 1).
//
// Variants, each a -D macro (timed side by side by bench/refspec_mega.py; docs/BENCHMARKS.md):
//   CHUNK_ATTN    attention a warp per (row, head, 32-slot chunk), not a block per (head, row);
//                 the chunks combined in chunk order by o_proj's blocks (stage_attn), or with
//   LAST_COMBINE  by the warp that finishes a (row, head)'s last chunk (o_proj then reads o)
//   WIDE_COMBINE  stage_attn: 4 dims and 16 chunks' loads a thread (not 2 and 8)
//   KV_PREFETCH   the attention blocks ask the L2 for the K/V prefix before the barrier
//   NO_FENCE      the barrier's arrival is a red.release without a __threadfence before it
//   POLL_SLEEP=N  a back-off of N ns between polls of the barrier's counter
//   ROPE_EARLY    RoPE's cos/sin read once a pass (positions do not change within it)
//
// Built and timed by bench/refspec_mega.py; not part of refspec.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "mega_common.cuh"

constexpr int H = 576, INTER = 1536, NH = 9, NKV = 3, D = 64, GROUP = NH / NKV;
constexpr int NQKV = (NH + 2 * NKV) * D;  // 960 rows: Q, then K, then V
constexpr int PAIRS = NQKV / 2;           // a warp computes rows (j, j + 32) of a head: RoPE's pair
constexpr int WARPS = 8, THREADS = WARPS * 32, RMAX = 16;

struct Params {
  const __nv_bfloat16 *embed, *head, *norm, *ln1, *wqkv, *wo, *ln2, *wgu, *wd;
  const float *cos, *sin;  // [positions, D / 2]
  __nv_bfloat16 *kc, *vc;  // [layers, NKV, S, D]
  const int *tokens, *posn, *start;
  __nv_bfloat16 *x, *q, *o, *h;  // [R, H], [R, NH·D], [R, NH·D], [R, INTER]
  unsigned long long *best;      // [R]: (ordered logit << 32) | ~index, by atomicMax
  long long *out;                // [R]
  unsigned *bar;                 // the grid barrier's counter (zeroed before the launch)
  unsigned long long *timeline;  // null, or the global timer (ns) as block 0 leaves each barrier
  float *part;                   // CHUNK_ATTN: per (row, head, 32-slot chunk) max, sum, then P·V [D]
  unsigned *acnt;                // LAST_COMBINE: chunks done per (row, head); the last one combines
  int R, L, S, V;
  float eps, qk_scale;  // qk_scale: log2(e) / sqrt(D)
};

namespace {

// Activations are written by other SMs during the pass: read them past L1 (ld.global.cg).
__device__ __forceinline__ uint4 ld_cg(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ unsigned ld_cg32(const void* p) { return __ldcg(reinterpret_cast<const unsigned*>(p)); }

// x[n] = bf16(x[n] + y): x read past L1 (another SM wrote it this pass) as the aligned 32-bit word
// holding it
__device__ __forceinline__ void add_residual(__nv_bfloat16* x, int n, float y) {
  const unsigned word = ld_cg32(x + (n & ~1));
  const float xv = __bfloat162float(__ushort_as_bfloat16((unsigned short)(word >> (16 * (n & 1)))));
  x[n] = __float2bfloat16(xv + y);
}

// -- the grid barrier: a counter that only grows; barrier k waits for k · gridDim.x arrivals.
__device__ __forceinline__ void arrive(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
#ifndef NO_FENCE
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
#ifdef POLL_SLEEP
      if (v < target) __nanosleep(POLL_SLEEP);  // fewer polls on the counter's line while arrivals come
#endif
    } while (v < target);
  }
  __syncthreads();
}

// rows of a [R, K] bf16 activation into shared memory as floats; with `ln`, HF's RMSNorm of each row
template <int K>
__device__ void stage(float* xs, const __nv_bfloat16* x, const __nv_bfloat16* ln, int R, float eps) {
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int N = K / 8, C = (N + 31) / 32;
  for (int r = warp; r < R; r += WARPS) {
    float v[C][8];
    uint4 g[C];  // the norm's weights, loaded beside x (not after the reduction)
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++) {
      int i = lane + 32 * c;
      if (i < N && ln != nullptr) g[c] = *reinterpret_cast<const uint4*>(ln + 8 * i);
    }
#pragma unroll
    for (int c = 0; c < C; c++) {
      int i = lane + 32 * c;
      if (i < N) {
        uint4 u = ld_cg(x + (size_t)r * K + 8 * i);
        const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float2 f = __bfloat1622float2(p[e]);
          v[c][2 * e] = f.x, v[c][2 * e + 1] = f.y;
          ss += f.x * f.x + f.y * f.y;
        }
      }
    }
    float rstd = 1.f;
    if (ln != nullptr) rstd = rsqrtf(warp_sum(ss) / K + eps);
#pragma unroll
    for (int c = 0; c < C; c++) {
      int i = lane + 32 * c;
      if (i < N) {
        const __nv_bfloat16* gw = reinterpret_cast<const __nv_bfloat16*>(&g[c]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
          float t = v[c][e];
          if (ln != nullptr) t = bf(__bfloat162float(gw[e]) * bf(t * rstd));
          xs[(size_t)r * K + 8 * i + e] = t;
        }
      }
    }
  }
  __syncthreads();
}

// dot(weight row, staged row r) for the pass's R rows: lanes 2r and 2r + 1 hold row r's sum (with
// one row every lane holds it; the same bits either way)
template <int K>
__device__ __forceinline__ float dots(const Row<K>& w, const float* xs, int R, int lane) {
  if (R == 1) return warp_sum(w.dot(xs, lane));
  float v[RMAX];
#pragma unroll
  for (int r = 0; r < RMAX; r++) v[r] = r < R ? w.dot(xs + r * K, lane) : 0.f;
  return reduce16(v, lane);
}

#if defined(CHUNK_ATTN) && !defined(LAST_COMBINE)
// Attention's output rows into shared memory: each (row, head)'s chunks combined in chunk order,
// rounded to bf16 as the o buffer would be. A thread takes DV dims and CB chunks' loads at a time.
#ifdef WIDE_COMBINE
constexpr int DV = 4, CB = 16;
#else
constexpr int DV = 2, CB = 8;
#endif
__device__ void stage_attn(float* xs, const float* part, int R, int start, int nch) {
  for (int i = threadIdx.x; i < R * NH * (D / DV); i += THREADS) {
    const int r = i / (NH * (D / DV)), hh = i / (D / DV) % NH, dq = i % (D / DV), chunks = (start + r + 32) / 32;
    const float* base = part + ((size_t)r * NH + hh) * nch * (D + 2);
    float M = -1e30f, L = 0.f, o[DV] = {};
    for (int c0 = 0; c0 < chunks; c0 += CB) {
      float ms[CB], ls[CB], as[CB][DV];
#pragma unroll
      for (int k = 0; k < CB; k++) {
        const float* q = base + (size_t)(c0 + k) * (D + 2);
        const bool live = c0 + k < chunks;
        ms[k] = live ? __ldcg(q) : -1e30f;
        ls[k] = live ? __ldcg(q + 1) : 0.f;
#pragma unroll
        for (int e = 0; e < DV; e += 2) {
          const float2 a = live ? __ldcg(reinterpret_cast<const float2*>(q + 2 + DV * dq + e)) : make_float2(0.f, 0.f);
          as[k][e] = a.x, as[k][e + 1] = a.y;
        }
      }
#pragma unroll
      for (int k = 0; k < CB; k++) {
        const float mn = fmaxf(M, ms[k]), fo = exp2f(M - mn), f = exp2f(ms[k] - mn);
        L = L * fo + ls[k] * f;
#pragma unroll
        for (int e = 0; e < DV; e++) o[e] = o[e] * fo + as[k][e] * f;
        M = mn;
      }
    }
#pragma unroll
    for (int e = 0; e < DV; e++) xs[(size_t)r * H + hh * D + DV * dq + e] = bf(o[e] / L);
  }
  __syncthreads();
}
#endif

__device__ __forceinline__ unsigned long long pack_best(float v, int idx) {
  unsigned u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ordered: larger float, larger key
  return ((unsigned long long)u << 32) | (unsigned)(~idx);  // equal logits: the smaller index wins
}

__global__ void __launch_bounds__(THREADS, 1) mega_pass_kernel(Params p) {
  extern __shared__ float xs[];  // [R, INTER] floats at most
#ifdef CHUNK_ATTN
  __shared__ float att_q[WARPS][D];  // a warp's query row
#else
  __shared__ float att_m[WARPS], att_l[WARPS], att_acc[WARPS][D], qs[D];  // a block's head: its warps' parts
#endif
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
  const int R = p.R, start = *p.start;
  auto mine = [&](int r) { return (lane & 1) == 0 && r < R; };  // lane 2r stores row r
  unsigned nbar = 0;
  auto sync = [&]() { arrive(p.bar); nbar++; };
  auto done = [&]() {
    wait(p.bar, nbar * gridDim.x);
    if (p.timeline != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      p.timeline[nbar] = t;
    }
  };
  if (p.timeline != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.timeline[0] = t;
  }

  // x = embed[tokens]
  for (int i = blockIdx.x * THREADS + threadIdx.x; i < R * H / 8; i += gridDim.x * THREADS) {
    int r = i / (H / 8), c = i % (H / 8);
    reinterpret_cast<uint4*>(p.x)[i] = reinterpret_cast<const uint4*>(p.embed + (size_t)p.tokens[r] * H)[c];
  }
  Row<H> qa, qb;  // this warp's QKV pair (prefetched before each layer's barrier)
  const bool has_qkv = gw < PAIRS;
  const int qhead = gw / 32, qj = gw % 32;
#ifdef ROPE_EARLY
  float rc = 1.f, rs = 0.f;  // RoPE of row lane >> 1 (every lane's row 0 with one row): read once a pass
  if (has_qkv && qhead < NH + NKV && (lane >> 1) < R) {
    const int pos = p.posn[R == 1 ? 0 : lane >> 1];
    rc = p.cos[pos * (D / 2) + qj], rs = p.sin[pos * (D / 2) + qj];
  }
#endif
  if (has_qkv) {
    qa.load(p.wqkv + (size_t)(qhead * D + qj) * H, lane);
    qb.load(p.wqkv + (size_t)(qhead * D + qj + 32) * H, lane);
  }
  sync();
  done();

  for (int l = 0; l < p.L; l++) {
    __nv_bfloat16* kc = p.kc + (size_t)l * NKV * p.S * D;
    __nv_bfloat16* vc = p.vc + (size_t)l * NKV * p.S * D;
    // -- RMSNorm + QKV + RoPE; K and V into the cache
    stage<H>(xs, p.x, p.ln1 + l * H, R, p.eps);
    if (has_qkv) {
      float lo = bf(dots(qa, xs, R, lane)), hi = bf(dots(qb, xs, R, lane));
      const int r = lane >> 1;
      if (mine(r)) {
        if (qhead < NH + NKV) {
#ifdef ROPE_EARLY
          const float c = rc, s = rs;
#else
          int pos = p.posn[r];
          float c = p.cos[pos * (D / 2) + qj], s = p.sin[pos * (D / 2) + qj];
#endif
          float a = lo * c - hi * s, b = hi * c + lo * s;
          lo = a, hi = b;
        }
        __nv_bfloat16* dst;
        if (qhead < NH) {
          dst = p.q + (size_t)r * NH * D + qhead * D + qj;
        } else {
          int kv = qhead - NH;
          __nv_bfloat16* base = kc;
          if (kv >= NKV) kv -= NKV, base = vc;
          dst = base + ((size_t)kv * p.S + start + r) * D + qj;
        }
        dst[0] = __float2bfloat16(lo);
        dst[32] = __float2bfloat16(hi);
      }
    }
    sync();
#ifdef KV_PREFETCH
    // the attention blocks ask the L2 for their head's K/V prefix (written by earlier passes)
    for (int item = blockIdx.x; item < NH * R; item += gridDim.x) {
      const size_t head = (size_t)(item % NH / GROUP) * p.S * D;
      const char *kb = reinterpret_cast<const char*>(kc + head), *vb = reinterpret_cast<const char*>(vc + head);
      for (int off = threadIdx.x * 128; off < start * D * 2; off += THREADS * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(kb + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(vb + off));
      }
    }
#endif
    Row<H> orow;  // o_proj's row of this warp
    const bool has_o = gw < H;
    if (has_o) orow.load(p.wo + (size_t)l * H * H + (size_t)gw * H, lane);
    done();

#ifdef CHUNK_ATTN
    // -- attention: a warp per (row, head, 32-slot chunk), a lane per slot; the partial max, sum
    // and P·V to `part`, combined in chunk order by every o_proj block (stage_attn)
    for (int item = gw;; item += nw) {
      int it = item, r = 0;
      while (r < R && it >= NH * ((start + r + 32) / 32)) it -= NH * ((start + r + 32) / 32), r++;
      if (r == R) break;
      const int hh = it % NH, c = it / NH, len = start + r + 1, s = 32 * c + lane;
      const int nch = (p.S + 31) / 32;
      float* qw = att_q[warp];
      const unsigned qv = ld_cg32(p.q + (size_t)r * NH * D + hh * D + 2 * lane);
      const float2 qf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qv));
      qw[2 * lane] = qf.x, qw[2 * lane + 1] = qf.y;
      __syncwarp();
      const __nv_bfloat16* kb = kc + (size_t)(hh / GROUP) * p.S * D;
      const __nv_bfloat16* vb = vc + (size_t)(hh / GROUP) * p.S * D;
      const int n = min(32, len - 32 * c);
      unsigned vv[32];  // this lane's two dims of the chunk's V: in flight beside K
#pragma unroll
      for (int j = 0; j < 32; j++) vv[j] = j < n ? ld_cg32(vb + (size_t)(32 * c + j) * D + 2 * lane) : 0u;
      float sc = -INFINITY;
      if (s < len) {
        uint4 kr[D / 8];
#pragma unroll
        for (int k = 0; k < D / 8; k++) kr[k] = ld_cg(kb + (size_t)s * D + 8 * k);
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < D / 8; k++) {
          const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&kr[k]);
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float2 f = __bfloat1622float2(b[e]);
            acc = fmaf(qw[8 * k + 2 * e], f.x, acc);
            acc = fmaf(qw[8 * k + 2 * e + 1], f.y, acc);
          }
        }
        sc = acc * p.qk_scale;
      }
      const float m = warp_max(sc);
      const float pr = s < len ? exp2f(sc - m) : 0.f;
      const float l = warp_sum(pr);
      float a0 = 0.f, a1 = 0.f;
#pragma unroll
      for (int j = 0; j < 32; j++) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
        float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&vv[j]));
        a0 = fmaf(pj, f.x, a0), a1 = fmaf(pj, f.y, a1);
      }
      float* dst = p.part + (((size_t)r * NH + hh) * nch + c) * (D + 2);
      if (lane == 0) dst[0] = m, dst[1] = l;
      reinterpret_cast<float2*>(dst + 2)[lane] = make_float2(a0, a1);
#ifdef LAST_COMBINE
      // the warp that finishes a (row, head)'s last chunk combines them all, in chunk order
      __threadfence();
      __syncwarp();
      unsigned done_before = 0;
      if (lane == 0) done_before = atomicAdd(p.acnt + r * NH + hh, 1u);
      done_before = __shfl_sync(0xffffffffu, done_before, 0);
      const int chunks = (start + r + 32) / 32;
      if ((int)done_before == chunks - 1) {
        __threadfence();
        const float* base = p.part + ((size_t)r * NH + hh) * nch * (D + 2);
        float M = -1e30f, L = 0.f, o0 = 0.f, o1 = 0.f;
        for (int c0 = 0; c0 < chunks; c0 += 16) {
          float ms[16], ls[16];
          float2 as[16];
#pragma unroll
          for (int k = 0; k < 16; k++) {
            const float* q = base + (size_t)(c0 + k) * (D + 2);
            const bool live = c0 + k < chunks;
            ms[k] = live ? __ldcg(q) : -1e30f;
            ls[k] = live ? __ldcg(q + 1) : 0.f;
            as[k] = live ? __ldcg(reinterpret_cast<const float2*>(q + 2) + lane) : make_float2(0.f, 0.f);
          }
#pragma unroll
          for (int k = 0; k < 16; k++) {
            const float mn = fmaxf(M, ms[k]), fo = exp2f(M - mn), f = exp2f(ms[k] - mn);
            L = L * fo + ls[k] * f;
            o0 = o0 * fo + as[k].x * f, o1 = o1 * fo + as[k].y * f;
            M = mn;
          }
        }
        *reinterpret_cast<__nv_bfloat162*>(p.o + (size_t)r * NH * D + hh * D + 2 * lane) =
            __floats2bfloat162_rn(o0 / L, o1 / L);
        if (lane == 0) p.acnt[r * NH + hh] = 0;  // for the next layer (several barriers away)
      }
#endif
      __syncwarp();
    }
#else
    // -- attention: a block per (head, row); a warp per 32 slots at a time, online softmax
    for (int item = blockIdx.x; item < NH * R; item += gridDim.x) {
      const int hh = item % NH, r = item / NH, kvh = hh / GROUP, len = start + r + 1;
      if (threadIdx.x < D / 8) {
        uint4 u = ld_cg(p.q + (size_t)r * NH * D + hh * D + 8 * threadIdx.x);
        const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float2 f = __bfloat1622float2(b[e]);
          qs[8 * threadIdx.x + 2 * e] = f.x, qs[8 * threadIdx.x + 2 * e + 1] = f.y;
        }
      }
      __syncthreads();
      const __nv_bfloat16* kb = kc + (size_t)kvh * p.S * D;
      const __nv_bfloat16* vb = vc + (size_t)kvh * p.S * D;
      float m = -1e30f, lsum = 0.f, a0 = 0.f, a1 = 0.f;
      for (int s0 = warp * 32; s0 < len; s0 += WARPS * 32) {
        const int s = s0 + lane;
        float sc = -INFINITY;
        if (s < len) {
          float acc = 0.f;
#pragma unroll
          for (int c = 0; c < D / 8; c++) {
            uint4 u = ld_cg(kb + (size_t)s * D + 8 * c);
            const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
            for (int e = 0; e < 4; e++) {
              float2 f = __bfloat1622float2(b[e]);
              acc = fmaf(qs[8 * c + 2 * e], f.x, acc);
              acc = fmaf(qs[8 * c + 2 * e + 1], f.y, acc);
            }
          }
          sc = acc * p.qk_scale;
        }
        const float mn = fmaxf(m, warp_max(sc));
        const float alpha = exp2f(m - mn);
        const float pr = s < len ? exp2f(sc - mn) : 0.f;
        lsum = lsum * alpha + warp_sum(pr);
        a0 *= alpha, a1 *= alpha;
        const int n = min(32, len - s0);
        unsigned vv[32];  // the chunk's V (this lane's two dims of each slot): every load in flight at once
#pragma unroll
        for (int j = 0; j < 32; j++) vv[j] = j < n ? ld_cg32(vb + (size_t)(s0 + j) * D + 2 * lane) : 0u;
#pragma unroll
        for (int j = 0; j < 32; j++) {
          const float pj = __shfl_sync(0xffffffffu, pr, j);
          float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&vv[j]));
          a0 = fmaf(pj, f.x, a0), a1 = fmaf(pj, f.y, a1);
        }
        m = mn;
      }
      if (lane == 0) att_m[warp] = m, att_l[warp] = lsum;
      att_acc[warp][2 * lane] = a0, att_acc[warp][2 * lane + 1] = a1;
      __syncthreads();
      if (warp == 0) {  // the warps' parts in warp order
        float M = -1e30f;
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, att_m[w]);
        float L = 0.f, o0 = 0.f, o1 = 0.f;
        for (int w = 0; w < WARPS; w++) {
          float f = exp2f(att_m[w] - M);
          L += att_l[w] * f;
          o0 += att_acc[w][2 * lane] * f, o1 += att_acc[w][2 * lane + 1] * f;
        }
        __nv_bfloat162 v = __floats2bfloat162_rn(o0 / L, o1 / L);
        *reinterpret_cast<__nv_bfloat162*>(p.o + (size_t)r * NH * D + hh * D + 2 * lane) = v;
      }
      __syncthreads();
    }
#endif
    sync();
    Row<H> ga, ua, gb, ub;  // gate_up: this warp's (gate, up) rows of columns gw and gw + nw
    const bool has_g0 = gw < INTER, has_g1 = gw + nw < INTER;
    const __nv_bfloat16* wgu = p.wgu + (size_t)l * 2 * INTER * H;
    if (has_g0) ga.load(wgu + (size_t)gw * H, lane), ua.load(wgu + (size_t)(INTER + gw) * H, lane);
    if (has_g1) gb.load(wgu + (size_t)(gw + nw) * H, lane), ub.load(wgu + (size_t)(INTER + gw + nw) * H, lane);
    done();

    // -- o_proj + residual
#if defined(CHUNK_ATTN) && !defined(LAST_COMBINE)
    stage_attn(xs, p.part, R, start, (p.S + 31) / 32);
#else
    stage<H>(xs, p.o, nullptr, R, 0.f);
#endif
    if (has_o) {
      const float y = bf(dots(orow, xs, R, lane));
      if (mine(lane >> 1)) add_residual(p.x + (size_t)(lane >> 1) * H, gw, y);
    }
    sync();
    done();

    // -- RMSNorm + gate_up + SiLU·up
    stage<H>(xs, p.x, p.ln2 + l * H, R, p.eps);
    {
      const int r = lane >> 1;
      if (has_g0) {
        float g = bf(dots(ga, xs, R, lane)), u = bf(dots(ua, xs, R, lane));
        if (mine(r)) p.h[(size_t)r * INTER + gw] = __float2bfloat16(bf(g / (1.f + __expf(-g))) * u);
      }
      if (has_g1) {
        float g = bf(dots(gb, xs, R, lane)), u = bf(dots(ub, xs, R, lane));
        if (mine(r)) p.h[(size_t)r * INTER + gw + nw] = __float2bfloat16(bf(g / (1.f + __expf(-g))) * u);
      }
    }
    sync();
    Row<INTER> drow;
    const bool has_d = gw < H;
    if (has_d) drow.load(p.wd + (size_t)l * H * INTER + (size_t)gw * INTER, lane);
    done();

    // -- down + residual
    stage<INTER>(xs, p.h, nullptr, R, 0.f);
    if (has_d) {
      const float y = bf(dots(drow, xs, R, lane));
      if (mine(lane >> 1)) add_residual(p.x + (size_t)(lane >> 1) * H, gw, y);
    }
    sync();
    if (has_qkv && l + 1 < p.L) {
      const __nv_bfloat16* w = p.wqkv + (size_t)(l + 1) * NQKV * H;
      qa.load(w + (size_t)(qhead * D + qj) * H, lane);
      qb.load(w + (size_t)(qhead * D + qj + 32) * H, lane);
    }
    done();
  }

  // -- final RMSNorm, the head (4 vocabulary rows a warp at a time) and each row's argmax
  stage<H>(xs, p.x, p.norm, R, p.eps);
  float bv = -INFINITY;  // lane 2r's row r: its best logit and index so far
  int bi = 0x7fffffff;
  for (int v0 = gw; v0 < p.V; v0 += 4 * nw) {
    Row<H> w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      int v = v0 + k * nw;
      if (v < p.V) w[k].load(p.head + (size_t)v * H, lane);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
      int v = v0 + k * nw;
      if (v < p.V) {
        const float z = bf(dots(w[k], xs, R, lane));
        if (z > bv || (z == bv && v < bi)) bv = z, bi = v;
      }
    }
  }
  if (mine(lane >> 1) && bi != 0x7fffffff) atomicMax(p.best + (lane >> 1), pack_best(bv, bi));
  sync();
  done();
  if (blockIdx.x == 0 && threadIdx.x < R) {
    unsigned long long b = atomicAdd(p.best + threadIdx.x, 0ull);
    p.out[threadIdx.x] = (long long)(unsigned)(~(unsigned)(b & 0xffffffffu));
  }
}

}  // namespace

// Zero the barrier and the argmax slots, then run the pass of p->R rows on `stream` (tokens,
// positions and start in device memory: one captured graph serves every step). Returns a CUDA
// error code (0: launched).
extern "C" int mega_pass(const Params* p, int grid, void* stream) {
  if (p->R < 1 || p->R > RMAX) return (int)cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  static bool attr = false;
  if (!attr) {
    cudaError_t e = cudaFuncSetAttribute(mega_pass_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         RMAX * INTER * (int)sizeof(float));
    if (e != cudaSuccess) return (int)e;
    attr = true;
  }
  cudaMemsetAsync(p->bar, 0, sizeof(unsigned), s);
  cudaMemsetAsync(p->best, 0, p->R * sizeof(unsigned long long), s);
  cudaMemsetAsync(p->acnt, 0, p->R * NH * sizeof(unsigned), s);
  mega_pass_kernel<<<grid, THREADS, (size_t)p->R * INTER * sizeof(float), s>>>(*p);
  return (int)cudaGetLastError();
}
