"""Encode a bf16 matrix to W12 and decode it back, bit for bit (torch, CPU or CUDA, vectorized)."""

from __future__ import annotations

import torch

from .format import HALF_K, RECORD_BYTES, TILE_K, TILE_N, WINDOW, W12FormatError, W12Tensor

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
    v = ((bits >> 8) & 0x80) | (off << 3) | m3  # (bits >> 8) & 0x80 is the sign bit
    v = torch.where(keep, v, 0).to(torch.uint8)
    low = torch.where(keep, bits & 0xF, 0).to(torch.uint8)
    return v, low, ~keep


def _pack_records(v: torch.Tensor, low: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[N, K] view bytes and low nibbles -> [NT, KT, 12288] records (zero padding decodes to 0)."""
    nt, kt = -(-n // TILE_N), -(-k // TILE_K)
    pad = lambda t: torch.nn.functional.pad(t, (0, kt * TILE_K - k, 0, nt * TILE_N - n))
    v5 = pad(v).view(nt, TILE_N, kt, 2, HALF_K).permute(0, 2, 3, 1, 4)  # [nt, kt, half, row, col]
    l5 = pad(low).view(nt, TILE_N, kt, 2, HALF_K).permute(0, 2, 3, 1, 4)
    lowbytes = l5[:, :, 0] | (l5[:, :, 1] << 4)  # [nt, kt, row, col]
    rec = torch.cat([v5.reshape(nt, kt, -1), lowbytes.reshape(nt, kt, -1)], dim=2)
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
    tops, views, lows, cols, vals, counts = [], [], [], [], [], []
    step = max(1, _CHUNK_ELEMS // max(k, 1))
    for r0 in range(0, n, step):
        bits = _bits(w[r0 : r0 + step])
        top = choose_window(bits)
        v, low, esc = _encode_rows(bits, top)
        rows, c = esc.nonzero(as_tuple=True)  # row-major order: ascending column within a row
        tops.append(top)
        views.append(v)
        lows.append(low)
        cols.append(c)
        vals.append(bits[rows, c])
        counts.append(esc.sum(1, dtype=torch.int32))
    count = torch.cat(counts)
    esc_ptr = torch.zeros(n + 1, dtype=torch.int32, device=w.device)
    esc_ptr[1:] = count.cumsum(0)
    col_dtype = torch.int16 if k <= 32768 else torch.int32
    return W12Tensor(
        shape=(n, k),
        records=_pack_records(torch.cat(views), torch.cat(lows), n, k),
        exps=torch.cat(tops).to(torch.uint8),
        esc_ptr=esc_ptr,
        esc_col=torch.cat(cols).to(col_dtype),
        esc_bits=torch.cat(vals),
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
    v, low = unpack_records(t)
    v = v.to(torch.int16)
    base = (t.exps.to(torch.int16)[:, None] - (WINDOW - 1)) << 7
    # s << 15 | (base + off) << 7 | m3 << 4 | l, in int16 (the shift of the sign wraps as intended)
    bits = ((v << 8) & -32768) | (((v & 0x7F) << 4) + base) | (8 if qpass else low.to(torch.int16))
    out = torch.where((v & 0x7F) == 0, 0, bits).view(torch.bfloat16)
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
