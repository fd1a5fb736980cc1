"""Device facts (mcore/profile/device.py): the CUDA runtime's view through cuda-python, the theoretical
bandwidth from memory clock and bus width, and the measured copy rate cached per device."""

from __future__ import annotations

import json

import pytest
import torch

from mcore.profile import device as D


def test_theoretical_bandwidth_from_clock_and_bus():
    # an H200 reports a 3.2 GHz memory clock and a 6144-bit bus: its published 4.8 TB/s, within 3%
    assert D.theoretical_bandwidth(3_201_000, 6144) == pytest.approx(4.8e12, rel=0.03)
    # an A100-40GB: 1215 MHz, 5120 bits -> 1.555 TB/s as published
    assert D.theoretical_bandwidth(1_215_000, 5120) == pytest.approx(1.555e12, rel=0.01)


@pytest.mark.timing
def test_cpu_facts_say_what_they_are():
    f = D.device_facts(torch.device("cpu"))
    assert f["type"] == "cpu" and f["name"] == "cpu" and f["copy_bytes_per_s"] > 1e8
    assert D.describe_device(f).startswith("cpu · copy ")


def test_copy_rate_is_measured_once_per_device_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(D, "_BANDWIDTH", {})
    calls = []
    monkeypatch.setattr(D, "_measure_copy", lambda device: calls.append(device) or 4.2e12)
    facts = {"name": "NVIDIA H200", "uuid": "ab12"}
    dev = torch.device("cuda:0")
    assert D.copy_bandwidth(dev, facts) == 4.2e12 and len(calls) == 1
    saved = json.loads((tmp_path / "devices" / "NVIDIA_H200-ab12.json").read_text())
    assert saved["copy_bytes_per_s"] == 4.2e12
    monkeypatch.setattr(D, "_BANDWIDTH", {})  # a new process: read from the cache, no second measurement
    assert D.copy_bandwidth(dev, facts) == 4.2e12 and len(calls) == 1
    # another device (another UUID) is measured on its own; a damaged cache file is measured again
    assert D.copy_bandwidth(torch.device("cuda:1"), {"name": "NVIDIA H200", "uuid": "cd34"}) == 4.2e12
    (tmp_path / "devices" / "NVIDIA_H200-ab12.json").write_text("{not json")
    monkeypatch.setattr(D, "_BANDWIDTH", {})
    assert D.copy_bandwidth(dev, facts) == 4.2e12 and len(calls) == 3


def test_describe_a_cuda_device():
    f = {
        "type": "cuda",
        "name": "NVIDIA H200",
        "sm_count": 132,
        "memory_bytes": 141 * 2**30,
        "copy_bytes_per_s": 4.29e12,
        "theoretical_bytes_per_s": 4.92e12,
    }
    assert D.describe_device(f) == "NVIDIA H200 · 132 SMs · 141 GiB · copy 4.29 TB/s of 4.92 TB/s peak"


@pytest.mark.timing
@pytest.mark.gpu
def test_gpu_runtime_facts_agree_with_torch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    f = D.device_facts(torch.device("cuda"))
    p = torch.cuda.get_device_properties(0)
    assert f["name"] == p.name and f["sm_count"] == p.multi_processor_count
    assert abs(f["memory_bytes"] - p.total_memory) <= 0.02 * p.total_memory
    if f["source"] == "cuda.bindings":  # cuda-python present: the peak is known and above the copy rate
        assert f["theoretical_bytes_per_s"] > f["copy_bytes_per_s"] * 0.9
        if f["capability"] == "9.0" and f.get("sm_clock_khz"):  # H100/H200: the ~1 PFLOP/s dense BF16 peak
            assert 0.85e15 < f["peak_bf16_flops_per_s"] < 1.2e15, f


def test_peak_bf16_math_from_sms_and_clock():
    # H100/H200 SXM: 132 SMs at the 1.83 GHz boost its datasheet uses -> the published 989 TFLOP/s
    assert D.peak_bf16_flops("9.0", 132, 1_830_000) == pytest.approx(989.4e12, rel=0.001)
    # A100: 108 SMs at 1.41 GHz -> 312 TFLOP/s
    assert D.peak_bf16_flops("8.0", 108, 1_410_000) == pytest.approx(312e12, rel=0.005)
    assert D.peak_bf16_flops("7.5", 40, 1_590_000) is None  # not known: no math limit is claimed
    f = {"type": "cuda", "name": "NVIDIA H200", "copy_bytes_per_s": 4.06e12, "peak_bf16_flops_per_s": 1.07e15}
    assert D.describe_device(f).endswith("copy 4.06 TB/s · bf16 1070 TFLOP/s peak")
