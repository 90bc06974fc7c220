"""Where a checkpoint's files are: a local folder as is, or an 'org/name' hub id fetched into the hub cache (only
the files the caller needs). The model loader (pretrained.py) and the tokenizer both start here."""
import os


# What a hub download fetches: the tokenizer's files, and for a model also its config and weights.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
                   "generation_config.json"]
MODEL_FILES = TOKENIZER_FILES + ["*.safetensors", "model.safetensors.index.json", "special_tokens_map.json",
                                 "vocab.json", "merges.txt"]


def is_hub_id(p: str) -> bool:
    return p.count("/") == 1 and not p.startswith((".", "/", "~")) and not os.path.exists(p)


def local_folder(path_or_hub_id, files=MODEL_FILES):
    """A local folder as is; otherwise an 'org/name' hub id, fetched (only `files`) into the hub cache."""
    p = str(path_or_hub_id)
    if os.path.isdir(p):
        return p
    if not is_hub_id(p):
        raise FileNotFoundError(f"{p}: no such checkpoint folder (and not a hub id like 'Qwen/Qwen3-0.6B')")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(repo_id=p, allow_patterns=files)
    except Exception as e:
        first = (str(e).splitlines() or [""])[0]
        raise OSError(f"{p}: no such folder, and the hub download failed ({type(e).__name__}: {first}); pass a local "
                      "checkpoint folder, or connect to the hub") from None
