"""A distilbert-base-sized config (6 layers, dim 768, 12 heads, ff 3072, vocab 30522), for
`--weights random` runs; the folder borrows the demo's tokenizer (token IDs are what matter)."""

import json
import shutil
import sys
from pathlib import Path

DISTILBERT_BASE = {
    "architectures": ["DistilBertModel"],
    "model_type": "distilbert",
    "dim": 768,
    "hidden_dim": 3072,
    "n_layers": 6,
    "n_heads": 12,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "activation": "gelu",
    "initializer_range": 0.02,
    "pad_token_id": 0,
    "sinusoidal_pos_embds": False,
    "tie_weights_": True,
}


def write_config_folder(folder: Path) -> Path:
    from mcore.families.demo import materialize

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(DISTILBERT_BASE, indent=2))
    shutil.copy(materialize("distilbert-tiny") / "tokenizer.json", folder)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        raise SystemExit(
            "usage: python bench/distilbert_base_config.py FOLDER  (writes config.json and tokenizer.json)"
        )
    print(write_config_folder(Path(sys.argv[1])))
