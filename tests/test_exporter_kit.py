"""mcore/kernels/exporter_kit.py: the one kit every CuTe DSL exporter imports (the generated stubs, the committed
residual-add example and the decode-attention exporter). What it must guarantee without the CuTe DSL:
it imports light, the ABI order is Receipt.call_args', a `run` in another order is refused, and a
generated stub uses only the kit's public names (so a stub written today keeps working)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

import mcore
from mcore.kernels import exporter_kit as kit
from mcore.selection.receipt import Receipt
from tests.test_stubgen import receipts

from .conftest import REPO, repo_env


@pytest.fixture(scope="module")
def cases() -> dict[str, tuple[dict, dict]]:
    return receipts()


def test_the_kit_is_public_and_imports_without_torch_or_the_cute_dsl():
    assert mcore.kernels.exporter_kit is kit and "exporter_kit" in mcore.__all__
    code = (
        "import sys; from mcore import exporter_kit; print(sorted(m for m in ('torch', 'cutlass') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=repo_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_arguments_by_role_come_out_in_the_receipts_abi_order(cases):
    receipt = Receipt.of(cases["workspace_extras"][1])  # 3 inputs, a workspace, 1 output, 4 extra args
    names = kit.generic_names(receipt)
    assert names.in_call_order(receipt) == receipt.call_params()
    assert names.in_call_order(receipt) == [
        "input0",
        "input1",
        "input2",
        "workspace",
        "output0",
        "extra0",
        "extra1",
        "extra2",
        "extra3",
    ]
    plain = Receipt.of(cases["add"][1])  # no workspace: the role's value is left out
    assert kit.Boundary(["a", "b"], "ws", ["out"]).in_call_order(plain) == ["a", "b", "out"]
    with pytest.raises(ValueError, match="do not match its ABI"):
        kit.Boundary(["a"], None, ["out"]).in_call_order(plain)


def test_a_run_in_another_order_is_refused_before_compiling(cases):
    receipt = Receipt.of(cases["workspace_extras"][1])

    def run(input0, input1, input2, workspace, output0, extra0, extra1, extra2, extra3, stream):
        pass

    def swapped(input0, input1, input2, output0, workspace, extra0, extra1, extra2, extra3, stream):
        pass

    names, fakes = kit.generic_names(receipt), kit.Boundary([1, 2, 3], 4, [5], [6, 7, 8, 9])
    kit.check_signature(kit.Kernel(run, names, fakes), receipt)
    with pytest.raises(kit.ExportError, match=r"does not take the receipt's arguments in ABI order"):
        kit.check_signature(kit.Kernel(swapped, names, fakes), receipt)


def test_the_shipped_exporters_and_a_generated_stub_use_only_the_kits_public_names(cases, tmp_path):
    from mcore.kernels.stubgen import generate_exporter

    stub = tmp_path / "stub.py"
    stub.write_text(generate_exporter(*reversed(cases["workspace_extras"])))
    public = set(kit.__all__)
    for path in (
        stub,
        REPO / "kernels" / "cutedsl_decode_attention.py",
        REPO / "kernels" / "export_cutedsl_residual_add.py",
    ):
        used = {
            n.attr
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "kit"
        }
        assert used and used <= public, (path.name, used - public)


def test_fixed_contract_names_the_first_difference(cases, tmp_path):
    """A stub's constants against another receipt: the boundary is compared first, then the call."""
    snap, base = cases["tutorial"]
    receipt = Receipt.of(base)
    contract = kit.FixedContract(
        binding_id=receipt.binding_id,
        graph_fingerprint=receipt.graph_fingerprint,
        abi_sha256=receipt.abi_sha256,
        node_ids=list(receipt.node_ids),
        inputs=[{"tensor_id": e.tensor_id, "dtype": e.dtype, "shape": list(e.shape)} for e in receipt.inputs],
        workspace_bytes=0,
        outputs=[{"tensor_id": e.tensor_id, "dtype": e.dtype, "shape": list(e.shape)} for e in receipt.outputs],
        extra_args=[],
        output_shape_input=None,
    )
    contract.check(receipt, "r.json")  # its own receipt passes
    with pytest.raises(kit.ContractError, match="input 0 is BF16 but this exporter takes FP16"):
        contract.check(Receipt.of(cases["multi"][1]), "r.json")
    with pytest.raises(kit.ContractError, match="selection has 1 inputs"):
        contract.check(Receipt.of(cases["cast"][1]), "r.json")
