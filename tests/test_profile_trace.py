"""The kernel-time bookkeeping of a compiled profile (mcore/profile/trace.py) on hand-made traces:
what the profiler gives on CUDA (device activities linked to host ops; a CUDA graph's replays with
no host op per kernel; kernels that overlap under programmatic dependent launch; activities lost at
the start of a session) and on the CPU (kernel ranges inside the compiled graph's range)."""

from __future__ import annotations

import pytest

from mcore.profile.trace import (
    DeviceEvent,
    HostEvent,
    align,
    device_step,
    host_name,
    host_step,
    launch_sequence,
    median_step,
    replay_steps,
    step_calls,
    windows,
)

US = 1e-6


def tree(step: HostEvent, *children: HostEvent) -> HostEvent:
    for c in children:
        c.parent = step
        step.children.append(c)
    return step


def test_host_names_of_provenance_kernels():
    assert host_name("extern_kernels.mm") == ("aten::mm", False)
    assert host_name("torch.ops.mcore.gemv.default") == ("mcore::gemv", False)
    assert host_name("aten.addmm.default") == ("aten::addmm", False)
    assert host_name("triton_poi_fused_add_0") == ("triton_poi_fused_add_0", True)


def test_cpu_step_charges_each_kernel_range_and_the_rest_is_between_kernels():
    """C++ kernels mark themselves `graph_N_<name>`; extern calls are dispatcher ops; other host
    work inside the compiled graph's range (allocation) is time between kernels."""
    wrapper = HostEvent("## Call CompiledFxGraph None ##", 10 * US, 90 * US)
    tree(
        wrapper,
        HostEvent("graph_0_cpp_fused_add_0", 12 * US, 20 * US),
        HostEvent("aten::empty_strided", 21 * US, 22 * US),  # not a kernel call
        HostEvent("aten::mm", 25 * US, 55 * US),
        HostEvent("graph_0_cpp_fused_add_0", 60 * US, 64 * US),  # the same kernel, called again
    )
    step = tree(
        HostEvent("mcore.profile.step", 0.0, 100 * US),
        tree(HostEvent("Torch-Compiled Region", 5 * US, 95 * US), wrapper),
    )
    kernels = ["cpp_fused_add_0", "extern_kernels.mm", "cpp_fused_add_0"]
    assert [e.start for e in step_calls(step)] == [12 * US, 21 * US, 25 * US, 60 * US]
    t = host_step(step, kernels)
    assert t.calls == pytest.approx([8 * US, 30 * US, 4 * US])
    assert t.between == pytest.approx(100 * US - 42 * US)
    assert t.span == pytest.approx(100 * US) and t.gaps == 4


def test_align_leaves_a_kernel_the_trace_lacks_without_time():
    events = [HostEvent("aten::mm", 0, 1), HostEvent("triton_a", 1, 2)]
    got = align(["triton_missing", "extern_kernels.mm", "triton_a"], events)
    assert got == [None, events[0], events[1]]


def test_device_activities_follow_their_launching_host_op_to_the_kernel_call():
    """Kernels link to the host op that launched them (a Triton range, or an op inside an extern
    call such as the fill inside mcore::decode_attention); a launch outside any call is unmapped;
    an activity from outside the step (another step, a spin) is not the step's."""
    wrapper = HostEvent("## Call CompiledFxGraph None ##", 0, 100 * US)
    tri = HostEvent("triton_poi_fused_0", 1 * US, 2 * US, id=1)
    attn = HostEvent("mcore::decode_attention", 3 * US, 9 * US, id=2)
    fill = HostEvent("aten::fill_", 4 * US, 5 * US, id=3)
    zero = HostEvent("aten::zero_", 10 * US, 11 * US, id=4)
    tree(attn, fill)
    tree(wrapper, tri, attn, zero)
    step = tree(HostEvent("mcore.profile.step", 0, 100 * US), wrapper)
    by_id = {e.id: e for e in (tri, attn, fill, zero)}
    device = [
        DeviceEvent("split", 30 * US, 40 * US, link=2),
        DeviceEvent("triton_poi_fused_0", 10 * US, 20 * US, link=1),
        DeviceEvent("fill", 25 * US, 28 * US, link=3),
        DeviceEvent("memset", 45 * US, 46 * US, link=4),
        DeviceEvent("spin", 0, 5 * US, link=99),
    ]
    seq = launch_sequence(step, ["triton_poi_fused_0", "torch.ops.mcore.decode_attention.default"], device, by_id)
    assert [(d.name, c) for d, c in seq] == [("triton_poi_fused_0", 0), ("fill", 1), ("split", 1), ("memset", None)]


def test_overlapping_kernels_are_charged_once_and_gaps_are_between_kernels():
    """Under programmatic dependent launch a kernel starts before the previous one ends: each is
    charged what no earlier one covers; idle time up to the next step's first kernel is between
    kernels; charges, unmapped time and gaps add up to the step's period."""
    run = [
        DeviceEvent("a", 0, 10 * US),
        DeviceEvent("b", 8 * US, 20 * US),  # overlaps a by 2 us
        DeviceEvent("c", 25 * US, 30 * US),  # 5 us gap
        DeviceEvent("d", 26 * US, 28 * US),  # entirely inside c
    ]
    t = device_step(run, [0, 1, 1, None], 2, next_start=34 * US)
    assert t.calls == pytest.approx([10 * US, 10 * US + 5 * US])  # b: 20 - 10; c: 5; d: covered by c
    assert t.unmapped == pytest.approx(0.0)
    assert t.between == pytest.approx(5 * US + 4 * US) and t.gaps == 2
    assert t.span == pytest.approx(34 * US)
    assert t.device_names == [["a"], ["b", "c"]]


def test_replays_are_found_by_their_launch_sequence():
    """A replay trace: a spin first, activities lost at the session's start (the first step cut
    short), then whole steps back to back. Each step runs from one occurrence of the step's first
    kernel to the next (the last is left out: its tail is unknown); activities align by name with
    the launches without the graph, a library kernel that differs under capture taking its call's."""
    seq = [("triton_a", 0), ("libgemm_x", 1), ("triton_b", 2)]
    acts = [DeviceEvent("spin", 0, 50 * US)]
    acts += [DeviceEvent("libgemm_x", 51 * US, 60 * US), DeviceEvent("triton_b", 60 * US, 61 * US)]  # cut short
    t0 = 100 * US
    for k in range(3):
        base = t0 + k * 30 * US
        acts += [
            DeviceEvent("triton_a", base, base + 5 * US),
            DeviceEvent("libgemm_y", base + 6 * US, base + 20 * US),  # another pick than the eager run's
            DeviceEvent("triton_b", base + 21 * US, base + 25 * US),
        ]
    assert len(windows(seq, acts)) == 2
    steps = replay_steps(seq, acts, 3)
    assert len(steps) == 2
    for s in steps:
        assert s.calls == pytest.approx([5 * US, 14 * US, 4 * US])
        assert s.between == pytest.approx(7 * US) and s.span == pytest.approx(30 * US)
        assert s.device_names == [["triton_a"], ["libgemm_y"], ["triton_b"]]
    assert median_step(steps).span == pytest.approx(30 * US)
    assert windows([("triton_a", 0)], [DeviceEvent("triton_z", 0, 1)]) == []


def test_replayed_steps_align_around_activities_only_one_side_has():
    """A copy the eager run made that the graph does not hold, and a fill only the graph holds: the
    rest still aligns, the fill is charged to no call (but counted in the step)."""
    seq = [("triton_a", 0), ("Memcpy HtoD", None), ("mm", 1), ("triton_b", 2)]
    acts = []
    for k in range(3):
        base = k * 20 * US
        acts += [
            DeviceEvent("triton_a", base, base + 2 * US),
            DeviceEvent("mm", base + 3 * US, base + 9 * US),
            DeviceEvent("Memset (Device)", base + 9 * US, base + 10 * US),
            DeviceEvent("triton_b", base + 11 * US, base + 12 * US),
        ]
    (first, second) = replay_steps(seq, acts, 3)
    assert first.calls == pytest.approx([2 * US, 6 * US, 1 * US])
    assert first.unmapped == pytest.approx(1 * US) and first.span == pytest.approx(20 * US)
    # too little aligns: not the step the eager run launched
    assert replay_steps([("triton_a", 0), ("x", 1), ("y", 2), ("z", 3)], acts, 4) == []
