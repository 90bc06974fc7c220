"""Broken checkpoints give one clear line naming the file or key (no transformers needed; safetensors writes them)."""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.oracle
pytest.importorskip("safetensors")
from safetensors.torch import save_file  # noqa: E402

from minigrpo.pretrained import CheckpointError  # noqa: E402
from minigrpo.pretrained import load_pretrained  # noqa: E402


def write_checkpoint(folder, kind="tiny", shards=1):
    """Our tiny model as a Hugging Face folder: config.json + (sharded) safetensors, tied lm_head not saved."""
    m = load_pretrained(kind)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(m.config.raw, f)
    sd = {k: v.contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"}
    keys = sorted(sd)
    if shards == 1:
        save_file(sd, os.path.join(folder, "model.safetensors"))
    else:
        weight_map = {}
        for s in range(shards):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: sd[k] for k in keys[s::shards]}
            save_file(part, os.path.join(folder, name))
            weight_map.update({k: name for k in part})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return str(folder), m


@pytest.mark.parametrize("kind", ["tiny", "tiny-qwen3.5"])
def test_roundtrip_single_and_sharded(tmp_path, kind):
    ids = torch.randint(0, 261, (1, 12))
    for shards in (1, 3):
        path, m = write_checkpoint(tmp_path / f"s{shards}", kind, shards)
        loaded = load_pretrained(path)
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
        with torch.no_grad():
            assert torch.equal(loaded(ids), m(ids))


def test_no_config(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    os.remove(os.path.join(path, "config.json"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(path)


def test_no_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        load_pretrained(str(tmp_path / "nope"))


def test_unknown_model_type(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    cfg = json.load(open(os.path.join(path, "config.json")))
    cfg["model_type"] = "llama"
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(CheckpointError, match="config.json: model_type 'llama' is not supported"):
        load_pretrained(path)


def test_missing_shard(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c", shards=3)
    os.remove(os.path.join(path, "model-00002-of-00003.safetensors"))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors.*missing"):
        load_pretrained(path)


def test_no_weights(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_pretrained(path)


@pytest.mark.parametrize("keep", [0.5, 0.001])  # cut in the data, cut in the header
def test_truncated_file(tmp_path, keep):
    path, _ = write_checkpoint(tmp_path / "c")
    f = os.path.join(path, "model.safetensors")
    data = open(f, "rb").read()
    open(f, "wb").write(data[:int(len(data) * keep)])
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable safetensors file"):
        load_pretrained(path)


def rewrite(path, edit):
    from safetensors.torch import load_file
    f = os.path.join(path, "model.safetensors")
    sd = load_file(f)
    edit(sd)
    save_file(sd, f)


def test_wrong_shape(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    key = "model.layers.1.mlp.up_proj.weight"
    rewrite(path, lambda sd: sd.__setitem__(key, torch.zeros(100, 64)))
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' has "
                                              r"shape \[100, 64\], config.json implies \[128, 64\]"):
        load_pretrained(path)


def test_missing_tensor(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c", "tiny-qwen3.5")
    rewrite(path, lambda sd: sd.pop("model.layers.0.linear_attn.A_log"))
    with pytest.raises(CheckpointError, match="'model.layers.0.linear_attn.A_log' is missing"):
        load_pretrained(path)


def test_untied_checkpoint_without_lm_head(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    cfg = json.load(open(os.path.join(path, "config.json")))
    cfg["tie_word_embeddings"] = False
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(CheckpointError, match="'lm_head.weight' is missing"):
        load_pretrained(path)


def test_unexpected_tensor(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    rewrite(path, lambda sd: sd.__setitem__("model.layers.9.mlp.up_proj.weight", torch.zeros(128, 64)))
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.9.mlp.up_proj.weight'"):
        load_pretrained(path)


def test_skippable_tensors_are_ignored(tmp_path):
    path, _ = write_checkpoint(tmp_path / "c")
    rewrite(path, lambda sd: sd.update({"mtp.fc.weight": torch.zeros(2, 2), "model.visual.x": torch.zeros(1),
                                        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}))
    load_pretrained(path)


def test_bad_dtype_and_tiny_name():
    with pytest.raises(ValueError, match="dtype 'float8'"):
        load_pretrained("tiny", dtype="float8")


def test_unsupported_config_features():
    from minigrpo.pretrained import QwenConfig
    base = dict(model_type="qwen3", vocab_size=10, hidden_size=64, intermediate_size=8, num_hidden_layers=2,
                num_attention_heads=4)
    with pytest.raises(CheckpointError, match="rope_type 'yarn'"):
        QwenConfig.from_dict(dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        QwenConfig.from_dict(dict(base, use_sliding_window=True))
    with pytest.raises(CheckpointError, match="missing key 'vocab_size'"):
        QwenConfig.from_dict({k: v for k, v in base.items() if k != "vocab_size"})
