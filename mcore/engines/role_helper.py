"""A decoder's roles compiled side by side: while a pipeline's process captures and compiles the
prefill role, a helper process captures and compiles the decode role into the same cache; the
pipeline then loads it as a precompiled role. The code is what the pipeline would have compiled
itself: the same graph (the record's snapshot has the bundle's fingerprint), the same options and
key, on buffers of the same shapes (pipeline.DecoderBuffers). Where the helper fails or its role
does not load, the pipeline captures and compiles that role itself.

Only for a precompiling engine (CUDA by default), a bundle without kernel slots (compiled code
names each slot by a key this process hands out) and a GPU with room for a second copy of the
weights and caches. MCORE_PARALLEL_ROLES=0 turns it off; =1 turns it on wherever the engine
precompiles (CPU included, for tests).

    python -m mcore.engines.role_helper BUNDLE DEVICE ROLE...   (started by the pipeline)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..common import cache
from ..common.progress import Progress
from ..families.graph_args import GraphArgs

ENV = "MCORE_PARALLEL_ROLES"
TIMEOUT_S = 300.0  # several times the slowest decode compile seen (8B on an H200: 29 s); then compiled here


def helper_wanted(
    device: torch.device, engine: Any, has_slots: bool, family: Any, config: dict, gargs: GraphArgs, core: Any
) -> bool:
    flag = os.environ.get(ENV, "")
    if flag == "0" or has_slots or family.kind != "decoder" or engine.keeps_captures(device):
        return False  # keeps_captures: an engine that compiles from the graph at each load, not precompiled roles
    if cache.cache_dir("compiled") != cache.cache_root() / "compiled":
        return False  # an unsafe cache folder: this process's private one, which a helper would not share
    if flag == "1":
        return True
    return device.type == "cuda" and _room_for_a_copy(device, family, config, gargs, core)


def _room_for_a_copy(device: torch.device, family: Any, config: dict, gargs: GraphArgs, core: Any) -> bool:
    """The helper holds the weights and KV caches once more (uninitialized) while this process
    allocates its own caches: room for both and a margin."""
    weights = sum(t.numel() * t.element_size() for t in core.state_dict(keep_vars=True).values())
    examples, _ = family.example_inputs(config, gargs, "decode", "meta")
    caches = sum(t.numel() * t.element_size() for t in examples if t.dim() == 4)
    free, _ = torch.cuda.mem_get_info(device)
    return free > weights + 2 * caches + (4 << 30)


class RoleHelper:
    def __init__(self, proc: subprocess.Popen, roles: list[str], log: Path):
        self.proc, self.roles, self.log = proc, roles, log

    @classmethod
    def start(cls, bundle_path: str, roles: Sequence[str], device: torch.device) -> RoleHelper | None:
        # beside what it compiles (a checked, owner-only folder); the file owner-only too, never through a link
        log = cache.cache_dir("compiled") / f"helper-{os.getpid()}-{'-'.join(roles)}.log"
        cmd = [sys.executable, "-m", "mcore.engines.role_helper", str(bundle_path), str(device), *roles]
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            with os.fdopen(os.open(log, flags, 0o600), "w") as f:
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError:
            return None  # compiled here instead
        return cls(proc, list(roles), log)

    def wait(self, progress: Progress) -> bool:
        """True once the helper has exited cleanly; cancellable (the helper is stopped then)."""
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while self.proc.poll() is None:
                progress.check()
                if time.monotonic() > deadline:
                    self.stop()
                    return False
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self.proc.returncode == 0

    def failure(self) -> str:
        """Why the helper's roles are compiled here after all (its log is kept for a look)."""
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return f"exit {self.proc.returncode}: {lines[-1][:200] if lines else 'no output'}; log {self.log}"

    def done(self) -> None:
        """Its roles were taken: its log goes (one per process would pile up in the cache)."""
        try:
            self.log.unlink()
        except OSError:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def compile_roles(bundle_path: str, device: torch.device, roles: Sequence[str]) -> None:
    """Capture and compile `roles` of a slot-free decoder bundle into the cache, as a pipeline's
    load would (its weights left uninitialized: compiled code never reads their values)."""
    from ..bundle.container import open_bundle
    from ..bundle.contents import check_family, check_graph_args, read_json_member
    from ..common.errors import UserError
    from ..families import get_family
    from ..families.base import ModelSource
    from ..graph.capture import build_core, capture_cached
    from ..runtime.pipeline import DecoderBuffers
    from . import get_engine
    from .compiled import start_compile_workers

    start_compile_workers(device)  # up by the time the graph is captured
    bundle = open_bundle(bundle_path)
    m = bundle.runnable()
    check_family(m, str(bundle.path))
    family = get_family(m.family)
    config = read_json_member(bundle, "config.json")
    args, gargs = check_graph_args(family, config, m, str(bundle.path))
    source = ModelSource(spec=m.model.spec, family=m.family, config=config, path=None, revision=m.model.revision)
    core = build_core(family, config, gargs, device).eval()
    engine = get_engine("compiled", device)
    for role in roles:
        module = family.role_module(core, role)
        state: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
        state.update(dict(module.named_buffers(remove_duplicate=False)))
        cap = capture_cached(args, role, m.roles[role].fingerprint, (source, family, gargs), save=False)
        if cap.snapshot.fingerprint != m.roles[role].fingerprint:
            raise UserError(f"{bundle_path}: the {role} graph this mcore captures differs from the bundle's")
        runner = engine.compile_role(cap, state, [], device)
        snap = cap.snapshot
        inputs, fixed = DecoderBuffers(
            [(snap.tensor(t).name or t, snap.tensor(t)) for t in snap.inputs], gargs, device
        ).examples()[role]
        runner.prepare(*inputs, fixed_shapes=fixed)
        print(f"compiled {role}: {runner.describe()}", flush=True)


def main(argv: list[str]) -> int:
    bundle_path, device, *roles = argv
    compile_roles(bundle_path, torch.device(device), roles)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
