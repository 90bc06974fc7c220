"""LoRA's files (lora_files.py): PEFT and transformers round trips, on a tiny random model that transformers itself
wrote (save_pretrained), loaded with pretrained.load_pretrained, logits compared on the same weights; load_adapter's
errors; and the key spellings PEFT adapters come with besides our own: ".default." (the adapter name, as a PEFT
model's state_dict writes it) and "model.language_model." (adapters trained on Qwen3.5's multimodal class)."""
import json
import os
import shutil

import pytest
import torch

pytestmark = pytest.mark.oracle
pytest.importorskip("safetensors")
from safetensors.torch import load_file, save_file  # noqa: E402

from hf_oracle import hf_logits, ids  # noqa: E402
from minigrpo.lora import adapters_disabled, inject_lora, lora_layers  # noqa: E402
from minigrpo.run.lora_files import ADAPTER_WEIGHTS, export_merged, load_adapter, save_adapter  # noqa: E402
from minigrpo.model import Qwen  # noqa: E402
from minigrpo.pretrained import QwenConfig, load_pretrained  # noqa: E402
from test_lora import KINDS, randomise_lora  # noqa: E402


@pytest.fixture(scope="module", params=KINDS)
def hf_dir(request, tmp_path_factory):
    """A tiny random checkpoint written by transformers, with the same config as our tiny model."""
    from transformers import AutoConfig, AutoModelForCausalLM
    raw = dict(QwenConfig.tiny(request.param).raw)
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # non-trivial norms so that a wrong norm convention shows
        for name, p in hf.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    d = tmp_path_factory.mktemp(request.param) / "hf"
    hf.save_pretrained(d)
    return str(d)


def trained_adapter(tmp_path):
    model = load_pretrained("tiny")
    params = inject_lora(model, r=4, alpha=8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    save_adapter(model, str(tmp_path / "plain"), base_model_name_or_path="tiny")
    return model


def respell(src, dst, rename):
    shutil.copytree(src, dst)
    tensors = load_file(str(src / ADAPTER_WEIGHTS))
    save_file({rename(k): v for k, v in tensors.items()}, str(dst / ADAPTER_WEIGHTS))


def test_default_adapter_name_and_multimodal_prefix(tmp_path):
    model = trained_adapter(tmp_path)
    x = torch.randint(0, 261, (1, 10))
    with torch.no_grad():
        want = model(x)
    spellings = {
        "default": lambda k: k.replace(".lora_A.weight", ".lora_A.default.weight")
                              .replace(".lora_B.weight", ".lora_B.default.weight"),
        "multimodal": lambda k: k.replace("base_model.model.model.", "base_model.model.model.language_model."),
    }
    for name, rename in spellings.items():
        respell(tmp_path / "plain", tmp_path / name, rename)
        assert any(rename(k) != k for k in load_file(str(tmp_path / "plain" / ADAPTER_WEIGHTS)))
        fresh = load_pretrained("tiny")
        load_adapter(fresh, str(tmp_path / name))
        with torch.no_grad():
            assert torch.equal(fresh(x), want), name


def test_peft_round_trip(hf_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = load_pretrained(hf_dir)
    inject_lora(model, r=4, alpha=8)
    randomise_lora(model)
    save_adapter(model, tmp_path / "adapter", base_model_name_or_path=hf_dir)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["base_model_name_or_path"] == hf_dir

    x = ids()
    ours = model(x)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        plain = hf(input_ids=x).logits
    peft = PeftModel.from_pretrained(hf, tmp_path / "adapter")
    with adapters_disabled(model):
        assert (model(x) - plain).abs().max() <= 1e-5  # same base weights
    assert (ours - plain).abs().max() > 1e-3  # the adapter matters
    assert (hf_logits(peft, x) - ours).abs().max() <= 1e-5

    # and back: our load_adapter on a fresh model reproduces the adapter
    fresh = load_pretrained(hf_dir)
    load_adapter(fresh, tmp_path / "adapter")
    assert torch.equal(fresh(x), ours)


def test_load_adapter_errors(tmp_path):
    model = load_pretrained("tiny")
    inject_lora(model, r=4, alpha=8)
    save_adapter(model, tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(load_pretrained("tiny"), tmp_path / "missing")
    other = load_pretrained("tiny")
    inject_lora(other, r=2, alpha=8)
    with pytest.raises(ValueError, match="r=4"):
        load_adapter(other, tmp_path / "a")
    wrong_size = load_pretrained("tiny-qwen3.5")  # different layers: keys differ
    with pytest.raises(ValueError, match="differ"):
        load_adapter(wrong_size, tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(dict(cfg, use_dora=True)))
    with pytest.raises(ValueError, match="use_dora"):
        load_adapter(load_pretrained("tiny"), tmp_path / "a")


def test_export_merged_loads_in_transformers(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    model = load_pretrained(hf_dir)
    inject_lora(model, r=4, alpha=8)
    randomise_lora(model)
    x = ids()
    ours = model(x)
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer_config.json").write_text("{}")
    export_merged(model, str(tok_dir), str(tmp_path / "merged"))
    assert os.path.exists(tmp_path / "merged" / "tokenizer_config.json")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    assert (hf_logits(hf, x) - ours).abs().max() <= 1e-5
    assert not lora_layers(load_pretrained(str(tmp_path / "merged")))  # a plain checkpoint again
    assert torch.equal(model(x), ours)  # exporting did not touch the model


def test_export_keeps_qwen3_5_multimodal_layout(tmp_path):
    """A Qwen3.5 checkpoint's config.json is the multimodal one: keys go under model.language_model. as there."""
    from transformers import AutoModelForCausalLM
    text = dict(QwenConfig.tiny("tiny-qwen3.5").raw)
    raw = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "tie_word_embeddings": True, "text_config": text}
    model = Qwen(QwenConfig.from_dict(raw))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    inject_lora(model, r=4, alpha=8)
    randomise_lora(model)
    export_merged(model, None, str(tmp_path))
    from safetensors import safe_open
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "model.language_model.embed_tokens.weight" in f.keys()
    x = ids()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert (hf_logits(hf, x) - model(x)).abs().max() <= 1e-5
