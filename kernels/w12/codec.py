"""Encode a bf16 matrix to W12 and decode it back, bit for bit (torch, CPU or CUDA, vectorized)."""

from __future__ import annotations

import torch

from .format import (
    HALF_K,
    LOW_BYTES,
    RECORD_BYTES,
    TILE_K,
    TILE_N,
    VIEW_BYTES,
    WINDOW,
    W12FormatError,
    W12Tensor,
)

# Rows per encode chunk: bounds the int32/int64 temporaries (~40 bytes per weight) on CPU.
_CHUNK_ELEMS = 1 << 23


def _bits(w: torch.Tensor) -> torch.Tensor:
    """bf16 -> its 16 bits as int16 (int16 arithmetic halves the memory traffic of int32)."""
    return w.view(torch.int16)


def choose_window(bits: torch.Tensor) -> torch.Tensor:
    """Per row, the window top E_n that leaves the fewest normal weights outside [E_n - 15, E_n].

    Ties go to the smallest E_n. Zeros, denormals, inf and NaN never count as inside. A row with
    no normal weight gets E_n = 16 (everything in it escapes).
    """
    e = (bits >> 7) & 0xFF
    normal = ((e >= 1) & (e <= 254)).to(torch.int32)
    hist = torch.zeros(bits.shape[0], 256, dtype=torch.int32, device=bits.device)
    hist.scatter_add_(1, e.long(), normal)
    cum = hist.cumsum(1)
    tops = torch.arange(WINDOW, 255, device=bits.device)  # E_n in 16..254 keeps the window normal
    inside = cum[:, tops] - cum[:, tops - WINDOW]
    return (WINDOW + inside.argmax(1)).to(torch.int32)  # argmax returns the first maximum


def _encode_rows(bits: torch.Tensor, top: torch.Tensor):
    """(view, low, escape mask) for a block of rows, given each row's window top."""
    # Window tops are 16..254, so 0 <= off <= 15 already implies a normal exponent (1..254).
    off = ((bits >> 7) & 0xFF) - (top - (WINDOW - 1)).to(torch.int16)[:, None]
    m3 = (bits >> 4) & 7
    keep = ((off & -WINDOW) == 0) & ((off | m3) != 0)  # in window and not a reserved code
    sign = (bits >> 8) & 0x80
    v = sign | (off << 3) | m3
    zero = (bits & 0x7FFF) == 0  # +0 / -0: the reserved code of their sign, no escape
    v = torch.where(keep, v, torch.where(zero, sign, 0)).to(torch.uint8)
    low = torch.where(keep, bits & 0xF, 0).to(torch.uint8)
    return v, low, ~(keep | zero)


def _raw_choice(esc_count: torch.Tensor, k: int) -> torch.Tensor:
    """Per row, True where the row is stored raw (bf16 bits) rather than coded: see format.py.

    A coded row costs 12 bits per padded column + 32 per escape (48 with int32 columns) + 40 (its
    exponent byte and escape pointer); a raw row 16 per column + its index. Rows escaping more than
    that go raw. If tile padding still makes the whole larger than 16.5 bits per weight and than
    storing every row raw (a small or oddly shaped matrix), the split with the least total is
    taken: the rows cheapest coded stay coded, the rest go raw. Below that, padding is kept (the
    GEMM reads it, but one grid of coded rows beats a second, raw product)."""
    n = esc_count.numel()
    kpad = -(-k // TILE_K) * TILE_K
    idx_bits = 16 if n <= 32767 else 32
    coded = 12 * kpad + (32 if k <= 32768 else 48) * esc_count.long() + 40
    raw = 16 * k + idx_bits
    go_raw = coded > raw
    s = int((~go_raw).sum())
    pad = lambda c: (-(-c // TILE_N) * TILE_N - c) * 12 * kpad  # padding bits of c coded rows (int or tensor)
    total = int(coded[~go_raw].sum()) + pad(s) + (n - s) * raw
    if total <= max(n * raw, 16.5 * n * k):
        return go_raw
    order = torch.argsort(coded, stable=True)
    prefix = torch.cat([coded.new_zeros(1), coded[order].cumsum(0)])
    sizes = torch.arange(n + 1)
    totals = prefix + pad(sizes) + (n - sizes) * raw
    best = int(torch.argmin(totals))  # the first minimum: the fewest coded rows at that size
    go_raw = torch.ones(n, dtype=torch.bool)
    go_raw[order[:best]] = False
    return go_raw


def _pack_records(v: torch.Tensor, low: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[N, K] view bytes and low nibbles -> [NT, KT, 12288] records (zero padding decodes to 0)."""
    nt, kt = -(-n // TILE_N), -(-k // TILE_K)
    pad = lambda t: torch.nn.functional.pad(t, (0, kt * TILE_K - k, 0, nt * TILE_N - n))
    v5 = pad(v).view(nt, TILE_N, kt, 2, HALF_K).permute(0, 2, 3, 1, 4)  # [nt, kt, half, row, col]
    l5 = pad(low).view(nt, TILE_N, kt, 2, HALF_K).permute(0, 2, 3, 1, 4)
    lowbytes = l5[:, :, 0] | (l5[:, :, 1] << 4)  # [nt, kt, row, col]
    rec = torch.cat([v5.reshape(nt, kt, VIEW_BYTES), lowbytes.reshape(nt, kt, LOW_BYTES)], dim=2)
    assert rec.shape[2] == RECORD_BYTES
    return rec.contiguous()


def encode(w: torch.Tensor) -> W12Tensor:
    """Encode a bf16 matrix [N_out, K_in]. Vectorized; runs where `w` lives (CPU or CUDA)."""
    if w.dtype != torch.bfloat16 or w.dim() != 2:
        raise W12FormatError(
            f"W12 encodes 2-D bfloat16 weights, got {tuple(w.shape)} {w.dtype}; "
            "cast with .to(torch.bfloat16) first (that cast is itself lossy for fp32 weights)"
        )
    n, k = w.shape
    w = w.contiguous()
    tops, views, lows, rows, cols, vals, counts = [], [], [], [], [], [], []
    step = max(1, _CHUNK_ELEMS // max(k, 1))
    for r0 in range(0, n, step):
        bits = _bits(w[r0 : r0 + step])
        top = choose_window(bits)
        v, low, esc = _encode_rows(bits, top)
        r, c = esc.nonzero(as_tuple=True)  # row-major order: ascending column within a row
        tops.append(top)
        views.append(v)
        lows.append(low)
        rows.append(r + r0)
        cols.append(c)
        vals.append(bits[r, c])
        counts.append(esc.sum(1, dtype=torch.int32))
    count = torch.cat(counts)
    go_raw = _raw_choice(count.cpu(), k).to(w.device)
    coded = ~go_raw
    rows, cols, vals = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    listed = coded[rows]  # the escapes of coded rows
    esc_ptr = torch.zeros(int(coded.sum()) + 1, dtype=torch.int32, device=w.device)
    esc_ptr[1:] = count[coded].cumsum(0)
    raw_rows = go_raw.nonzero().squeeze(1)
    return W12Tensor(
        shape=(n, k),
        records=_pack_records(torch.cat(views)[coded], torch.cat(lows)[coded], len(esc_ptr) - 1, k),
        exps=torch.cat(tops)[coded].to(torch.uint8),
        esc_ptr=esc_ptr,
        esc_col=cols[listed].to(torch.int16 if k <= 32768 else torch.int32),
        esc_bits=vals[listed],
        raw_rows=raw_rows.to(torch.int16 if n <= 32767 else torch.int32),
        raw_bits=_bits(w[raw_rows]).clone(),
    )


def unpack_records(t: W12Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Records -> (view bytes, low nibbles), each uint8 [N, K]."""
    n, k = t.shape
    nt, kt = t.records.shape[:2]
    rec = t.records
    v = rec[:, :, : 2 * TILE_N * HALF_K].reshape(nt, kt, 2, TILE_N, HALF_K)
    lb = rec[:, :, 2 * TILE_N * HALF_K :].reshape(nt, kt, TILE_N, HALF_K)
    low = torch.stack([lb & 0xF, lb >> 4], dim=2)  # [nt, kt, half, row, col]
    to_rows = lambda x: x.permute(0, 3, 1, 2, 4).reshape(nt * TILE_N, kt * TILE_K)[:n, :k]
    return to_rows(v), to_rows(low)


def decode(t: W12Tensor, qpass: bool = False) -> torch.Tensor:
    """Rebuild the bf16 matrix. Exact (bit for bit) unless `qpass`.

    `qpass=True` gives the Q pass's weights: the 8-bit view only, the four discarded mantissa bits
    set to the midpoint 0b1000, escapes restored exactly.
    """
    if t.n_raw:
        out = torch.empty(t.shape, dtype=torch.int16, device=t.device)
        out[t.coded_rows()] = decode(t.coded(), qpass).view(torch.int16)
        out[t.raw_rows.long()] = t.raw_bits  # raw rows are exact, in the Q pass too
        return out.view(torch.bfloat16)
    v, low = unpack_records(t)
    v = v.to(torch.int16)
    base = (t.exps.to(torch.int16)[:, None] - (WINDOW - 1)) << 7
    # s << 15 | (base + off) << 7 | m3 << 4 | l, in int16 (the shift of the sign wraps as intended)
    sign = (v << 8) & -32768
    bits = sign | (((v & 0x7F) << 4) + base) | (8 if qpass else low.to(torch.int16))
    out = torch.where((v & 0x7F) == 0, sign, bits).view(torch.bfloat16)  # reserved: a signed zero
    if t.n_escapes:
        rows = torch.repeat_interleave(
            torch.arange(t.n_out, device=t.device), (t.esc_ptr[1:] - t.esc_ptr[:-1]).long()
        )
        out.view(torch.int16)[rows, t.esc_col.long()] = t.esc_bits
    return out


def verify(t: W12Tensor, source: torch.Tensor) -> None:
    """The load-time check: raise W12FormatError unless decode(t) equals `source` bit for bit."""
    t.check()
    if tuple(source.shape) != t.shape or source.dtype != torch.bfloat16:
        raise W12FormatError(f"W12 source must be bf16 {t.shape}, got {tuple(source.shape)} {source.dtype}")
    got = decode(t).view(torch.int16)
    want = source.to(t.device).contiguous().view(torch.int16)
    if not torch.equal(got, want):
        bad = int((got != want).sum())
        raise W12FormatError(
            f"W12 restore differs from its source in {bad} of {got.numel()} weights; "
            "the encoded tensor is corrupt: re-encode it from the checkpoint"
        )
