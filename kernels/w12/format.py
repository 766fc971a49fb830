"""The W12 format: a lossless 12-bit layout for bf16 weight matrices [N_out, K_in].

Per output channel n the codec picks the top exponent E_n of a 16-binade window [E_n - 15, E_n]
(biased bf16 exponents) that leaves the fewest weights outside. A weight inside the window takes
12 bits: sign s, exponent offset off = e - (E_n - 15) in 0..15, and its 7 mantissa bits m.

    view byte  v = s << 7 | off << 3 | m >> 4     (the 8-bit view the Q pass reads)
    low nibble l = m & 0xF                          (stored apart)

Records: the matrix is cut into 128 x 64 tiles (rows x columns, zero-padded at the edges); tile
(nt, kt) is record nt * KT + kt, 12288 bytes:
    [0, 4096)      view of columns  0..31, 128 rows x 32 bytes, row-major
    [4096, 8192)   view of columns 32..63, same layout
    [8192, 12288)  low bits: byte j of row r = l(r, j) | l(r, j + 32) << 4
so a record is "8 KB view then 4 KB low bits", and each 4 KB chunk is one [128, 32] uint8 tile the
GEMM loads with one wide, contiguous access.

Zeros and escapes: the view bytes with (v & 0x7F) == 0 (off = 0 and m >> 4 = 0, either sign; 32
of the 4096 codes) are reserved: they decode to a zero of the view byte's sign, so +0 and -0 are
stored in the record as v = s << 7, l = 0 and cost no more than any weight. Every other weight that
is outside its channel's window, denormal, inf or NaN, or in-window with a reserved code is stored
as v = 0, l = 0 in the record and listed in its channel's escape list (column, exact bf16 bits).

Raw rows: a channel whose escapes would cost more than its 16 raw bits per weight (12 + 32 per
escape against 16 per weight: more than one escape in 8) is not coded at all: its bf16 bits are
stored as they are (raw_bits) and its index in raw_rows. The records, exps and escape lists then
hold the remaining, coded channels in order. If tile padding makes even that larger than storing
rows raw and than 16.5 bits per weight (a small or oddly shaped matrix), the rows cheapest coded
stay coded and the rest go raw, whichever total is least. So no bf16 matrix costs more than
max(16.5, 16 + 16 / K + 32 / (N K)) bits per weight: 16.5 from K = 64 (N >= 2). The GEMM
multiplies raw rows in fp32 beside the coded ones.

NaN/inf rule: they are escapes like any other outlier, restored bit for bit (payload and sign
kept); the GEMM multiplies them with IEEE semantics, exactly as a bf16 GEMM would.

GEMM scaling: the kernels rebuild an in-window weight with the fixed exponent 112 + off, i.e.
w * 2^(127 - E_n), and multiply channel n's fp32 sum by 2^(E_n - 127) afterwards; scaling by a
power of two is exact, so this is the same sum of the same products.

GEMM range (a documented bound, tested in tests/kernels/test_w12_gemm.py): the fp32 sums hold
sum_i w_i x_i 2^(127 - E_n) before that scaling, so channel n's output is finite whenever
sum_i |w_i x_i| over its in-window weights is below 2^(E_n + 1) (1 - K 2^-23), where a bf16 GEMM's
limit is 2^128. For ordinary weights (E_n near 120) that is about 2^121 = 2.6e36: only activations
beyond ~1e34 reach it. Escapes and raw rows are summed unscaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

TILE_N = 128  # rows (output channels) of one record
TILE_K = 64  # columns (input features) of one record
HALF_K = TILE_K // 2
VIEW_BYTES = TILE_N * TILE_K  # 8 KB
LOW_BYTES = TILE_N * TILE_K // 2  # 4 KB
RECORD_BYTES = VIEW_BYTES + LOW_BYTES  # 12 KB
WINDOW = 16  # binades per channel window
REBUILD_BASE = 112  # exponent field of off = 0 in the kernels' rebuilt bf16 (127 - 15)


class W12FormatError(ValueError):
    """A W12 tensor that is malformed, or a restored tensor that differs from its source."""


@dataclass
class W12Tensor:
    """One encoded weight matrix. All tensors live on the same device.

    records:  uint8 [NT, KT, RECORD_BYTES]
    exps:     uint8 [N]      E_n, the window top (biased exponent)
    esc_ptr:  int32 [N + 1]  channel n's escapes are esc_col/esc_bits[esc_ptr[n]:esc_ptr[n + 1]]
    esc_col:  int16 [E] (int32 when K > 32767), column of each escape, ascending within a channel
    esc_bits: int16 [E]      the escaped weight's exact bf16 bits
    raw_rows: int16 [R] (int32 when N > 32767), ascending: the channels stored raw
    raw_bits: int16 [R, K]   their exact bf16 bits
    records, exps and esc_ptr cover the N - R coded channels, in ascending order.
    """

    shape: tuple[int, int]
    records: torch.Tensor
    exps: torch.Tensor
    esc_ptr: torch.Tensor
    esc_col: torch.Tensor
    esc_bits: torch.Tensor
    raw_rows: torch.Tensor | None = None
    raw_bits: torch.Tensor | None = None
    _coded_idx: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.raw_rows is None:
            self.raw_rows = torch.zeros(0, dtype=torch.int16, device=self.records.device)
        if self.raw_bits is None:
            self.raw_bits = torch.zeros(0, self.shape[1], dtype=torch.int16, device=self.records.device)

    PARTS = ("records", "exps", "esc_ptr", "esc_col", "esc_bits", "raw_rows", "raw_bits")

    @property
    def n_out(self) -> int:
        return self.shape[0]

    @property
    def k_in(self) -> int:
        return self.shape[1]

    @property
    def device(self) -> torch.device:
        return self.records.device

    @property
    def n_escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def n_raw(self) -> int:
        return int(self.raw_rows.numel())

    @property
    def n_coded(self) -> int:
        return self.shape[0] - self.n_raw

    def coded_rows(self) -> torch.Tensor:
        """Indices (int64, ascending) of the coded channels: all rows but raw_rows. Computed once
        per tensor (it syncs the device, so a CUDA graph must capture a tensor that has it)."""
        if self._coded_idx is None:
            keep = torch.ones(self.shape[0], dtype=torch.bool, device=self.device)
            keep[self.raw_rows.long()] = False
            self._coded_idx = keep.nonzero().squeeze(1)
        return self._coded_idx

    def coded(self) -> W12Tensor:
        """The coded channels alone, as a tensor of shape (N - R, K) with no raw rows."""
        if not self.n_raw:
            return self
        return W12Tensor((self.n_coded, self.shape[1]), self.records, self.exps, self.esc_ptr,
                         self.esc_col, self.esc_bits)  # fmt: skip

    def nbytes(self) -> int:
        """Every byte the format stores: records, exponents, escape lists and raw rows."""
        return sum(t.numel() * t.element_size() for t in (getattr(self, p) for p in self.PARTS))

    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes() / (self.shape[0] * self.shape[1])

    def escape_rate(self) -> float:
        return self.n_escapes / (self.shape[0] * self.shape[1])

    def stats(self) -> dict[str, float | int]:
        """bits/weight (everything counted) and the escape rate, with the byte breakdown."""
        return {
            "n_out": self.shape[0],
            "k_in": self.shape[1],
            "bits_per_weight": self.bits_per_weight(),
            "escape_rate": self.escape_rate(),
            "escapes": self.n_escapes,
            "raw_rows": self.n_raw,
            "record_bytes": self.records.numel(),
            "side_bytes": self.nbytes() - self.records.numel(),
        }

    def to(self, device: torch.device | str) -> W12Tensor:
        return W12Tensor(self.shape, *(getattr(self, p).to(device) for p in self.PARTS))

    def check(self) -> None:
        """Raise W12FormatError if the parts do not fit together."""
        n_all, k = self.shape
        r = self.n_raw
        n = n_all - r
        nt, kt = -(-n // TILE_N), -(-k // TILE_K)
        if self.raw_rows.dtype not in (torch.int16, torch.int32) or self.raw_bits.dtype != torch.int16:
            raise W12FormatError("W12 raw_rows must be int16/int32 and raw_bits int16; re-encode the weight")
        if tuple(self.raw_bits.shape) != (r, k) or r > n_all:
            raise W12FormatError(
                f"W12 raw_bits is {tuple(self.raw_bits.shape)}, expected ({r}, {k}); re-encode the weight"
            )
        rows = self.raw_rows.long()
        if r and (int(rows.min()) < 0 or int(rows.max()) >= n_all or bool((rows[1:] <= rows[:-1]).any())):
            raise W12FormatError("W12 raw_rows must be ascending rows of the matrix; re-encode the weight")
        want = {
            "records": ((nt, kt, RECORD_BYTES), torch.uint8),
            "exps": ((n,), torch.uint8),
            "esc_ptr": ((n + 1,), torch.int32),
        }
        for name, (shape, dtype) in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise W12FormatError(
                    f"W12 {name} is {tuple(t.shape)} {t.dtype}, expected {shape} {dtype}; re-encode the weight"
                )
        e = self.esc_col.numel()
        if self.esc_bits.numel() != e or self.esc_bits.dtype != torch.int16:
            raise W12FormatError("W12 esc_bits must be int16 with one entry per escape; re-encode the weight")
        if self.esc_col.dtype not in (torch.int16, torch.int32):
            raise W12FormatError("W12 esc_col must be int16 or int32; re-encode the weight")
        ptr = self.esc_ptr
        if int(ptr[0]) != 0 or int(ptr[-1]) != e or bool((ptr[1:] < ptr[:-1]).any()):
            raise W12FormatError(
                "W12 esc_ptr is not a monotone index of the escape list; re-encode the weight"
            )
        if e and (int(self.esc_col.min()) < 0 or int(self.esc_col.max()) >= k):
            raise W12FormatError("W12 esc_col holds a column outside the matrix; re-encode the weight")
