"""The profile report, typed: what `profile_pipeline` returns, `load_profile` reads back and the CLI,
the workbench and the benchmarks read as fields.

`to_dict()` is the JSON object the profiler wrote before the report was typed (the profile file,
schema_version 2, contract.py), key for key and in the same order, so files and their hashes stay
as they were (tests/test_profile_report.py pins it); `from_dict()` reads a checked file back. A
file whose keys stand in another order (one written by hand) reads to the same report and writes
in the profiler's order. Sequences are tuples here and lists in JSON; numbers pass through as they
came (a slot's bytes are a float on the compiled engine, an int op by op: JSON writes them apart).

No torch here: `from mcore import ProfileReport` stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

Json = dict[str, Any]

SCHEMA_VERSION = 2
KIND = "mcore-profile"


def _tuple(v: Any) -> tuple | None:
    return None if v is None else tuple(v)


@dataclass(frozen=True)
class Rates:
    """A row's time, bytes and FLOPs per step, and what they make of it: its share of the attributed
    total, the achieved rates, the time at the limit (the roofline), that over the time, and the
    headroom (the time minus the limit: the most a kernel could save)."""

    seconds: float
    bytes: float
    flops: float
    share: float
    bytes_per_s: float
    flops_per_s: float
    limit_seconds: float
    ratio_to_limit: float
    headroom_seconds: float

    def amounts(self) -> Json:
        """The measured part, which every row writes before its own counts."""
        return {"seconds": self.seconds, "bytes": self.bytes, "flops": self.flops}

    def derived(self) -> Json:
        """The part computed from the amounts, which every row writes last."""
        return {
            "share": self.share,
            "bytes_per_s": self.bytes_per_s,
            "flops_per_s": self.flops_per_s,
            "limit_seconds": self.limit_seconds,
            "ratio_to_limit": self.ratio_to_limit,
            "headroom_seconds": self.headroom_seconds,
        }

    @classmethod
    def from_dict(cls, d: Json) -> Rates:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ProfileNode:
    """A snapshot node: what it is, the slot (binding ID) that computes it if any, and its rates."""

    id: str
    name: str
    op: str
    module_path: str
    binding_id: str | None
    rates: Rates

    def to_dict(self) -> Json:
        head = {"id": self.id, "name": self.name, "op": self.op, "module_path": self.module_path}
        return head | {"binding_id": self.binding_id} | self.rates.amounts() | self.rates.derived()

    @classmethod
    def from_dict(cls, d: Json) -> ProfileNode:
        return cls(d["id"], d["name"], d["op"], d["module_path"], d["binding_id"], Rates.from_dict(d))


@dataclass(frozen=True)
class ProfileModule:
    """A module subtree (or "<root>"): the nodes under it, summed."""

    path: str
    calls: int
    rates: Rates

    def to_dict(self) -> Json:
        return {"path": self.path} | self.rates.amounts() | {"calls": self.calls} | self.rates.derived()

    @classmethod
    def from_dict(cls, d: Json) -> ProfileModule:
        return cls(d["path"], d["calls"], Rates.from_dict(d))


@dataclass(frozen=True)
class ProfileRecipe:
    """A recipe instance: its nodes, summed (`calls`: how many of them were timed)."""

    recipe: str
    instance: str
    node_ids: tuple[str, ...]
    calls: int
    output_shape_input: int | None
    rates: Rates

    def to_dict(self) -> Json:
        out = {"recipe": self.recipe, "instance": self.instance, "node_ids": list(self.node_ids)}
        out |= self.rates.amounts() | {"calls": self.calls, "output_shape_input": self.output_shape_input}
        return out | self.rates.derived()

    @classmethod
    def from_dict(cls, d: Json) -> ProfileRecipe:
        return cls(
            d["recipe"], d["instance"], tuple(d["node_ids"]), d["calls"], d["output_shape_input"], Rates.from_dict(d)
        )


@dataclass(frozen=True)
class ProfileSlot:
    """A bound slot, by binding ID: its calls in the step and their rates."""

    binding_id: str
    calls: int
    rates: Rates

    def to_dict(self) -> Json:
        return {"binding_id": self.binding_id} | self.rates.amounts() | {"calls": self.calls} | self.rates.derived()

    @classmethod
    def from_dict(cls, d: Json) -> ProfileSlot:
        return cls(d["binding_id"], d["calls"], Rates.from_dict(d))


@dataclass(frozen=True)
class ProfileKernel:
    """A kernel call of a compiled step: its place in the call order, the snapshot nodes it computes,
    its rates, and on CUDA the device activities it launched."""

    kernel: str
    order: int
    node_ids: tuple[str, ...]
    rates: Rates
    device_kernels: tuple[str, ...] | None = None

    def to_dict(self) -> Json:
        out = {"kernel": self.kernel, "order": self.order} | self.rates.amounts()
        if self.device_kernels is not None:
            out["device_kernels"] = list(self.device_kernels)
        return out | {"node_ids": list(self.node_ids)} | self.rates.derived()

    @classmethod
    def from_dict(cls, d: Json) -> ProfileKernel:
        return cls(d["kernel"], d["order"], tuple(d["node_ids"]), Rates.from_dict(d), _tuple(d.get("device_kernels")))


@dataclass(frozen=True)
class KernelSplit:
    """A fused kernel a slot over a candidate would split: its nodes inside and outside the region,
    its time and call order where timed (a compiled profile), and what the split costs at least."""

    kernel: str
    order: int | None
    inside: int
    outside: int
    seconds: float | None
    cost_seconds: float

    def to_dict(self) -> Json:
        return {
            "kernel": self.kernel,
            "order": self.order,
            "inside": self.inside,
            "outside": self.outside,
            "seconds": self.seconds,
            "cost_seconds": self.cost_seconds,
        }

    @classmethod
    def from_dict(cls, d: Json) -> KernelSplit:
        return cls(d["kernel"], d["order"], d["inside"], d["outside"], d["seconds"], d["cost_seconds"])


@dataclass(frozen=True)
class ProfileCandidate:
    """A region worth a kernel: a recipe instance (`recipe`, `instance`) or a module subtree
    (`module_path`) whose nodes select_region() accepts, its time and headroom, the command that
    makes its receipt, and the fused kernels a slot there would split (None: no kernels known, an
    op-by-op profile without --fusion) with their cost and the headroom net of it."""

    kind: str  # "recipe" or "region"
    node_ids: tuple[str, ...]
    output_shape_input: int | None
    seconds: float
    share: float
    headroom_seconds: float
    command: str
    split_cost_seconds: float
    net_headroom_seconds: float
    recipe: str | None = None
    instance: str | None = None
    module_path: str | None = None
    splits: tuple[KernelSplit, ...] | None = None

    @property
    def name(self) -> str:
        """What a list shows: the recipe instance, or the module path of a region."""
        return str(self.instance if self.kind == "recipe" else self.module_path)

    def to_dict(self) -> Json:
        out: Json = {"kind": self.kind}
        if self.kind == "recipe":
            out |= {"recipe": self.recipe, "instance": self.instance}
        else:
            out["module_path"] = self.module_path
        out |= {"node_ids": list(self.node_ids), "output_shape_input": self.output_shape_input}
        out |= {"seconds": self.seconds, "share": self.share, "headroom_seconds": self.headroom_seconds}
        out["command"] = self.command
        if self.splits is not None:
            out["splits"] = [s.to_dict() for s in self.splits]
        return out | {"split_cost_seconds": self.split_cost_seconds, "net_headroom_seconds": self.net_headroom_seconds}

    @classmethod
    def from_dict(cls, d: Json) -> ProfileCandidate:
        splits = d.get("splits")
        return cls(
            d["kind"],
            tuple(d["node_ids"]),
            d["output_shape_input"],
            d["seconds"],
            d["share"],
            d["headroom_seconds"],
            d["command"],
            d["split_cost_seconds"],
            d["net_headroom_seconds"],
            d.get("recipe"),
            d.get("instance"),
            d.get("module_path"),
            None if splits is None else tuple(KernelSplit.from_dict(s) for s in splits),
        )


@dataclass(frozen=True)
class ProfileEngine:
    """The engine profiled (`compiled` or `torch`) and how it ran."""

    name: str
    how: str

    def to_dict(self) -> Json:
        return {"name": self.name, "how": self.how}


@dataclass(frozen=True)
class ProfileBundle:
    """The bundle profiled: its model, the role's fingerprint, its build args (as the manifest has them)."""

    model: str
    fingerprint: str
    build_args: Json

    def to_dict(self) -> Json:
        return {"model": self.model, "fingerprint": self.fingerprint, "build_args": dict(self.build_args)}


@dataclass(frozen=True)
class ProfileVersions:
    mcore: str
    torch: str
    cuda: str | None

    def to_dict(self) -> Json:
        return {"mcore": self.mcore, "torch": self.torch, "cuda": self.cuda}


# the device facts a profile may hold beside type, name and the copy rate, in device_facts' order
DEVICE_OPTIONAL = (
    "sm_count",
    "memory_bytes",
    "capability",
    "source",
    "uuid",
    "memory_clock_khz",
    "memory_bus_bits",
    "theoretical_bytes_per_s",
    "sm_clock_khz",
    "peak_bf16_flops_per_s",
)


@dataclass(frozen=True)
class ProfileDevice:
    """The device facts (profile/device.py's device_facts): type, name, the measured copy rate (the
    limit), and what the runtime told where it told it (None: not known there)."""

    type: str
    name: str
    copy_bytes_per_s: float
    sm_count: int | None = None
    memory_bytes: int | None = None
    capability: str | None = None
    source: str | None = None
    uuid: str | None = None
    memory_clock_khz: int | None = None
    memory_bus_bits: int | None = None
    theoretical_bytes_per_s: float | None = None
    sm_clock_khz: int | None = None
    peak_bf16_flops_per_s: float | None = None

    def to_dict(self) -> Json:
        """The facts as device_facts gives them (describe_device reads this form): the known ones only."""
        out: Json = {"type": self.type, "name": self.name}
        out |= {k: getattr(self, k) for k in DEVICE_OPTIONAL if getattr(self, k) is not None}
        return out | {"copy_bytes_per_s": self.copy_bytes_per_s}

    @classmethod
    def from_dict(cls, d: Json) -> ProfileDevice:
        return cls(d["type"], d["name"], d["copy_bytes_per_s"], **{k: d.get(k) for k in DEVICE_OPTIONAL})


@dataclass(frozen=True)
class BetweenKernels:
    """A compiled step's time no kernel covers (launch latency, dependencies): seconds, share of the
    attributed total, how many stretches, and what it is."""

    seconds: float
    share: float
    gaps: int
    what: str

    def to_dict(self) -> Json:
        return {"seconds": self.seconds, "share": self.share, "gaps": self.gaps, "what": self.what}


@dataclass(frozen=True)
class FusedKernel:
    """One kernel of the compiled graph (op by op with --fusion) and the snapshot node IDs it computes."""

    kernel: str
    nodes: tuple[str, ...]

    def to_dict(self) -> Json:
        return {"kernel": self.kernel, "nodes": list(self.nodes)}


@dataclass(frozen=True)
class FusionReport:
    """What the compiled engine fuses (an op-by-op profile with --fusion): how it compiled, its kernels."""

    engine: str
    kernels: tuple[FusedKernel, ...]

    def to_dict(self) -> Json:
        return {"engine": self.engine, "kernels": [k.to_dict() for k in self.kernels]}

    @classmethod
    def from_dict(cls, d: Json) -> FusionReport:
        return cls(d["engine"], tuple(FusedKernel(k["kernel"], tuple(k["nodes"])) for k in d["kernels"]))


@dataclass(frozen=True, kw_only=True)
class _Attributed:
    """What a report and a live view share: the role, the bundle and device, the attributed total
    (kernels and the time between them on a compiled step), the time no snapshot node takes, and
    the node rows (hottest first) and module rows."""

    schema_version: ClassVar[int] = SCHEMA_VERSION
    kind: ClassVar[str] = KIND
    role: str
    bundle: ProfileBundle
    device: ProfileDevice
    attributed_seconds: float
    unattributed_seconds: float
    nodes: tuple[ProfileNode, ...]
    modules: tuple[ProfileModule, ...]

    def _head(self) -> Json:
        return {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "role": self.role,
            "bundle": self.bundle.to_dict(),
            "device": self.device.to_dict(),
            "attributed_seconds": self.attributed_seconds,
            "unattributed_seconds": self.unattributed_seconds,
            "nodes": [n.to_dict() for n in self.nodes],
            "modules": [m.to_dict() for m in self.modules],
        }

    @staticmethod
    def _fields(d: Json) -> Json:
        b = d["bundle"]
        return {
            "role": d["role"],
            "bundle": ProfileBundle(b["model"], b["fingerprint"], dict(b["build_args"])),
            "device": ProfileDevice.from_dict(d["device"]),
            "attributed_seconds": d["attributed_seconds"],
            "unattributed_seconds": d["unattributed_seconds"],
            "nodes": tuple(ProfileNode.from_dict(n) for n in d["nodes"]),
            "modules": tuple(ProfileModule.from_dict(m) for m in d["modules"]),
        }


@dataclass(frozen=True, kw_only=True)
class PartialProfile(_Attributed):
    """The live view of an op-by-op profile after `step` of `steps` steps (medians over the steps
    done, the step's median time): nodes and modules only, recipes and candidates come with the
    report. Never written to a file; `to_dict()` is the form `on_partial` received before typing."""

    step_seconds: float
    step: int
    steps: int

    def to_dict(self) -> Json:
        out = self._head() | {"partial": True}
        return out | {"step_seconds": self.step_seconds, "step": self.step, "steps": self.steps}


@dataclass(frozen=True, kw_only=True)
class ProfileReport(_Attributed):
    """A profile of one role (the profile file, contract.py): the head (_Attributed), the versions,
    a compiled step's timeline (`kernel_seconds`, `between_kernels`, `kernels`: None on the op-by-op
    engine), recipe instances, bound slots, the ranked candidates, the engine and how it was timed,
    the step's own time measured apart, the context (None: an encoder) and the steps timed, and op
    by op with --fusion what the compiled engine fuses."""

    versions: ProfileVersions
    kernel_seconds: float | None
    between_kernels: BetweenKernels | None
    kernels: tuple[ProfileKernel, ...] | None
    recipes: tuple[ProfileRecipe, ...]
    slots: tuple[ProfileSlot, ...]
    candidates: tuple[ProfileCandidate, ...]
    engine: ProfileEngine
    timing: str
    step_seconds: float
    context: int | None
    steps: int
    fusion: FusionReport | None = None

    def to_dict(self) -> Json:
        out = self._head() | {
            "versions": self.versions.to_dict(),
            "kernel_seconds": self.kernel_seconds,
            "between_kernels": None if self.between_kernels is None else self.between_kernels.to_dict(),
            "kernels": None if self.kernels is None else [k.to_dict() for k in self.kernels],
            "recipes": [r.to_dict() for r in self.recipes],
            "slots": [s.to_dict() for s in self.slots],
            "candidates": [c.to_dict() for c in self.candidates],
            "engine": self.engine.to_dict(),
            "timing": self.timing,
            "step_seconds": self.step_seconds,
        }
        if self.fusion is not None:
            out["fusion"] = self.fusion.to_dict()
        return out | {"context": self.context, "steps": self.steps}

    @classmethod
    def from_dict(cls, d: Json) -> ProfileReport:
        """A profile file's object, checked by contract.check_profile (every key there, known keys only)."""
        between, kernels, fusion = d["between_kernels"], d["kernels"], d.get("fusion")
        return cls(
            **cls._fields(d),
            versions=ProfileVersions(**d["versions"]),
            kernel_seconds=d["kernel_seconds"],
            between_kernels=None if between is None else BetweenKernels(**between),
            kernels=None if kernels is None else tuple(ProfileKernel.from_dict(k) for k in kernels),
            recipes=tuple(ProfileRecipe.from_dict(r) for r in d["recipes"]),
            slots=tuple(ProfileSlot.from_dict(s) for s in d["slots"]),
            candidates=tuple(ProfileCandidate.from_dict(c) for c in d["candidates"]),
            engine=ProfileEngine(**d["engine"]),
            timing=d["timing"],
            step_seconds=d["step_seconds"],
            context=d["context"],
            steps=d["steps"],
            fusion=None if fusion is None else FusionReport.from_dict(fusion),
        )
