"""refspec's CUDA verify pass as one persistent Triton kernel (issue 40).

The per-phase path (cuda_kernels.py, 5 launches a layer + 2) is launch- and latency-bound at
SmolLM2's size: 153 small grids of 18-48 programs, each kernel waiting for the one before. Here
one launch of NP programs (one per SM, all resident) walks the same phases in order,

    embed → per layer: norm_qkv_rope | attention | o_proj + residual | norm_gate_up | down + residual
          → norm_head | argmax

each phase's work items (the per-phase kernels' programs) dealt round-robin over the NP programs
and a grid barrier (an atomic counter in device memory) between phases. Every item runs the same
`*_tile` function as the per-phase kernel's program with the same tile shapes and warps, so a row
gets the same bits on either path, and on every bucket. While layer i runs, each program asks the
L2 for its share of layer i+1's weights (`prefetch.global.L2`), so a phase's weight reads hit L2
rather than HBM. Activations are read with `.cg` (L2, never a stale L1 line); a barrier's release
and acquire are the atomic's (gpu scope), with a CTA barrier on either side.

Everything the pass needs (tokens, positions, start, mask) is in device memory before it starts,
so a CUDA graph of [zero the counter, this kernel] replays with nothing read back in between.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import cuda_kernels as K


@triton.jit
def _n(items, SKIP: tl.constexpr, BIT: tl.constexpr):
    return items * ((SKIP & BIT) == 0)


@triton.jit
def _grid_sync(bar_ptr, target):
    """Wait until `target` arrivals: every program's stores before it are visible after it."""
    tl.debug_barrier()
    seen = tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu") + 1
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _prefetch(base, E, pid, NP: tl.constexpr):
    """Ask the L2 for program pid's share of the E bf16 elements at base (whole 128-byte lines)."""
    LINES = E // 64
    per = tl.cdiv(LINES, NP)
    lo = pid * per
    hi = tl.minimum(lo + per, LINES)
    for l0 in range(lo, hi, 256):
        ls = tl.minimum(l0 + tl.arange(0, 256), hi - 1)
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [base + ls.to(tl.int64) * 64],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


@triton.jit
def _prefetch_layer(layer, ln1_ptr, wqkv_ptr, wo_ptr, ln2_ptr, wgu_ptr, wd_ptr, kc_ptr, vc_ptr, S_MAX, start,
                    pid, NP: tl.constexpr, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
                    HID: tl.constexpr, INTER: tl.constexpr):  # fmt: skip
    """Layer `layer`'s weights and its cache's prefix K/V (slots below start), into L2."""
    QKV: tl.constexpr = (HQ + 2 * HK) * D * HID
    WO: tl.constexpr = HID * HQ * D
    GU: tl.constexpr = 2 * INTER * HID
    WD: tl.constexpr = HID * INTER
    _prefetch(wqkv_ptr + layer * QKV, QKV, pid, NP)
    _prefetch(wo_ptr + layer * WO, WO, pid, NP)
    _prefetch(wgu_ptr + layer * GU, GU, pid, NP)
    _prefetch(wd_ptr + layer * WD, WD, pid, NP)
    for kh in range(HK):
        off = (layer * HK + kh) * S_MAX * D
        _prefetch(kc_ptr + off, start * D, pid, NP)
        _prefetch(vc_ptr + off, start * D, pid, NP)
    if pid == NP - 1:
        _prefetch(ln1_ptr + layer * HID, HID, 0, 1)
        _prefetch(ln2_ptr + layer * HID, HID, 0, 1)


@triton.jit
def decode_pass(tok_ptr, embed_ptr, x_ptr, q_ptr, o_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, posn_ptr,
                start_ptr, mask_ptr, ln1_ptr, wqkv_ptr, wo_ptr, ln2_ptr, wgu_ptr, wd_ptr, norm_ptr, head_ptr,
                val_ptr, idx_ptr, out_ptr, bar_ptr, pm_ptr, pl_ptr, pacc_ptr, cnt_ptr, MAXS, R, eps, S_MAX, MASK_STRIDE, qk_scale, V, TILES,
                L: tl.constexpr, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, HID: tl.constexpr,
                INTER: tl.constexpr, BM: tl.constexpr, NP: tl.constexpr, LOGITS: tl.constexpr,
                HIDP: tl.constexpr, BT: tl.constexpr,
                QBH: tl.constexpr, QBK: tl.constexpr, ABN: tl.constexpr, OBN: tl.constexpr, OBK: tl.constexpr,
                GBN: tl.constexpr, GBK: tl.constexpr, DBN: tl.constexpr, DBK: tl.constexpr,
                HBN: tl.constexpr, HBK: tl.constexpr, ASPL: tl.constexpr, SKIP: tl.constexpr = 0):  # fmt: skip
    """Grid (NP,). The whole pass of R rows (a multiple of BM); LOGITS: end with each row's argmax
    in out_ptr, else stop after the last layer (a head mechanism's hidden states are x). SKIP (bench
    only): a bit mask of phases left out (1 qkv, 2 attention, 4 o_proj, 8 gate_up, 16 down, 32 head,
    64 prefetch), to place the pass's time."""
    pid = tl.program_id(0)
    gm = tl.cdiv(R, BM)
    NH: tl.constexpr = HQ + 2 * HK
    PARTS: tl.constexpr = D // 2 // QBH
    WQKV: tl.constexpr = NH * D * HID
    WO: tl.constexpr = HID * HQ * D
    WGU: tl.constexpr = 2 * INTER * HID
    WD: tl.constexpr = HID * INTER
    kvl = HK * S_MAX * D
    start = tl.load(start_ptr)
    _prefetch_layer(0, ln1_ptr, wqkv_ptr, wo_ptr, ln2_ptr, wgu_ptr, wd_ptr, kc_ptr, vc_ptr, S_MAX, start, pid, NP,
                    HQ, HK, D, HID, INTER)  # fmt: skip
    cols = tl.arange(0, HIDP)
    for r in range(pid, R, NP):  # the embedding rows
        t = tl.load(tok_ptr + r).to(tl.int64)
        e = tl.load(embed_ptr + t * HID + cols, mask=cols < HID)
        tl.store(x_ptr + r * HID + cols, e, mask=cols < HID)
    arrivals = NP
    _grid_sync(bar_ptr, arrivals)
    for layer in range(L):
        if layer + 1 < L and (SKIP & 64) == 0:
            _prefetch_layer(layer + 1, ln1_ptr, wqkv_ptr, wo_ptr, ln2_ptr, wgu_ptr, wd_ptr, kc_ptr, vc_ptr, S_MAX,
                            start, pid, NP, HQ, HK, D, HID, INTER)  # fmt: skip
        kc = kc_ptr + layer * kvl
        vc = vc_ptr + layer * kvl
        for it in range(pid, _n(NH * PARTS * gm, SKIP, 1), NP):
            K.qkv_tile(it % NH, (it // NH) % PARTS, it // (NH * PARTS), x_ptr, ln1_ptr + layer * HID,
                     wqkv_ptr + layer * WQKV, cos_ptr, sin_ptr, posn_ptr, start_ptr, q_ptr, kc, vc, R, eps,
                     S_MAX, HQ, HK, D, HID, BM, QBH, QBK)  # fmt: skip
        arrivals += NP
        _grid_sync(bar_ptr, arrivals)
        if ASPL == 0:
            for it in range(pid, _n(HQ * gm, SKIP, 2), NP):
                K.attention_tile(it % HQ, it // HQ, q_ptr, kc, vc, mask_ptr, start_ptr, o_ptr, R, MASK_STRIDE, S_MAX,
                               qk_scale, HQ, HQ // HK, D, BM, ABN)  # fmt: skip
        else:
            nsp = tl.cdiv(start + R, ASPL)
            for it in range(pid, _n(HQ * nsp * gm, SKIP, 2), NP):
                K.attention_split_tile(it % HQ, (it // HQ) % nsp, it // (HQ * nsp), q_ptr, kc, vc, mask_ptr, start_ptr,
                                     o_ptr, pm_ptr, pl_ptr, pacc_ptr, cnt_ptr, R, MASK_STRIDE, S_MAX, MAXS, MASK_STRIDE,
                                     qk_scale, HQ, HQ // HK, D, BM, ABN, ASPL)  # fmt: skip
        arrivals += NP
        _grid_sync(bar_ptr, arrivals)
        for it in range(pid, _n((HID // OBN) * gm, SKIP, 4), NP):
            K.linear_tile(it % (HID // OBN), it // (HID // OBN), o_ptr, wo_ptr + layer * WO, x_ptr, R, HID,
                        HQ * D, BM, OBN, OBK)  # fmt: skip
        arrivals += NP
        _grid_sync(bar_ptr, arrivals)
        for it in range(pid, _n((INTER // GBN) * gm, SKIP, 8), NP):
            K.gate_up_tile(it % (INTER // GBN), it // (INTER // GBN), x_ptr, ln2_ptr + layer * HID,
                         wgu_ptr + layer * WGU, h_ptr, R, eps, INTER, HID, BM, GBN, GBK)  # fmt: skip
        arrivals += NP
        _grid_sync(bar_ptr, arrivals)
        for it in range(pid, _n((HID // DBN) * gm, SKIP, 16), NP):
            K.linear_tile(it % (HID // DBN), it // (HID // DBN), h_ptr, wd_ptr + layer * WD, x_ptr, R, HID,
                        INTER, BM, DBN, DBK)  # fmt: skip
        arrivals += NP
        _grid_sync(bar_ptr, arrivals)
    if LOGITS:
        for it in range(pid, _n(TILES * gm, SKIP, 32), NP):
            K.head_tile(it % TILES, it // TILES, x_ptr, norm_ptr, head_ptr, val_ptr, idx_ptr, R, eps, V, TILES,
                      HID, BM, HBN, HBK)  # fmt: skip
        arrivals += NP
        _grid_sync(bar_ptr, arrivals)
        for r in range(pid, R, NP):
            K.argmax_row(r, val_ptr, idx_ptr, out_ptr, TILES, BT)


def launch(m, rows: int, logits: bool, cfg: dict, skip: int = 0) -> None:
    """One persistent pass of `rows` rows (a bucket) on CudaModel m's buffers and stacked weights."""
    a = m.args
    ln1, wqkv, wo, ln2, wgu, wd = m.stacked()
    decode_pass[(m.nprog,)](
        m.tokens, m.embed, m.x, m.q, m.o, m.h, m.kc, m.vc, m.cos, m.sin, m.posn, m.start, m.mask,
        ln1, wqkv, wo, ln2, wgu, wd, m.norm, m.head, m.vals, m.idxs, m.out, m.bar, m.pm, m.pl, m.pacc, m.acnt,
        m.maxs,
        rows, a.rms_eps, m.slots, m.rmax, m.qk_scale, a.vocab, m.tiles,
        L=a.layers, HQ=a.heads, HK=a.kv_heads, D=a.head_dim, HID=a.hidden, INTER=a.intermediate, BM=16,
        NP=m.nprog, LOGITS=logits, HIDP=triton.next_power_of_2(a.hidden),
        BT=triton.next_power_of_2(m.tiles), SKIP=skip, **cfg,
    )  # fmt: skip
