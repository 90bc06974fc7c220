"""The hub-id path, offline: a tiny checkpoint written into a huggingface_hub cache (blobs, snapshots/<rev>/ links,
refs/main) under a temporary HF_HOME, loaded by its id with HF_HUB_OFFLINE=1 through the real huggingface_hub:
pretrained.load_pretrained, Tokenizer.from_pretrained and eval.py --model. Each load runs in a fresh process, since
huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.oracle
pytest.importorskip("huggingface_hub")
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from minigrpo.pretrained import load_pretrained  # noqa: E402
from repo_root import ROOT  # noqa: E402

TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "qwen3.jinja")
REPO, REV = "tiny-org/tiny-qwen3", "0123456789abcdef0123456789abcdef01234567"


def checkpoint_files(folder):
    """The tiny Qwen3 model as a hub checkpoint: config.json, model.safetensors (tied head not saved), and a
    byte-level BPE tokenizer.json whose ids fit the tiny embedding (272 rows), with Qwen's special tokens."""
    m = load_pretrained("tiny")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(m.config.raw, f)
    save_file({k: v.contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"},
              os.path.join(folder, "model.safetensors"))
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=262, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["Repeat the letter a: aaaaaaaa"] * 10, trainer)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["<think>", "</think>"])
    assert tok.get_vocab_size() <= m.config.vocab_size
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "bos_token": None, "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return m


def write_hub_cache(hf_home, src):
    """huggingface_hub's cache layout: hub/models--org--name/{blobs/<sha256>, snapshots/<rev>/<file> -> blob,
    refs/main = <rev>}."""
    repo = os.path.join(hf_home, "hub", "models--" + REPO.replace("/", "--"))
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    snap = os.path.join(repo, "snapshots", REV)
    os.makedirs(snap)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f:
            data = f.read()
        blob = os.path.join(repo, "blobs", hashlib.sha256(data).hexdigest())
        with open(blob, "wb") as f:
            f.write(data)
        os.symlink(os.path.relpath(blob, snap), os.path.join(snap, name))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(REV)
    return snap


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    model = checkpoint_files(str(base / "src"))
    snap = write_hub_cache(str(base / "hf_home"), str(base / "src"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(base / "hf_home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return {"base": base, "model": model, "snap": snap, "env": env}


def run_py(code, env):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_model_and_tokenizer_load_by_hub_id_offline(hub):
    ids = [[5, 17, 99, 200, 3, 42]]
    code = f"""
import json, torch
from minigrpo.model import Qwen
from minigrpo.pretrained import load_pretrained
from minigrpo.tokenizer import Tokenizer
m = load_pretrained({REPO!r})
tok = Tokenizer.from_pretrained({REPO!r})
with torch.no_grad():
    logits = m(torch.tensor({ids!r}))
torch.save(logits, {str(hub['base'] / 'logits.pt')!r})
torch.save(m.state_dict(), {str(hub['base'] / 'weights.pt')!r})
print(json.dumps({{"name": tok.name, "ids": tok.encode("Repeat the letter a"),
                  "config": {{k: v for k, v in vars(m.config).items() if k != "raw"}},
                  "chat": tok.chat([{{"role": "user", "content": "hi"}}]), "eos": tok.eos_ids}}))
"""
    out = run_py(code, hub["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["config"] == {k: v for k, v in vars(hub["model"].config).items() if k != "raw"}
    # the weights are read from the hub cache, not computed: equal to the checkpoint's bit for bit on any machine
    loaded, written = torch.load(hub["base"] / "weights.pt"), hub["model"].state_dict()
    assert sorted(loaded) == sorted(written) and all(torch.equal(loaded[k], written[k]) for k in written)
    # the logits are computed in two processes, and this one may split its sums over more threads than the child
    # (OMP_NUM_THREADS=1): max abs diff seen 4.1e-7 (logits up to 0.83) between any two of avx2/avx512/default
    # kernels x 1/2 threads; tolerance 5e-6
    with torch.no_grad():
        torch.testing.assert_close(torch.load(hub["base"] / "logits.pt"), hub["model"](torch.tensor(ids)),
                                   rtol=0, atol=5e-6)
    assert os.path.realpath(os.path.dirname(got["name"])) == os.path.realpath(hub["snap"])  # from the snapshot
    ref = HFTokenizer.from_file(os.path.join(hub["snap"], "tokenizer.json"))
    assert got["ids"] == ref.encode("Repeat the letter a", add_special_tokens=False).ids
    im_start, im_end = ref.token_to_id("<|im_start|>"), ref.token_to_id("<|im_end|>")
    assert got["chat"][0] == im_start and im_end in got["chat"] and im_end in got["eos"]


def test_an_id_missing_from_the_cache_fails_offline_with_its_name(hub):
    out = run_py("from minigrpo.tokenizer import Tokenizer; Tokenizer.from_pretrained('tiny-org/absent')",
                 hub["env"])
    assert out.returncode != 0 and "tiny-org/absent" in out.stderr


def test_eval_py_takes_a_hub_id_offline(hub):
    out_dir = hub["base"] / "eval"
    cmd = [sys.executable, "eval.py", "--task", "synthetic", "--model", REPO, "--limit", "3", "--max-new-tokens",
           "4", "--out", str(out_dir), "--quiet", "--device", "cpu"]
    out = subprocess.run(cmd, cwd=ROOT, env=hub["env"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((out_dir / "results.json").read_text())
    assert results["results"]["model"]["synthetic"]["n"] == 3
    missing = subprocess.run([*cmd[:5], "tiny-org/absent", *cmd[6:]], cwd=ROOT, env=hub["env"],
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "--model tiny-org/absent" in missing.stderr
    shutil.rmtree(out_dir)


def test_a_hub_that_does_not_answer_is_one_request_then_the_cache(monkeypatch):
    """Online mode, the endpoint's port closed: one request through the hub client's own session, then the download
    reads the local cache alone (local_files_only), in place of the client's five retries 1 to 8 s apart; nothing
    cached is one ConnectionError naming the endpoint. Where the endpoint answers, with any status, the download is
    called exactly as without the probe."""
    import huggingface_hub.utils
    from huggingface_hub import constants
    from minigrpo import hub as hub_module
    real, heads, calls = huggingface_hub.utils.get_session, [], []

    class Counted:
        def head(self, url, **kw):
            heads.append(url)
            return real().head(url, **kw)

    def download(**kw):
        calls.append(kw)
        if kw.get("local_files_only") and kw["repo_id"] == "a/absent":
            raise FileNotFoundError("outgoing traffic has been disabled")
        return "the path"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.utils, "get_session", Counted)
    assert hub_module.fetch(download, repo_id="a/cached", filename="f") == "the path"
    assert heads == ["http://127.0.0.1:9"] and calls == [{"repo_id": "a/cached", "filename": "f",
                                                           "local_files_only": True}]
    with pytest.raises(ConnectionError, match=r"^http://127\.0\.0\.1:9 did not answer \(.*\), and the local cache "
                                              r"does not hold it$"):
        hub_module.fetch(download, repo_id="a/absent")
    calls.clear()
    answers = type("Answers", (), {"head": lambda self, url, **kw: "a 404 is an answer too"})
    monkeypatch.setattr(huggingface_hub.utils, "get_session", answers)
    assert hub_module.fetch(download, repo_id="a/b", filename="f") == "the path"
    assert calls == [{"repo_id": "a/b", "filename": "f"}]
