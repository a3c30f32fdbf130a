"""Drive a real LMCache ``LocalCPUBackend`` (CPU memory, 4 chunks) through a fixed store/remove sequence.

Run with the LMCache venv's python (``make lmcache``): ``python lmcache_backend.py POLICY``, where POLICY
is ``LRU`` (LMCache's default) or ``KVCOST`` (kvcost's policy, registered first; ``KVCOST_LMCACHE_*``
choose its rule). Prints one JSON object: the chunk hashes held after each step, by step name, or
``{"error": message}`` when LMCache cannot build the backend.

The sequence: chunk x0 alone; a chain a0 a1 a2 stored by one request; a1 removed from outside (so a2 can
never be hit again); c0; then d0 needs room. LRU evicts x0, the oldest; kvcost evicts a2, the orphan.
Then x0 is pinned (in use by a lookup) and e0 needs room.
"""

import json
import sys
import time

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.pin_monitor import PinMonitor
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

#: One chunk: (K and V, 2 layers, 256 tokens, 64 channels) of bf16 = 128 KiB; the pool holds 4.
CHUNK_SHAPE = torch.Size([2, 2, 256, 64])
CHUNK_BYTES = CHUNK_SHAPE.numel() * 2
POOL_CHUNKS = 4
HASHES = {"x0": 1, "a0": 2, "a1": 3, "a2": 4, "c0": 5, "d0": 6, "e0": 7}
NAMES = {v: k for k, v in HASHES.items()}
#: Longer than kvcost's chain window: events this far apart are separate requests.
PAUSE_S = 0.2


def key(name: str) -> CacheEngineKey:
    return CacheEngineKey("tiny", 1, 0, HASHES[name], torch.bfloat16)


def store(backend: LocalCPUBackend, *names: str) -> None:
    for name in names:
        obj = backend.allocate(CHUNK_SHAPE, torch.bfloat16)
        assert obj is not None, f"no room for {name}"
        backend.submit_put_task(key(name), obj)
        obj.ref_count_down()  # the backend holds its own reference now


def held(backend: LocalCPUBackend) -> list[str]:
    return sorted(NAMES[k.chunk_hash] for k in backend.get_keys())


def main(policy: str) -> dict:
    if policy == "KVCOST":
        from kvcost.eviction.lmcache_policy import register

        register()
    config = LMCacheEngineConfig.from_defaults(chunk_size=256, local_cpu=True, cache_policy=policy)
    PinMonitor.GetOrCreate(config)  # pinning needs it (an LMCache engine creates it at start)
    pool = torch.empty(POOL_CHUNKS * CHUNK_BYTES + 4096, dtype=torch.uint8)
    try:
        backend = LocalCPUBackend(config, memory_allocator=TensorMemoryAllocator(pool))
    except ValueError as error:
        return {"error": str(error)}
    steps = {}
    store(backend, "x0")
    time.sleep(PAUSE_S)
    store(backend, "a0", "a1", "a2")
    time.sleep(PAUSE_S)
    backend.remove(key("a1"), force=True)
    store(backend, "c0")
    steps["before"] = held(backend)
    time.sleep(PAUSE_S)
    store(backend, "d0")
    steps["after_d0"] = held(backend)
    time.sleep(PAUSE_S)
    backend.pin(key("x0"))
    store(backend, "e0")
    steps["after_e0_x0_pinned"] = held(backend)
    return steps


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
