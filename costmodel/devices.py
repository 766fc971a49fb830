"""Device peaks the byte floors divide by (ARCHITECTURE §7, paper §3.2).

GPU figures are datasheet peaks (dense tensor-core FLOP/s per dtype, HBM/GDDR bandwidth). The
byte-floor rule takes 60% of peak FLOP/s and 90% of peak bandwidth, so the floors stay below what
good kernels reach. The RTX PRO 6000 also carries the paper's measured 1.51 TB/s, for the report
only: 90% of it (1.36 TB/s) is below what the paper's own BF16 LM head reached on that card (2.54
GB in 1750 µs = 1.45 TB/s), so a floor built on it would not be a floor. A CPU has no datasheet
figure we can trust for one pinned core, so its peaks are measured on the spot (`cpu_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.deployments import Deployment, Home, SpecPilotError

FLOP_EFFICIENCY = 0.6  # the floor's share of peak dense FLOP/s
BYTE_EFFICIENCY = 0.9  # the floor's share of peak bandwidth


@dataclass(frozen=True)
class DeviceSpec:
    """Peaks of one device slot: FLOP/s per dtype and bytes/s."""

    name: str
    flops: dict[str, float]  # dtype -> peak dense FLOP/s
    bandwidth: float  # peak bytes/s (the floor uses BYTE_EFFICIENCY of it)
    measured_bandwidth: float | None = None  # a measured copy bandwidth, reported beside the peak
    source: str = "datasheet"
    notes: dict[str, str] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for the weights' dtype; fp8 falls back to the bf16 figure if absent."""
        if dtype in self.flops:
            return self.flops[dtype]
        if dtype in ("fp8", "float16") and "bfloat16" in self.flops:
            return self.flops["bfloat16"]
        known = ", ".join(self.flops)
        raise SpecPilotError(f"device {self.name}: no peak FLOP/s for dtype {dtype!r} (known: {known})")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "flops": dict(self.flops),
            "bandwidth": self.bandwidth,
            "measured_bandwidth": self.measured_bandwidth,
            "source": self.source,
            "notes": dict(self.notes),
        }


# Dense (no sparsity) tensor-core peaks; float32 is the CUDA-core rate (no TF32).
H100_SXM5 = DeviceSpec(
    name="NVIDIA H100 SXM5",
    flops={"bfloat16": 989e12, "float16": 989e12, "fp8": 1979e12, "float32": 67e12},
    bandwidth=3.35e12,
)
H200 = DeviceSpec(
    name="NVIDIA H200",
    flops={"bfloat16": 989e12, "float16": 989e12, "fp8": 1979e12, "float32": 67e12},
    bandwidth=4.8e12,
)
RTX_PRO_6000 = DeviceSpec(
    name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    flops={"bfloat16": 503.8e12, "float16": 503.8e12, "fp8": 1007.6e12, "float32": 125.95e12},
    bandwidth=1.792e12,
    measured_bandwidth=1.51e12,
    notes={"measured_bandwidth": "paper §5.1"},
)

GPU_SPECS: dict[str, DeviceSpec] = {"h100": H100_SXM5, "h200": H200, "rtx-pro-6000": RTX_PRO_6000}


def device_spec(dep: Deployment, home: Home, *, refresh: bool = False) -> DeviceSpec:
    """The peaks for the deployment's device kind; a CPU is probed on its first slot (cached)."""
    if dep.devices.kind in GPU_SPECS:
        return GPU_SPECS[dep.devices.kind]
    from .cpu_probe import cpu_peaks  # a probe subprocess: only when a CPU deployment asks

    core = int(dep.devices.slots[0].split(":")[1])
    got = cpu_peaks(home, core=core, dtype=dep.target.dtype, refresh=refresh)
    return DeviceSpec(
        name=f"{got['model']} (1 core)",
        flops={dep.target.dtype: got["flops"]},
        bandwidth=got["bandwidth"],
        measured_bandwidth=got["bandwidth"],
        source="probe",
        notes={"probed_on_core": str(got["core"]), "cache": got["cache"]},
    )
