"""The typed profile report (mcore/profile/report.py) writes the JSON the profiler wrote before it was typed.

Reports come from the real profiler on the demo models (CPU; op by op, with --fusion, a bound slot, the compiled
engine, an encoder, the live views), with the times and the device's copy rate fixed, so that nothing measured
decides which rows exist. Their numbers are still the machine's Inductor kernels' and torch's, so EXPECTED pins
the JSON's form rather than its values: each object's keys in order with the JSON type of each value, per path
(a list's rows merged, one entry per key sequence), as `forms` read it from the files the dict-building profiler
wrote for the same cases (main at 960ceb6, before issue 29 typed the report): int and float apart, so a slot's
bytes (a float on the compiled engine) or a candidate's split cost (0 where nothing splits) stay what they were.
Each report round-trips through from_dict and through its file; the hand-made reports of tests/profile_reports.py
(another key order) read to the same values."""

from __future__ import annotations

import json

import pytest

from mcore import PartialProfile, ProfileReport
from mcore.common.fileio import write_json
from mcore.profile.profiler import load_profile

from .profile_reports import fixed_report

# fmt: off
EXPECTED = {
    '': [
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] partial:bool step_seconds:float step:int steps:int',
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] versions:{} kernel_seconds:float between_kernels:{} kernels:[{}] recipes:[{}] slots:[] candidates:[{}] engine:{} timing:str step_seconds:float context:null steps:int',
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] versions:{} kernel_seconds:float between_kernels:{} kernels:[{}] recipes:[{}] slots:[{}] candidates:[{}] engine:{} timing:str step_seconds:float context:int steps:int',
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] versions:{} kernel_seconds:null between_kernels:null kernels:null recipes:[{}] slots:[] candidates:[{}] engine:{} timing:str step_seconds:float context:int steps:int',
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] versions:{} kernel_seconds:null between_kernels:null kernels:null recipes:[{}] slots:[] candidates:[{}] engine:{} timing:str step_seconds:float context:null steps:int',
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] versions:{} kernel_seconds:null between_kernels:null kernels:null recipes:[{}] slots:[] candidates:[{}] engine:{} timing:str step_seconds:float fusion:{} context:int steps:int',
        'schema_version:int kind:str role:str bundle:{} device:{} attributed_seconds:float unattributed_seconds:float nodes:[{}] modules:[{}] versions:{} kernel_seconds:null between_kernels:null kernels:null recipes:[{}] slots:[{}] candidates:[{}] engine:{} timing:str step_seconds:float context:int steps:int',
    ],
    'bundle': [
        'model:str fingerprint:str build_args:{}',
    ],
    'device': [
        'type:str name:str source:str copy_bytes_per_s:float',
    ],
    'nodes[]': [
        'id:str name:str op:str module_path:str binding_id:null seconds:float bytes:int flops:int share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
        'id:str name:str op:str module_path:str binding_id:null|str seconds:float bytes:int flops:int share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
    ],
    'modules[]': [
        'path:str seconds:float bytes:int flops:int calls:int share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
    ],
    'versions': [
        'mcore:str torch:str cuda:null',
    ],
    'recipes[]': [
        'recipe:str instance:str node_ids:[str] seconds:float bytes:int flops:int calls:int output_shape_input:int|null share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
        'recipe:str instance:str node_ids:[str] seconds:float bytes:int flops:int calls:int output_shape_input:null share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
    ],
    'candidates[]': [
        'kind:str module_path:str node_ids:[str] output_shape_input:int|null seconds:float share:float headroom_seconds:float command:str split_cost_seconds:int net_headroom_seconds:float',
        'kind:str module_path:str node_ids:[str] output_shape_input:int|null seconds:float share:float headroom_seconds:float command:str splits:[]|[{}] split_cost_seconds:float|int net_headroom_seconds:float',
        'kind:str module_path:str node_ids:[str] output_shape_input:null seconds:float share:float headroom_seconds:float command:str split_cost_seconds:int net_headroom_seconds:float',
        'kind:str module_path:str node_ids:[str] output_shape_input:null seconds:float share:float headroom_seconds:float command:str splits:[]|[{}] split_cost_seconds:float|int net_headroom_seconds:float',
        'kind:str recipe:str instance:str node_ids:[str] output_shape_input:int|null seconds:float share:float headroom_seconds:float command:str split_cost_seconds:int net_headroom_seconds:float',
        'kind:str recipe:str instance:str node_ids:[str] output_shape_input:int|null seconds:float share:float headroom_seconds:float command:str splits:[]|[{}] split_cost_seconds:float|int net_headroom_seconds:float',
        'kind:str recipe:str instance:str node_ids:[str] output_shape_input:null seconds:float share:float headroom_seconds:float command:str split_cost_seconds:int net_headroom_seconds:float',
        'kind:str recipe:str instance:str node_ids:[str] output_shape_input:null seconds:float share:float headroom_seconds:float command:str splits:[{}] split_cost_seconds:float net_headroom_seconds:float',
    ],
    'engine': [
        'name:str how:str',
    ],
    'candidates[].splits[]': [
        'kernel:str order:int inside:int outside:int seconds:float cost_seconds:float',
        'kernel:str order:int inside:int outside:int seconds:null cost_seconds:float',
    ],
    'fusion': [
        'engine:str kernels:[{}]',
    ],
    'fusion.kernels[]': [
        'kernel:str nodes:[str]',
    ],
    'slots[]': [
        'binding_id:str seconds:float bytes:float flops:int calls:int share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
        'binding_id:str seconds:float bytes:int flops:int calls:int share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
    ],
    'between_kernels': [
        'seconds:float share:float gaps:int what:str',
    ],
    'kernels[]': [
        'kernel:str order:int seconds:float bytes:int flops:int node_ids:[str] share:float bytes_per_s:float flops_per_s:float limit_seconds:float ratio_to_limit:float headroom_seconds:float',
    ],
}
# fmt: on


JSON_TYPES = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (type(None), "null"))


def _type(v) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[" + "|".join(sorted({_type(x) for x in v})) + "]"
    # isinstance, not type(): torch.__version__ is a str subclass, which json writes as a string
    return next(name for t, name in JSON_TYPES if isinstance(v, t))


def forms(v, path: str = "", out: dict | None = None) -> dict[str, set[str]]:
    """path -> the forms of the objects there: "key:type ..." in key order; a list's rows with the same
    keys are one form, each key with the types it takes across them. build_args is the manifest's own."""
    out = {} if out is None else out
    if isinstance(v, list):
        rows: dict[tuple, list[dict]] = {}
        for x in v:
            if isinstance(x, dict):
                rows.setdefault(tuple(x), []).append(x)
        for keys, items in rows.items():
            form = " ".join(f"{k}:{'|'.join(sorted({_type(i[k]) for i in items}))}" for k in keys)
            out.setdefault(path + "[]", set()).add(form)
            for k in keys:
                for i in items if k != "build_args" else ():
                    forms(i[k], f"{path}[].{k}", out)
    elif isinstance(v, dict):
        out.setdefault(path, set()).add(" ".join(f"{k}:{_type(x)}" for k, x in v.items()))
        for k, x in v.items():
            if k != "build_args":
                forms(x, f"{path}.{k}" if path else k, out)
    return out


FACTS = {"type": "cpu", "name": "cpu", "source": "cpu", "copy_bytes_per_s": 1e10}
RID = "qwen.decode_logits_copy@1"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """name -> the to_dict() of each case's report (and of each live view), profiled with fixed times."""
    import mcore.profile.compiled as C
    import mcore.profile.profiler as P
    from mcore.bundle.build import build_bundle
    from mcore.kernels.shipped import build_kernel
    from mcore.model.buildargs import BuildArgs
    from mcore.profile.trace import StepTimes
    from mcore.runtime.pipeline import DecoderPipeline, EncoderPipeline

    def node_seconds(interp, prepared, inputs, timing):
        s, used = real_nodes(interp, prepared, inputs, "wall")  # runs the graph: the bytes are real
        return {n: 1e-6 * (1 + i) for i, n in enumerate(sorted(s))}, used

    def time_step(step, inputs, steps):
        times, _, how = real_step(step, inputs, 1)
        return StepTimes([1e-6 * (1 + i) for i in range(len(times.calls))], 5e-6, 0.0, [], 3), 1e-3, how

    real_nodes, real_step = P._node_seconds, C.time_step
    d = tmp_path_factory.mktemp("profile-report")
    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=128)
    build_bundle(args, d / "q.bundle")
    slot = build_bundle(args, d / "s.bundle", recipe=(RID, "decoder.logits_zero_bias"))
    build_bundle(BuildArgs(model="demo:distilbert-tiny", precision="fp32"), d / "e.bundle")
    build_kernel("identity-copy", d / "kernel.so", cuda="off")
    entry = {"id": RID, "abi_sha256": slot.receipt.abi_sha256, "library": "./kernel.so", "function": "run"}
    (d / "b.json").write_text(json.dumps({"schema_version": 1, "bindings": [entry]}))
    q = DecoderPipeline(str(d / "q.bundle"), device="cpu", engine="torch")
    s = DecoderPipeline(str(d / "s.bundle"), kernel_bindings=str(d / "b.json"), device="cpu", engine="torch")
    e = EncoderPipeline(str(d / "e.bundle"), device="cpu", engine="torch")
    seen: list[PartialProfile] = []
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "device_facts", lambda dev: dict(FACTS))
        mp.setattr(P, "_timed_step", lambda runner, inputs, dev: (runner(*inputs), 2e-3)[1])
        mp.setattr(P, "_node_seconds", node_seconds)
        mp.setattr(C, "time_step", time_step)
        out["decode-torch"] = P.profile_pipeline(q, "decode", 30, 2, on_partial=seen.append)
        out["decode-torch-fusion"] = P.profile_pipeline(q, "decode", 30, 1, fusion=True)
        out["slot-torch"] = P.profile_pipeline(s, "decode", 10, 1)
        out["slot-compiled"] = P.profile_pipeline(s, "decode", 10, 1, engine="compiled")
        out["encoder-torch"] = P.profile_pipeline(e, "encoder", 0, 1, prompt="a short sentence")
        out["encoder-compiled"] = P.profile_pipeline(e, "encoder", 0, 1, prompt="a sentence", engine="compiled")
    assert all(isinstance(r, ProfileReport) for r in out.values()) and len(seen) == 2
    out |= {f"partial-{i}": p for i, p in enumerate(seen)}
    return out


CASES = ["decode-torch", "decode-torch-fusion", "slot-torch", "slot-compiled", "encoder-torch", "encoder-compiled"]


@pytest.mark.parametrize("name", CASES + ["partial-0", "partial-1"])
def test_reports_have_the_form_the_profiler_wrote(reports, name):
    got = forms(reports[name].to_dict())
    for path, fs in got.items():
        assert fs <= set(EXPECTED.get(path, ())), (path, sorted(fs - set(EXPECTED.get(path, ()))))


def test_the_cases_show_every_form(reports):
    """Every form the old profiler wrote in these cases is still written (none went missing or changed type)."""
    seen: dict[str, set[str]] = {}
    for r in reports.values():
        for path, fs in forms(r.to_dict()).items():
            seen.setdefault(path, set()).update(fs)
    assert {p: sorted(fs) for p, fs in seen.items()} == EXPECTED


@pytest.mark.parametrize("name", CASES)
def test_reports_round_trip_through_from_dict_and_their_file(reports, name, tmp_path):
    r = reports[name]
    text = json.dumps(r.to_dict())
    back = ProfileReport.from_dict(json.loads(text))
    assert back == r and json.dumps(back.to_dict()) == text
    path = tmp_path / "p.json"
    write_json(path, r.to_dict())  # what `mcore profile -o` writes
    loaded = load_profile(path)
    assert loaded == r and path.read_text() == json.dumps(loaded.to_dict(), indent=2) + "\n"


def test_a_live_view_is_the_reports_head(reports):
    last, report = reports["partial-1"], reports["decode-torch"]
    head = {k: v for k, v in report.to_dict().items() if k in last.to_dict()}
    assert {k: v for k, v in last.to_dict().items() if k in head} == head
    assert (last.step, last.steps, last.to_dict()["partial"]) == (2, 2, True)


@pytest.mark.parametrize("engine", ["torch", "compiled"])
def test_the_hand_made_reports_read_to_the_same_values(reports, engine):
    """tests/profile_reports.py writes its keys in another order: the same keys and values (ints stay
    ints) read back, written in the profiler's order."""
    d = fixed_report(engine)
    r = ProfileReport.from_dict(d)
    assert json.dumps(r.to_dict(), sort_keys=True) == json.dumps(d, sort_keys=True)
    assert list(r.to_dict()) == list(reports[f"decode-{engine}" if engine == "torch" else "slot-compiled"].to_dict())
    assert ProfileReport.from_dict(r.to_dict()) == r
    names = [c.name for c in r.candidates[:3]]  # a recipe's instance, a region's module path
    assert names == ["decoder.layers.0.decode_attention", "decoder.layers.1.decode_attention", "decoder.layers.0.mlp"]
