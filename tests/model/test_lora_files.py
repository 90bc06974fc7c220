"""load_adapter reads the key spellings PEFT adapters come with besides its own: ".default." (the adapter name, as
a PEFT model's state_dict writes it) and "model.language_model." (adapters trained on Qwen3.5's multimodal class)."""
import torch
from safetensors.torch import load_file, save_file

from minigrpo.lora import inject_lora
from minigrpo.lora_files import ADAPTER_WEIGHTS, load_adapter, save_adapter
from minigrpo.pretrained import load_pretrained


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
    import shutil
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
