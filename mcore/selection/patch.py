"""Build-time receipt checks: a receipt applies only to the graph it was made from; and the
grouping of a bundle's slots by binding.

Turning a receipt's region into a slot happens behind the engine boundary
(mcore/engines/slots.py), where a TensorRT engine would make the same slot a plugin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from ..common.errors import UserError
from ..graph.snapshot import Snapshot
from .receipt import Receipt
from .region import select_region


def check_receipt_against(receipt: Receipt, snapshot: Snapshot, where: str) -> Receipt:
    """A receipt applies only to the graph it was made from: same role, fingerprint, boundary, ABI.

    Re-validates the node set on the live snapshot with the same select_region(). `receipt` was
    checked when it was loaded (Receipt.from_dict)."""
    role = snapshot.engine_role
    if receipt.engine_role != role:
        raise UserError(f"{where}: receipt is for engine role {receipt.engine_role!r}, not {role!r}")
    if receipt.graph_fingerprint != snapshot.fingerprint:
        raise UserError(
            f"{where}: graph fingerprint {receipt.graph_fingerprint[:12]}… does not match the graph these build args "
            f"produce ({snapshot.fingerprint[:12]}…); recapture with `mcore graph inspect` using the same BUILD_ARGS "
            "and select again"
        )
    recipe = receipt.recipe
    live = select_region(
        snapshot,
        receipt.node_ids,
        receipt.binding_id,
        receipt.workspace_bytes,
        receipt.extra_args,
        receipt.output_shape_input,
        {"id": recipe.id, "instance": recipe.instance} if recipe else None,
    )
    for field in ("input_tensor_ids", "output_tensor_ids", "abi_sha256"):
        if getattr(live, field) != getattr(receipt, field):
            raise UserError(f"{where}: {field} differs from the live graph; recapture and select again")
    return live


class SlotKey(Protocol):
    """What grouping and binding read of a slot (a SlotRecord has it)."""

    @property
    def binding_id(self) -> str: ...
    @property
    def abi_sha256(self) -> str: ...
    @property
    def engine_role(self) -> str: ...
    @property
    def label(self) -> str: ...


S = TypeVar("S", bound=SlotKey)


def slot_groups(slots: Sequence[S]) -> dict[str, list[S]]:
    """binding ID -> its slots, in bundle order: one manifest entry binds every slot of a group
    (DESIGN.md §5). Slots that share a binding ID must share the ABI hash."""
    groups: dict[str, list[S]] = {}
    for slot in slots:
        group = groups.setdefault(slot.binding_id, [])
        if group and group[0].abi_sha256 != slot.abi_sha256:
            raise UserError(
                f"bundle slots {group[0].label} and {slot.label} share binding ID "
                f"{slot.binding_id} but not the ABI hash; one entry cannot bind both, rebuild the bundle"
            )
        group.append(slot)
    return groups
