"""Data paths that move KV between tiers and workers, and their default speeds.

A transfer of ``D`` bytes over a path takes ``T_setup + D / B_effective``
(docs/architecture.md §1's lower bound), before any queueing behind other transfers on the
same path (modelled by ``kvcost.replay.tiers.Link``).

Defaults (assumptions unless a source is named):

* :data:`CPU_TO_GPU`: 22 GB/s pinned-memory copies (LMCache's measurement, Cheng
  et al. 2025, "LMCache: An Efficient KV Cache Layer for Enterprise-Scale LLM
  Inference"), 20 µs setup (one batched ``cudaMemcpyAsync`` launch).
* :data:`DISK_TO_CPU`: 5 GB/s (one PCIe 4.0 NVMe SSD's sequential read), 100 µs
  setup (NVMe read latency).
* :data:`NETWORK` (another worker or the remote store → this worker): 12 GiB/s
  with 1 ms setup (docs/architecture.md §1's example; the setup covers the request, memory
  registration and preparation).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcost.core.hardware import GIB_BYTES


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A data path's effective bandwidth and per-transfer setup cost.

    Attributes:
        bandwidth_bytes_per_s: achieved bandwidth, > 0.
        setup_s: fixed cost of each transfer (request, registration, launch), ≥ 0.
    """

    bandwidth_bytes_per_s: float
    setup_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s = {self.bandwidth_bytes_per_s}, expected a number > 0")
        if not self.setup_s >= 0:
            raise ValueError(f"setup_s = {self.setup_s}, expected a number ≥ 0")

    def duration_s(self, n_bytes: float) -> float:
        """Uncontended duration of moving ``n_bytes`` (0 for 0 bytes): ``setup_s + n_bytes / bandwidth``."""
        return self.setup_s + n_bytes / self.bandwidth_bytes_per_s if n_bytes > 0 else 0.0


CPU_TO_GPU = LinkSpec(22e9, 20e-6)
DISK_TO_CPU = LinkSpec(5e9, 100e-6)
NETWORK = LinkSpec(12 * GIB_BYTES, 1e-3)
