"""Build-time receipt checks: a receipt applies only to the graph it was made from.

Turning a receipt's region into a slot happens behind the engine boundary
(mcore/engines/slots.py), where a TensorRT engine would make the same slot a plugin.
"""

from __future__ import annotations

from typing import Any

from .errors import UserError
from .selection import check_receipt, select_region


def check_receipt_against(receipt: dict[str, Any], snapshot: dict[str, Any], where: str) -> dict[str, Any]:
    """A receipt applies only to the graph it was made from: same role, fingerprint, boundary, ABI.

    Re-validates the node set on the live snapshot with the same select_region()."""
    check_receipt(receipt, where)
    role = snapshot["metadata"]["engine_role"]
    if receipt["engine_role"] != role:
        raise UserError(f"{where}: receipt is for engine role {receipt['engine_role']!r}, not {role!r}")
    if receipt["graph_fingerprint"] != snapshot["fingerprint"]:
        raise UserError(
            f"{where}: graph fingerprint {receipt['graph_fingerprint'][:12]}… does not match the graph these build args "
            f"produce ({snapshot['fingerprint'][:12]}…); recapture with `mcore graph inspect` using the same BUILD_ARGS "
            "and select again"
        )
    live = select_region(
        snapshot,
        receipt["node_ids"],
        receipt["binding_id"],
        receipt["workspace_bytes"],
        receipt["extra_args"],
        receipt["output_shape_input"],
        receipt.get("recipe"),
    )
    for field in ("input_tensor_ids", "output_tensor_ids", "abi_sha256"):
        if live[field] != receipt[field]:
            raise UserError(f"{where}: {field} differs from the live graph; recapture and select again")
    return live


def slot_record(receipt: dict[str, Any]) -> dict[str, Any]:
    """What a bundle records per kernel slot."""
    keys = (
        "binding_id",
        "abi_sha256",
        "engine_role",
        "graph_fingerprint",
        "node_ids",
        "input_tensor_ids",
        "output_tensor_ids",
        "output_shape_input",
        "workspace_bytes",
        "extra_args",
        "abi",
        "recipe",
    )
    return {k: receipt[k] for k in keys}


def slot_label(slot: dict[str, Any]) -> str:
    """A slot's name in messages: its recipe instance when it has one, else its binding ID."""
    rec = slot.get("recipe")
    return (
        f"{slot['binding_id']} [{rec['instance']}]"
        if isinstance(rec, dict) and rec.get("instance")
        else slot["binding_id"]
    )


def slot_groups(slots: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """binding ID -> its slots, in bundle order: one manifest entry binds every slot of a group
    (DESIGN.md §5). Slots that share a binding ID must share the ABI hash."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for slot in slots:
        group = groups.setdefault(slot["binding_id"], [])
        if group and group[0]["abi_sha256"] != slot["abi_sha256"]:
            raise UserError(
                f"bundle slots {slot_label(group[0])} and {slot_label(slot)} share binding ID "
                f"{slot['binding_id']} but not the ABI hash; one entry cannot bind both, rebuild the bundle"
            )
        group.append(slot)
    return groups
