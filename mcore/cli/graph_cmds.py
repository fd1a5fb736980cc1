"""`mcore graph inspect|list|tree|recipes|select|show`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..common.errors import UserError, printable
from ..common.fileio import check_output_path, check_overwrite, read_json, write_json
from ..graph.display import abi_lines, list_lines, tensor_desc, tree_lines, versions_line
from ..graph.snapshot import KIND as SNAPSHOT_KIND
from ..graph.snapshot import load_snapshot
from ..model.buildargs import add_build_args, build_args_from_namespace
from ..selection.recipes import recipe_rows, select_recipe
from ..selection.region import select_region
from .args import path_arg
from .progress_lines import stderr_progress


def say(line: str) -> None:
    """One line of output; names come from someone's file, so no terminal escapes reach the terminal."""
    print(printable(line))


def cmd_inspect(ns: argparse.Namespace) -> int:
    from ..graph.capture import capture

    check_output_path(ns.snapshot)
    args = build_args_from_namespace(ns)
    existing = None if ns.force else _snapshot_fingerprint(ns.snapshot)
    if existing == "":  # a file that is no snapshot: refused before the capture, not after it
        check_overwrite(ns.snapshot, False)
    cap = capture(args, ns.engine_role, stderr_progress())
    snap = cap.snapshot
    if existing is not None and existing != snap.fingerprint:
        check_overwrite(ns.snapshot, False)
    write_json(ns.snapshot, snap.to_dict())
    if cap.role != ns.engine_role:  # the tutorial's `decode` for a one-role (encoder) family
        print(
            f"note: {cap.family.name} has one engine role, {cap.role!r}; captured it for {ns.engine_role!r}",
            file=sys.stderr,
        )
    say(
        f"engine_role={cap.role} nodes={len(snap.nodes)} tensors={len(snap.tensors)} "
        f"recipes={len(snap.recipe_rows)} fingerprint={snap.fingerprint}"
    )
    say(versions_line(snap.metadata.get("tool_versions", {})))
    say(f"snapshot written to {ns.snapshot}")
    return 0


def cmd_list(ns: argparse.Namespace) -> int:
    snap = load_snapshot(ns.snapshot)
    lines = list_lines(snap, ns.match)
    for line in lines:
        say(line)
    if ns.match and not lines:  # an empty list alone reads like an empty graph; `SUM` for `*SUM*` is the usual slip
        hint = "" if any(c in ns.match for c in "*?[") else f"; for a part of one, try '*{ns.match}*'"
        print(
            f"note: no node of {len(snap.nodes)} matches {ns.match!r} (a glob matched whole against each node's "
            f"ID, op, layer, name and module path{hint})",
            file=sys.stderr,
        )
    return 0


def cmd_tree(ns: argparse.Namespace) -> int:
    for line in tree_lines(load_snapshot(ns.snapshot)):
        say(line)
    return 0


def cmd_recipes(ns: argparse.Namespace) -> int:
    rows = recipe_rows(load_snapshot(ns.snapshot))
    w1 = max([len("RECIPE")] + [len(r.id) for r in rows]) + 2
    w2 = max([len("INSTANCE")] + [len(r.instance) for r in rows]) + 2
    say(f"{'RECIPE':<{w1}}{'INSTANCE':<{w2}}NODES")
    for r in rows:
        say(f"{r.id:<{w1}}{r.instance:<{w2}}{','.join(r.node_ids)}")
    return 0


def parse_extra_arg(text: str) -> object:
    def no_constants(name: str):
        raise ValueError(f"non-standard constant {name}")

    try:
        return json.loads(text, parse_constant=no_constants)
    except (ValueError, RecursionError) as e:
        raise UserError(
            f"--extra-arg {text!r} is not strict JSON ({e}); e.g. '{{\"type\":\"int\",\"value\":32}}'"
        ) from None


def _snapshot_fingerprint(path: str) -> str | None:
    """The graph fingerprint of the snapshot at `path`: None when there is no file, "" when the file is
    not a snapshot. Rewriting a snapshot with the same graph loses nothing (the tutorial captures
    decode.graph.json twice); anything else falls under the overwrite rule."""
    if not Path(path).exists():
        return None
    try:
        data = read_json(path, "graph snapshot")
    except UserError:
        return ""
    fp = data.get("fingerprint") if isinstance(data, dict) and data.get("kind") == SNAPSHOT_KIND else None
    return fp if isinstance(fp, str) and fp else ""


def cmd_select(ns: argparse.Namespace) -> int:
    check_overwrite(ns.output, ns.force)
    snap = load_snapshot(ns.snapshot)
    if ns.recipe:
        if ns.nodes:
            raise UserError("give either --nodes or --recipe, not both")
        receipt = select_recipe(snap, ns.recipe[0], ns.recipe[1], ns.binding_id, ns.workspace_bytes)
    else:
        if not ns.nodes:
            raise UserError("no nodes selected; pass --nodes node:N [node:M ...] (or --recipe ID INSTANCE)")
        if not ns.binding_id:
            raise UserError("--binding-id is required for a manual selection (e.g. my.kernel@1)")
        extras = [parse_extra_arg(t) for t in ns.extra_arg]
        ws = ns.workspace_bytes or 0
        receipt = select_region(snap, ns.nodes, ns.binding_id, ws, extras, ns.output_shape_like_input)
    write_json(ns.output, receipt.to_dict())
    for line in abi_lines(receipt):
        say(line)
    say(f"receipt written to {ns.output}")
    return 0


def cmd_show(ns: argparse.Namespace) -> int:
    snap = load_snapshot(ns.snapshot)
    for ident in ns.ids:
        if ident in snap.node_by_id:
            n = snap.node(ident)
            say(f"{n.id}  {n.op}  {n.category or ''}")
            say(f"  name: {n.name}")
            say(f"  module: {n.module_path or '(root)'}")
            for label, tids in (("in ", n.inputs), ("out", n.outputs)):
                for t in tids:
                    tensor = snap.tensor(t)
                    other = tensor.producer if label == "in " else ",".join(tensor.consumers) or "(graph output)"
                    say(
                        f"  {label} {t:<12} {tensor_desc(tensor):<32} {'from' if label == 'in ' else 'to'} {other or '(graph input)'}"
                    )
        elif ident in snap.tensor_by_id:
            tensor = snap.tensor(ident)
            say(f"{tensor.id}  {tensor_desc(tensor)}  name={tensor.label}")
            say(f"  producer: {tensor.producer or '(graph input)'}")
            say(f"  consumers: {','.join(tensor.consumers) or '(none)'}")
        else:
            raise UserError(
                f"{ident} is neither a node nor a tensor of {ns.snapshot}; IDs look like node:12 or tensor:34"
            )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from .main import Parser

    g = sub.add_parser("graph", help="capture, browse and select regions of an engine-role graph")
    gs = g.add_subparsers(dest="graph_verb", metavar="VERB", parser_class=Parser)
    gs.required = True

    p = gs.add_parser("inspect", help="capture a role's graph (no weights) and write its snapshot")
    p.add_argument(
        "--engine-role",
        required=True,
        help="prefill | decode (decoders: qwen3, llama, mistral, qwen2), encoder (distilbert, bert)",
    )
    p.add_argument("--snapshot", type=path_arg, required=True, help="where to write the graph snapshot JSON")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing snapshot of another graph (the same graph is rewritten)",
    )
    add_build_args(p)
    p.set_defaults(func=cmd_inspect)

    p = gs.add_parser("list", help="list nodes (ID, op, layer, tensors); --match filters the display only")
    p.add_argument("snapshot", type=path_arg)
    p.add_argument("--match", default=None, metavar="GLOB", help="filter by node ID, op, layer, name or module path")
    p.set_defaults(func=cmd_list)

    p = gs.add_parser("tree", help="the module tree with node counts")
    p.add_argument("snapshot", type=path_arg)
    p.set_defaults(func=cmd_tree)

    p = gs.add_parser("recipes", help="recipe instances published by the family for this graph")
    p.add_argument("snapshot", type=path_arg)
    p.set_defaults(func=cmd_recipes)

    p = gs.add_parser("select", help="validate a region and write its selection receipt")
    p.add_argument("snapshot", type=path_arg)
    p.add_argument("--nodes", nargs="+", default=[], metavar="NODE")
    p.add_argument("--recipe", nargs=2, metavar=("RECIPE", "INSTANCE"), default=None)
    p.add_argument("--binding-id", default=None)
    p.add_argument(
        "--workspace-bytes", type=int, default=None, help="scratch bytes for the kernel (default: the recipe's, or 0)"
    )
    p.add_argument("--extra-arg", action="append", default=[], metavar="JSON")
    p.add_argument("--output-shape-like-input", type=int, default=None, metavar="INPUT_INDEX")
    p.add_argument("-o", "--output", type=path_arg, required=True, help="receipt path (JSON)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.set_defaults(func=cmd_select)

    p = gs.add_parser("show", help="details of nodes or tensors: dtypes, shapes, producer, consumers")
    p.add_argument("snapshot", type=path_arg)
    p.add_argument("ids", nargs="+", metavar="ID")
    p.set_defaults(func=cmd_show)
