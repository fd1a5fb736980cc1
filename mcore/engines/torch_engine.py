"""Engine `torch`: runs the captured ATen graph (patched with kernel slots) on CPU or CUDA."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import fx

from ..graph.snapshot import _skip
from ..patch import apply_slot


class TorchRoleRunner:
    def __init__(self, gm: fx.GraphModule, state_args: list[torch.Tensor], n_user_outputs: int, output_index: list[int]):
        self.gm = gm
        self.state_args = state_args
        self.output_index = output_index

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            outs = self.gm(*self.state_args, *inputs)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return tuple(outs[i] for i in self.output_index)


class TorchEngine:
    name = "torch"

    def compile_role(self, captured: Any, state: dict[str, torch.Tensor], slots: Sequence[tuple[dict, Any]],
                     device: torch.device) -> TorchRoleRunner:
        ep: torch.export.ExportedProgram = captured.exported
        gm = copy.deepcopy(ep.graph_module)  # the graph only: parameters are meta, values come from `state`
        sig = ep.graph_signature
        targets: dict[str, str] = {}
        targets.update(sig.inputs_to_parameters)
        targets.update(sig.inputs_to_buffers)
        targets.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        n_user = len(sig.user_inputs)
        lifted = placeholders[: len(placeholders) - n_user]
        missing = [targets[p.name] for p in lifted if targets[p.name] not in state]
        if missing:
            raise RuntimeError(f"no value for lifted tensors {missing[:4]}")
        state_args = [state[targets[p.name]] for p in lifted]
        # Capture ran on the meta device: point device arguments at the real device, drop meta asserts.
        for node in list(gm.graph.nodes):
            if _skip(node) and not node.users:
                gm.graph.erase_node(node)
                continue
            if node.op == "call_function" and isinstance(node.kwargs.get("device"), torch.device):
                node.update_kwarg("device", device)
        constants = {targets[p.name]: p for p in lifted}
        for slot, call in slots:
            apply_slot(gm, captured.snapshot, slot, call, constants)
        gm.recompile()
        out_specs = list(sig.output_specs)
        user_index = [i for i, s in enumerate(out_specs) if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
        return TorchRoleRunner(gm, state_args, len(user_index), user_index)
