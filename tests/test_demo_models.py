"""Demo models: deterministic offline materialization, loadable by transformers, our numerics match."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from mcore.common.errors import UserError
from mcore.families import demo, get_family
from mcore.families.source import load_tokenizer, resolve_model, special_tokens
from mcore.model.buildargs import BuildArgs

NAMES = ["qwen3-tiny", "qwen3-tiny-hd64", "llama-tiny", "mistral-tiny", "qwen2-tiny", "distilbert-tiny", "bert-tiny"]

# The weights are part of the "same bytes on any machine" contract: a change here means every
# demo-based snapshot fingerprint and bundle changes too (bump demo.GENERATOR_VERSION).
PINNED_WEIGHTS_SHA256 = {
    "qwen3-tiny": "e8b7c4e0c8ea1e0d36eae641f3432fa687f47b72be20a7f2b2bd4fe482214e2c",
    "qwen3-tiny-hd64": "10b8259bde7e053059e1acb6ecccdafe040071178e323e7c7d1a3679e415ec0b",
    "llama-tiny": "0d3db6220c70af0c00e07cc0711953c21b0c70caa42ea882e09aa1ef8fa19d20",
    "mistral-tiny": "970a0f583da732f614f601476b56eb7eebfabe7e91c00bb8f4a5127d244bcf6f",
    "qwen2-tiny": "5682255ea337a43cb10ecb152c5c675e2afcb552a9c3c0a81b9c23346003920c",
    "distilbert-tiny": "816b57493eb14a530e9dc648c8239b5763a3049c9a618e5db5765d3e25ae4e65",
    "bert-tiny": "da9640f2ca23ab44c0f6998638353675894ce587875b48ac5eca382c7d379446",
}


def _hashes(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcore-cache")
    for n in NAMES:
        demo.materialize(n, root=root)
    return root


@pytest.mark.parametrize("name", NAMES)
def test_materialization_is_deterministic(tmp_path, demo_root, name):
    a = demo.materialize(name, root=demo_root)
    (tmp_path / "b").mkdir()
    b = demo.write_demo(name, tmp_path / "b")
    ha, hb = _hashes(a), _hashes(b)
    assert ha == hb
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", demo.MARKER} <= set(ha)
    assert ha["model.safetensors"] == PINNED_WEIGHTS_SHA256[name]


def test_materialize_is_cached_atomic_and_repairs(tmp_path, monkeypatch):
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    s = resolve_model("demo:qwen3-tiny")
    folder = tmp_path / "cache" / "demo" / "qwen3-tiny"
    assert s.path == folder.resolve() and s.family == "qwen3" and s.spec == "demo:qwen3-tiny"
    before = (folder / "model.safetensors").stat().st_mtime_ns
    ino = folder.stat().st_ino
    assert resolve_model("demo:qwen3-tiny").path == s.path
    assert (folder / "model.safetensors").stat().st_mtime_ns == before and folder.stat().st_ino == ino
    good = _hashes(folder)
    # A damaged cache is detected and regenerated, not used.
    (folder / "model.safetensors").write_bytes(b"truncated")
    resolve_model("demo:qwen3-tiny")
    assert _hashes(folder) == good
    (folder / "tokenizer.json").unlink()
    resolve_model("demo:qwen3-tiny")
    assert _hashes(folder) == good
    # Nothing half-written is left beside it.
    assert sorted(p.name for p in (tmp_path / "cache" / "demo").iterdir()) == ["qwen3-tiny"]


def test_unwritable_cache_is_a_user_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("MCORE_CACHE_DIR", str(blocker))
    with pytest.raises(UserError) as e:
        resolve_model("demo:bert-tiny")
    assert "MCORE_CACHE_DIR" in str(e.value)


def test_demo_families_table_is_each_demos_model_type(demo_root):
    """model_kind reads a demo's family from DEMO_FAMILIES without generating it: it must agree."""
    assert sorted(demo.DEMO_FAMILIES) == sorted(NAMES)
    for n in NAMES:
        assert resolve_model(str(demo_root / "demo" / n)).config["model_type"] == demo.DEMO_FAMILIES[n]


def test_unknown_demo_name(tmp_path):
    with pytest.raises(UserError) as e:
        demo.materialize("qwen3-huge", root=tmp_path)
    assert "qwen3-huge" in str(e.value) and "demo:bert-tiny" in str(e.value)
    assert demo.demo_names() == NAMES


def test_tokenizers(demo_root):
    q = load_tokenizer(resolve_model(str(demo_root / "demo" / "qwen3-tiny")))
    enc = q.encode("Explain grouped-query attention in one sentence.")
    assert q.decode(enc.ids) == "Explain grouped-query attention in one sentence."
    assert q.encode("<|endoftext|>").ids == [q.token_to_id("<|endoftext|>")]
    assert q.decode(q.encode("héllo ✓").ids) == "héllo ✓"  # byte level: any text round-trips
    for n in ("distilbert-tiny", "bert-tiny"):
        t = load_tokenizer(resolve_model(str(demo_root / "demo" / n)))
        ids = t.encode("The quick brown fox jumps over the lazy dog.").ids
        assert ids[0] == t.token_to_id("[CLS]") == 2 and ids[-1] == t.token_to_id("[SEP]") == 3
        assert [t.token_to_id(x) for x in ("[PAD]", "[UNK]", "[MASK]")] == [0, 1, 4]
        st = special_tokens(resolve_model(str(demo_root / "demo" / n)))
        assert st["pad_token_id"] == 0 and st["cls_token_id"] == 2 and st["sep_token_id"] == 3
    st = special_tokens(resolve_model(str(demo_root / "demo" / "qwen3-tiny")))
    assert st["eos_token_id"] == q.token_to_id("<|endoftext|>")


def test_qwen3_tiny_config_sizes(demo_root):
    s = resolve_model(str(demo_root / "demo" / "qwen3-tiny"))
    c = s.config
    tok = load_tokenizer(s)
    assert c["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]) == (
        2,
        64,
        4,
        2,
    )
    assert (c["head_dim"], c["intermediate_size"], c["max_position_embeddings"]) == (16, 128, 512)
    assert c["tie_word_embeddings"] is False


def _decoder(folder, cap=64):
    s = resolve_model(str(folder))
    fam = get_family(s.family)
    g = fam.graph_args(s.config, BuildArgs(model=str(folder), max_cache_length=cap))
    core = fam.build_core(s.config, g, "cpu")
    fam.load_checkpoint(core, s)
    caches = [torch.zeros(fam.cache_shape(s.config, g)) for _ in range(2 * core.dims.num_layers)]
    return s, fam, core.eval(), caches


@pytest.mark.parametrize("name", ["qwen3-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny"])
def test_decoder_demo_matches_transformers_and_generates(demo_root, name):
    folder = demo_root / "demo" / name
    s, fam, core, caches = _decoder(folder)
    tok = load_tokenizer(s)
    prompt = tok.encode("Explain grouped-query attention in one sentence.").ids
    prefill, decode = fam.role_module(core, "prefill"), fam.role_module(core, "decode")
    out = []
    with torch.no_grad():
        logits = prefill(torch.tensor([prompt], dtype=torch.int32), *caches)
        for step in range(20):
            t = int(logits.argmax())
            out.append(t)
            logits = decode(
                torch.tensor([[t]], dtype=torch.int32), torch.tensor([len(prompt) + step], dtype=torch.int32), *caches
            )
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        gen = ref.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert out == gen[0, len(prompt) :].tolist()
    assert len(set(out)) >= 5, f"greedy output is degenerate: {out}"


@pytest.mark.parametrize("name", ["distilbert-tiny", "bert-tiny"])
def test_encoder_demo_matches_transformers(demo_root, name):
    folder = demo_root / "demo" / name
    s = resolve_model(str(folder))
    fam = get_family(s.family)
    g = fam.graph_args(s.config, BuildArgs(model=str(folder)))
    assert g.max_seq_length == 256
    core = fam.build_core(s.config, g, "cpu")
    fam.load_checkpoint(core, s)
    ids = load_tokenizer(s).encode("The quick brown fox jumps over the lazy dog.").ids
    n, S = len(ids), g.max_seq_length
    inp = torch.tensor(ids + [0] * (S - n), dtype=torch.int32)
    mask = torch.tensor([1] * n + [0] * (S - n), dtype=torch.int32)
    with torch.no_grad():
        hidden = fam.role_module(core, "encoder")(inp, mask)
        ref = (
            transformers.AutoModel.from_pretrained(str(folder))
            .eval()(input_ids=torch.tensor([ids]))
            .last_hidden_state[0]
        )
    assert hidden.shape == (S, 64)
    torch.testing.assert_close(hidden[:n], ref, atol=1e-4, rtol=0)


def test_demo_cache_default_location(monkeypatch):
    monkeypatch.delenv("MCORE_CACHE_DIR", raising=False)
    assert demo.cache_root() == demo.Path(os.path.expanduser("~/.cache/mcore"))


def test_a_copy_another_process_put_in_place_first_is_used_as_it_is(tmp_path, monkeypatch):
    """Processes generating the same demo at once (a fresh machine's first runs, parallel test
    workers): one finishes first and renames its copy into place. Every other must use that copy,
    not move it aside as stale (16 test workers on the GPU box once failed that way: each moved aside
    the copy another had just put there). Both interleavings, each played out in this process."""
    write = demo.write_demo
    final = tmp_path / "demo" / "bert-tiny"
    first = []

    def slower(name, folder):  # while this process writes, another one completes the demo
        write(name, folder)
        monkeypatch.setattr(demo, "write_demo", write)
        first.append(demo.materialize(name, root=tmp_path).stat().st_ino)

    monkeypatch.setattr(demo, "write_demo", slower)
    assert demo.materialize("bert-tiny", root=tmp_path) == final
    assert final.stat().st_ino == first[0]  # the other process's copy, not moved aside
    # the other copy lands between this process's look and its rename (the rename finds it there)
    replace = os.replace

    def late(src, dst):
        if Path(dst) == final and not final.exists():
            (tmp_path / "other").mkdir()
            write("bert-tiny", tmp_path / "other")
            replace(tmp_path / "other", final)
        return replace(src, dst)

    shutil.rmtree(final)
    monkeypatch.setattr(demo.os, "replace", late)
    assert demo.materialize("bert-tiny", root=tmp_path) == final and demo._valid(final, "bert-tiny")
    assert sorted(p.name for p in final.parent.iterdir()) == ["bert-tiny"]  # nothing half-written left
