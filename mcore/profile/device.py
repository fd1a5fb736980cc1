"""What the device is: name, SM count, memory size, theoretical and measured memory bandwidth.

On CUDA the facts come from the CUDA runtime through cuda-python (`cuda.bindings`) where it is
installed; without it, from torch, which knows no memory clock or bus width, so the facts then
lack the theoretical bandwidth and say where they came from (`source`). The measured
device-to-device copy rate is the limit `mcore profile` compares against; on CUDA it is measured
once per device and kept under $MCORE_CACHE_DIR/devices (a copy of 512 MiB takes a moment, and
every profile and every workbench start would otherwise repeat it).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import torch

from ..common.fileio import write_json

_BANDWIDTH: dict[str, float] = {}  # per process, by torch device string


def cuda_runtime_facts(index: int) -> dict[str, Any] | None:
    """The CUDA runtime's view of device `index` through cuda.bindings, or None without it."""
    try:
        from cuda.bindings import runtime as rt
    except Exception:  # noqa: BLE001 - absent, or present without a usable driver: fall back to torch
        return None
    try:
        err, props = rt.cudaGetDeviceProperties(index)
        if int(err) != 0:
            return None

        def attr(a: Any) -> int | None:
            e, v = rt.cudaDeviceGetAttribute(a, index)
            return int(v) if int(e) == 0 else None

        clock_khz = attr(rt.cudaDeviceAttr.cudaDevAttrMemoryClockRate)
        bus_bits = attr(rt.cudaDeviceAttr.cudaDevAttrGlobalMemoryBusWidth)
        sm_clock_khz = attr(rt.cudaDeviceAttr.cudaDevAttrClockRate)
    except Exception:  # noqa: BLE001 - an older or newer binding without these names
        return None
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    facts: dict[str, Any] = {
        "name": name,
        "sm_count": int(props.multiProcessorCount),
        "memory_bytes": int(props.totalGlobalMem),
        "capability": f"{props.major}.{props.minor}",
        "source": "cuda.bindings",
    }
    uuid = getattr(props, "uuid", None)
    raw = getattr(uuid, "bytes", None)
    if isinstance(raw, (bytes, bytearray)):
        facts["uuid"] = bytes(raw).hex()
    if clock_khz and bus_bits:
        facts["memory_clock_khz"] = clock_khz
        facts["memory_bus_bits"] = bus_bits
        facts["theoretical_bytes_per_s"] = theoretical_bandwidth(clock_khz, bus_bits)
    if sm_clock_khz:
        facts["sm_clock_khz"] = sm_clock_khz
        peak = peak_bf16_flops(facts["capability"], facts["sm_count"], sm_clock_khz)
        if peak:
            facts["peak_bf16_flops_per_s"] = peak
    return facts


# Dense BF16 tensor-core FLOP per clock per SM (fp32 accumulate), by compute capability: the
# published peaks over SM count and boost clock (H100/H200 SXM 989 TFLOP/s = 132 SMs x 1.83 GHz
# x 4096; A100 312 TFLOP/s = 108 x 1.41 GHz x 2048). Other chips: unknown, so no math limit.
_BF16_FLOP_PER_CLOCK_PER_SM = {"9.0": 4096, "8.0": 2048}


def peak_bf16_flops(capability: str, sm_count: int, sm_clock_khz: int) -> float | None:
    """Theoretical dense BF16 tensor-core rate in FLOP/s at the reported SM clock, or None."""
    per = _BF16_FLOP_PER_CLOCK_PER_SM.get(capability)
    return float(per * sm_count * sm_clock_khz * 1e3) if per else None


def theoretical_bandwidth(memory_clock_khz: int, bus_bits: int) -> float:
    """Peak DRAM bandwidth in bytes/s: two transfers per memory clock (DDR) over the bus width.
    (An H200 reports 3.2 GHz and 6144 bits: about 4.9 TB/s, its published 4.8 TB/s.)"""
    return 2.0 * memory_clock_khz * 1e3 * bus_bits / 8


def device_facts(device: torch.device) -> dict[str, Any]:
    """Name, SM count, memory, capability, theoretical bandwidth (where known) and the measured
    copy rate, as profiles record them and the workbench shows them."""
    facts: dict[str, Any] = {"type": device.type}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        rt = cuda_runtime_facts(index)
        if rt is not None:
            facts.update(rt)
        else:
            p = torch.cuda.get_device_properties(index)
            facts.update(
                name=p.name,
                sm_count=p.multi_processor_count,
                memory_bytes=p.total_memory,
                capability=f"{p.major}.{p.minor}",
                source="torch (install cuda-python for the memory clock and bus width)",
            )
    else:
        facts.update(name="cpu", source="cpu")
    facts["copy_bytes_per_s"] = copy_bandwidth(device, facts)
    return facts


def copy_bandwidth(device: torch.device, facts: dict[str, Any] | None = None) -> float:
    """Measured device-to-device copy rate in bytes/s (bytes read plus written). On CUDA cached per
    device on disk (keyed by name and UUID where known); on the CPU per process."""
    key = str(device)
    if key in _BANDWIDTH:
        return _BANDWIDTH[key]
    path = None
    if device.type == "cuda" and facts is not None:
        ident = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{facts.get('name', 'cuda')}-{facts.get('uuid', key)}")
        from ..common.cache import cache_dir

        path = cache_dir("devices") / f"{ident}.json"  # owner-only, checked like every cache folder
        try:
            cached = json.loads(path.read_text())
            if float(cached["copy_bytes_per_s"]) > 0:
                _BANDWIDTH[key] = float(cached["copy_bytes_per_s"])
                return _BANDWIDTH[key]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            pass
    _BANDWIDTH[key] = _measure_copy(device)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(
                path,
                {
                    "copy_bytes_per_s": _BANDWIDTH[key],
                    "name": facts.get("name") if facts else None,
                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                },
            )
        except Exception:  # noqa: BLE001 - the cache is a convenience; the measurement stands
            pass
    return _BANDWIDTH[key]


def _measure_copy(device: torch.device) -> float:
    n = (512 << 20) if device.type == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    _sync(device)
    reps = 5
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    _sync(device)
    return 2 * n * reps / (time.perf_counter() - t)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe_device(facts: dict[str, Any]) -> str:
    """One line for headers: name, SMs, memory, measured copy rate and the theoretical peak."""
    if facts.get("type") != "cuda":
        return f"cpu · copy {facts.get('copy_bytes_per_s', 0) / 1e9:.1f} GB/s"
    parts = [str(facts.get("name", "cuda"))]
    if facts.get("sm_count"):
        parts.append(f"{facts['sm_count']} SMs")
    if facts.get("memory_bytes"):
        parts.append(f"{facts['memory_bytes'] / 2**30:.0f} GiB")
    line = f"copy {facts.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s"
    if facts.get("theoretical_bytes_per_s"):
        line += f" of {facts['theoretical_bytes_per_s'] / 1e12:.2f} TB/s peak"
    parts.append(line)
    if facts.get("peak_bf16_flops_per_s"):
        parts.append(f"bf16 {facts['peak_bf16_flops_per_s'] / 1e12:.0f} TFLOP/s peak")
    return " · ".join(parts)
