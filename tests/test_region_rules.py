"""Every region rule of DESIGN.md §4 through select_region(), plus a brute-force property check."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcore.graph.snapshot import Snapshot, fingerprint
from mcore.selection.region import RegionError, check_receipt, convexity_violation, is_connected, select_region
from tests.graphs import chain_snapshot, dag_snapshot


def refp(snap):
    snap["fingerprint"] = fingerprint(snap)
    return snap


def rule_of(excinfo):
    return excinfo.value.rule


def test_chain_region_receipt_fields():
    snap = chain_snapshot(5)
    r = select_region(snap, ["node:1", "node:2"], "my.kernel@1")
    assert r.node_ids == ("node:1", "node:2")
    assert r.input_tensor_ids == ("tensor:1",)
    assert r.output_tensor_ids == ("tensor:3",)
    assert r.graph_fingerprint == snap["fingerprint"]
    assert r.engine_role == "decode"
    assert r.workspace_bytes == 0 and r.extra_args == () and r.output_shape_input is None
    assert r.to_dict()["abi"]["call"] == "run(input0, output0)"
    check_receipt(r.to_dict(), "receipt")


def test_abi_hash_covers_contract_only():
    a = select_region(chain_snapshot(5), ["node:1"], "a@1")
    b = select_region(chain_snapshot(7), ["node:4", "node:5"], "other.id@2")  # other graph, other nodes
    assert a.abi_sha256 == b.abi_sha256
    assert a.graph_fingerprint != b.graph_fingerprint
    c = select_region(chain_snapshot(5), ["node:1"], "a@1", workspace_bytes=16)
    d = select_region(chain_snapshot(5, dtype="FP16"), ["node:1"], "a@1")
    e = select_region(chain_snapshot(5), ["node:1"], "a@1", extra_args=[{"type": "int", "value": 3}])
    assert len({a.abi_sha256, c.abi_sha256, d.abi_sha256, e.abi_sha256}) == 4
    assert c.to_dict()["abi"]["call"] == "run(input0, workspace, output0)"
    assert e.to_dict()["abi"]["call"] == "run(input0, output0, extra0)"


def test_input_order_is_first_use():
    # node:0 and node:1 both read x; node:2 reads node:1's then node:0's output
    snap = dag_snapshot(4, [(0, 2), (1, 2), (2, 3)])
    # reorder node:2 inputs so tensor:2 (from node:1) comes first
    snap["nodes"][2]["inputs"] = ["tensor:2", "tensor:1"]
    refp(snap)
    r = select_region(snap, ["node:2"], "k@1")
    assert r.input_tensor_ids == ("tensor:2", "tensor:1")


@pytest.mark.parametrize(
    "ids,rule",
    [
        ([], "nodes"),
        (["node:1", "node:1"], "nodes"),
        (["node:99"], "nodes"),
        (["n1"], "nodes"),
    ],
)
def test_bad_node_lists(ids, rule):
    with pytest.raises(RegionError) as e:
        select_region(chain_snapshot(4), ids, "k@1")
    assert rule_of(e) == rule


def test_unknown_node_message_names_it():
    with pytest.raises(RegionError, match="node:99 does not exist"):
        select_region(chain_snapshot(4), ["node:99"], "k@1")


def test_duplicate_node_message():
    with pytest.raises(RegionError, match="node:1 is selected twice"):
        select_region(chain_snapshot(4), ["node:1", "node:1"], "k@1")


def test_not_connected():
    with pytest.raises(RegionError) as e:
        select_region(chain_snapshot(5), ["node:0", "node:2"], "k@1")
    assert rule_of(e) == "connected"


def test_not_convex():
    # 0 -> 1 -> 2 and 0 -> 2: region {0, 2} is connected through the edge 0->2 but the path 0->1->2 leaves and re-enters
    snap = dag_snapshot(4, [(0, 1), (1, 2), (0, 2), (2, 3)])
    with pytest.raises(RegionError) as e:
        select_region(snap, ["node:0", "node:2"], "k@1")
    assert rule_of(e) == "convex"
    assert "node:1" in str(e.value) and "node:2" in str(e.value)


def test_two_outputs():
    snap = dag_snapshot(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    with pytest.raises(RegionError) as e:
        select_region(snap, ["node:0", "node:1"], "k@1")
    assert rule_of(e) == "one_output"


def test_network_output_inside():
    with pytest.raises(RegionError) as e:
        select_region(chain_snapshot(4), ["node:2", "node:3"], "k@1")
    assert rule_of(e) == "network_output"
    assert "tensor:4" in str(e.value)


@pytest.mark.parametrize(
    "override,rule",
    [
        ({"is_shape_tensor": True, "location": "host", "dtype": "INT64", "shape": []}, "shape_or_host_tensor"),
        ({"location": "host"}, "shape_or_host_tensor"),
        ({"dtype": "INT64"}, "boundary_dtype"),
        ({"shape": [1] * 9}, "boundary_rank"),
        ({"format": "strided"}, "boundary_linear"),
    ],
)
def test_tensor_rules(override, rule):
    snap = chain_snapshot(4, tensor_overrides={2: override})  # tensor:2 = boundary input of node:2
    with pytest.raises(RegionError) as e:
        select_region(snap, ["node:2"], "k@1")
    assert rule_of(e) == rule
    assert "tensor:2" in str(e.value)


def test_internal_shape_tensor_rejected():
    snap = chain_snapshot(5, tensor_overrides={2: {"is_shape_tensor": True, "location": "host"}})
    with pytest.raises(RegionError) as e:
        select_region(snap, ["node:1", "node:2"], "k@1")
    assert rule_of(e) == "shape_or_host_tensor"


@pytest.mark.parametrize(
    "op,rule",
    [
        ("higher_order.cond", "control_flow"),
        ("_c10d_functional.all_reduce.default", "collective"),
        ("mcore.slot.default", "existing_slot"),
    ],
)
def test_forbidden_ops(op, rule):
    snap = chain_snapshot(4, ops={1: op})
    with pytest.raises(RegionError) as e:
        select_region(snap, ["node:1"], "k@1")
    assert rule_of(e) == rule


@pytest.mark.parametrize("bid", ["", "has space", "semi;colon", "slash/x", "ü@1", 5])
def test_bad_binding_ids(bid):
    with pytest.raises(RegionError) as e:
        select_region(chain_snapshot(3), ["node:1"], bid)
    assert rule_of(e) == "binding_id"


@pytest.mark.parametrize("ws", [-1, 2147483648, 1.5, True])
def test_workspace_range(ws):
    with pytest.raises(RegionError) as e:
        select_region(chain_snapshot(3), ["node:1"], "k@1", workspace_bytes=ws)
    assert rule_of(e) == "workspace"


def test_workspace_bounds_ok():
    for ws in (0, 2147483647):
        assert select_region(chain_snapshot(3), ["node:1"], "k@1", workspace_bytes=ws).workspace_bytes == ws


@pytest.mark.parametrize(
    "arg",
    [
        {"type": "float", "value": float("inf")},
        {"type": "float", "value": float("nan")},
        {"type": "int", "value": 2**31},
        {"type": "int", "value": 1.5},
        {"type": "int", "value": True},
        {"type": "ptr", "value": 4096},
        {"type": "string", "value": "x"},
        {"type": "int"},
        {"type": "int", "value": 1, "extra": 2},
        [1, 2],
    ],
)
def test_bad_extra_args(arg):
    with pytest.raises(RegionError) as e:
        select_region(chain_snapshot(3), ["node:1"], "k@1", extra_args=[arg])
    assert rule_of(e) == "extra_args"


def test_good_extra_args_normalized():
    r = select_region(
        chain_snapshot(3),
        ["node:1"],
        "k@1",
        extra_args=[
            {"type": "int", "value": 32},
            {"type": "float", "value": 0.5},
            {"type": "none"},
            {"type": "ptr", "value": None},
        ],
    )
    assert r.extra_args == (
        {"type": "int", "value": 32},
        {"type": "float", "value": 0.5},
        {"type": "none"},
        {"type": "ptr", "value": None},
    )


def test_dynamic_output_needs_rule():
    snap = chain_snapshot(4, shape=(1, -1, 8))
    with pytest.raises(RegionError) as e:
        select_region(snap, ["node:1"], "k@1")
    assert rule_of(e) == "output_shape" and "--output-shape-like-input" in str(e.value)
    r = select_region(snap, ["node:1"], "k@1", output_shape_input=0)
    assert r.output_shape_input == 0


def test_output_shape_input_must_match():
    snap = chain_snapshot(4, shape=(1, -1, 8), tensor_overrides={1: {"dtype": "FP16"}})
    with pytest.raises(RegionError, match="does not match"):
        select_region(snap, ["node:1"], "k@1", output_shape_input=0)  # input tensor:1 is FP16, output FP32
    snap = chain_snapshot(4, shape=(1, -1, 8), tensor_overrides={1: {"shape": [1, -1, 4]}})
    with pytest.raises(RegionError, match="does not match"):
        select_region(snap, ["node:1"], "k@1", output_shape_input=0)
    with pytest.raises(RegionError, match="not an input index"):
        select_region(chain_snapshot(4, shape=(1, -1, 8)), ["node:1"], "k@1", output_shape_input=3)


def test_receipt_tamper_detected():
    r = select_region(chain_snapshot(3), ["node:1"], "k@1").to_dict()
    r["abi"]["inputs"][0]["dtype"] = "FP16"
    with pytest.raises(Exception, match="abi_sha256 does not match"):
        check_receipt(r, "sel.json")
    r = select_region(chain_snapshot(3), ["node:1"], "k@1").to_dict()
    r["surprise"] = 1
    with pytest.raises(Exception, match="unknown field"):
        check_receipt(r, "sel.json")
    del r["surprise"], r["node_ids"]
    with pytest.raises(Exception, match="missing field"):
        check_receipt(r, "sel.json")


# ---------------------------------------------------------------- property: brute force on random DAGs


def all_paths_convex(succ: dict[int, set[int]], region: set[int]) -> bool:
    """Brute force: no path a -> ... -> b with a, b in region passes through a node outside."""
    n = len(succ)
    # reach[x] = nodes reachable from x by a path of length >= 1
    reach = {x: set() for x in range(n)}
    for x in reversed(range(n)):
        for y in succ[x]:
            reach[x] |= {y} | reach[y]
    for a in region:
        for c in succ[a]:
            if c in region:
                continue
            if reach[c] & region:
                return False
    return True


def weakly_connected(succ: dict[int, set[int]], region: set[int]) -> bool:
    if not region:
        return False
    adj = {x: set() for x in region}
    for a in region:
        for b in succ[a]:
            if b in region:
                adj[a].add(b)
                adj[b].add(a)
    start = next(iter(region))
    seen, stack = {start}, [start]
    while stack:
        for y in adj[stack.pop()]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return seen == region


@st.composite
def dag_and_region(draw):
    n = draw(st.integers(2, 9))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    region = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))
    return n, edges, region


@settings(max_examples=300, deadline=None)
@given(dag_and_region())
def test_connectivity_and_convexity_match_brute_force(case):
    n, edges, region = case
    snap = dag_snapshot(n, edges)
    ix = Snapshot.from_dict(snap, "dag")
    succ = {i: {b for a, b in edges if a == i} for i in range(n)}
    rset = {f"node:{i}" for i in region}
    assert is_connected(ix, rset) == weakly_connected(succ, region)
    assert (convexity_violation(ix, rset) is None) == all_paths_convex(succ, region)


def test_brute_force_helper_sanity():
    succ = {0: {1, 2}, 1: {2}, 2: set()}
    assert not all_paths_convex(succ, {0, 2})
    assert all_paths_convex(succ, {0, 1, 2})
    assert list(itertools.islice(iter([1]), 1)) == [1]
