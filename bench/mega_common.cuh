// Warp-level pieces shared by the one-launch pass prototypes (refspec_mega.cu, refspec_mega2.cu)
// and bench/mma_gemv.cu: reductions, the bf16 rounding, an 8-wide dot and a weight row held in a
// warp's registers; each row's additions in a fixed order, so a row's bits do not depend on how
// many rows a pass has. Included by each .cu (nvcc builds them one by one; not part of refspec).
#pragma once
#include <cuda_bf16.h>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
// Sixteen rows' partial sums reduced at once: lanes 2r and 2r + 1 end with row r's sum. Each row's
// sum takes the same additions in the same order as warp_sum's (xor 16, 8, 4, 2, 1).
template <int N>
__device__ __forceinline__ void halve(float (&v)[16], int lane) {  // lanes apart by 2N trade halves
#pragma unroll
  for (int i = 0; i < N; i++) {
    const bool hi = lane & (2 * N);
    const float keep = hi ? v[i + N] : v[i], send = hi ? v[i] : v[i + N];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * N);
  }
}
__device__ __forceinline__ float reduce16(float (&v)[16], int lane) {
  halve<8>(v, lane);
  halve<4>(v, lane);
  halve<2>(v, lane);
  halve<1>(v, lane);
  return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
}

__device__ __forceinline__ float bf(float v) { return __bfloat162float(__float2bfloat16(v)); }

// acc + dot(8 bf16 weights in u, 8 floats at xp), the FMAs in element order
__device__ __forceinline__ float dot8(const uint4& u, const float* xp, float acc) {
  const float4 a = reinterpret_cast<const float4*>(xp)[0], b = reinterpret_cast<const float4*>(xp)[1];
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&u);
  float2 w0 = __bfloat1622float2(wp[0]), w1 = __bfloat1622float2(wp[1]);
  float2 w2 = __bfloat1622float2(wp[2]), w3 = __bfloat1622float2(wp[3]);
  acc = fmaf(a.x, w0.x, acc); acc = fmaf(a.y, w0.y, acc);
  acc = fmaf(a.z, w1.x, acc); acc = fmaf(a.w, w1.y, acc);
  acc = fmaf(b.x, w2.x, acc); acc = fmaf(b.y, w2.y, acc);
  acc = fmaf(b.z, w3.x, acc); acc = fmaf(b.w, w3.y, acc);
  return acc;
}

template <int K>
struct Row {  // a row of K bf16 weights in a warp's registers: lane holds 16-byte chunks lane, lane + 32, ...
  static constexpr int N = K / 8, C = (N + 31) / 32;
  uint4 w[C];
  // every register written whether or not `live` (zeros if not), so the compiler sees each load
  // end the previous phase's row: rows of different phases can share registers
  __device__ __forceinline__ void load(const __nv_bfloat16* p, int lane, bool live = true) {
    const uint4* s = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int c = 0; c < C; c++) {
      int i = lane + 32 * c;
      if (live && i < N) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(w[c].x), "=r"(w[c].y), "=r"(w[c].z), "=r"(w[c].w) : "l"(s + i));
      } else {
        w[c] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  __device__ __forceinline__ float dot(const float* xs, int lane) const {
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++) {
      int i = lane + 32 * c;
      if (i < N) acc = dot8(w[c], xs + 8 * i, acc);
    }
    return acc;
  }
};
