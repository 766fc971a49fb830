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

Escapes: the view bytes with (v & 0x7F) == 0 (off = 0 and m >> 4 = 0, either sign; 32 of the 4096
codes) are reserved: they decode to exactly zero. Every weight that is outside its channel's
window, zero (either sign), denormal, inf or NaN, or in-window with a reserved code is stored as
v = 0, l = 0 in the record and listed in its channel's escape list (column, exact bf16 bits).

NaN/inf rule: they are escapes like any other outlier, restored bit for bit (payload and sign
kept); the GEMM multiplies them with IEEE semantics, exactly as a bf16 GEMM would.

GEMM scaling: the kernels rebuild an in-window weight with the fixed exponent 112 + off, i.e.
w * 2^(127 - E_n), and multiply channel n's fp32 sum by 2^(E_n - 127) afterwards; scaling by a
power of two is exact, so this is the same sum of the same products.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """

    shape: tuple[int, int]
    records: torch.Tensor
    exps: torch.Tensor
    esc_ptr: torch.Tensor
    esc_col: torch.Tensor
    esc_bits: torch.Tensor

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

    def nbytes(self) -> int:
        """Every byte the format stores: records, per-channel exponents and the escape list."""
        parts = (self.records, self.exps, self.esc_ptr, self.esc_col, self.esc_bits)
        return sum(t.numel() * t.element_size() for t in parts)

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
            "record_bytes": self.records.numel(),
            "side_bytes": self.nbytes() - self.records.numel(),
        }

    def to(self, device: torch.device | str) -> W12Tensor:
        move = lambda t: t.to(device)
        return W12Tensor(
            self.shape,
            move(self.records),
            move(self.exps),
            move(self.esc_ptr),
            move(self.esc_col),
            move(self.esc_bits),
        )

    def check(self) -> None:
        """Raise W12FormatError if the parts do not fit together."""
        n, k = self.shape
        nt, kt = -(-n // TILE_N), -(-k // TILE_K)
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
