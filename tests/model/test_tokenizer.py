"""
minigrpo.tokenizer against transformers (the oracle) on the official Qwen chat templates.

The fixture templates in tests/data/chat_templates/ (no network here, so copied from public mirrors):
- qwen2_5.jinja: Qwen/Qwen2.5-0.5B-Instruct's template (the same text ships with every
  Qwen2.5-Instruct size), as quoted verbatim in the huggingface swift-jinja test suite
  ("Qwen Qwen2.5-0.5B-Instruct" test).
- qwen3.jinja: Qwen/Qwen3-0.6B's template as llama.cpp keeps it in
  models/templates/Qwen-Qwen3-0.6B.jinja (copy in ye-NX/llama.cpp @ b354d7c, CRLF -> LF).
  Later revisions on the hub add `content is string` guards for non-text content; for text
  messages they render the same.
- qwen3_5.jinja: Qwen3.5-4B's template, models/templates/Qwen3.5-4B.jinja of the
  Indras-Mirror/llama.cpp-turboq-mtp fork @ 5f739af, with its one local edit undone (the fork
  keeps reasoning on every assistant turn: `... > ns.last_query_index or reasoning_content`);
  the restored line `{%- if loop.index0 > ns.last_query_index %}` is what the Qwen/Qwen3.5-27B
  tokenizer_config.json copy and the Qwen3.5-0.8B GGUF metadata copy both carry (partly unverified).
  The 0.8B copy makes thinking opt-in (`enable_thinking is true`); that
  variant is derived below by text substitution.
"""

import json
import os

import pytest
from repo_root import ROOT

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")
from minigrpo.tokenizer import Tokenizer, detect_family  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

TEMPLATES = os.path.join(ROOT, "tests", "data", "chat_templates")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # special (control) tokens
THINK = ["<think>", "</think>"]                             # added but not special, as in Qwen3
CORPUS = ["The quick brown fox jumps over the lazy dog.", "What is 2+2? It is 4.", "héllo wörld 世界 🙂",
          "def f(x):\n    return x * 2\n", "Let me think step by step about the answer."] * 20


def template_text(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


QWEN3_5_OPT_IN = template_text("qwen3_5.jinja").replace(
    "enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- else %}\n        {{- '<think>\\n' }}",
    "enable_thinking is defined and enable_thinking is true %}\n        {{- '<think>\\n' }}\n"
    "    {%- else %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}")


def build_tokenizer_json(path, im_start_id=None):
    """A small byte-level BPE (Qwen's kind) with Qwen's special tokens after its vocabulary."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(THINK)
    tok.save(path)


def make_folder(tmp_path, template, config=None, name="tok"):
    folder = tmp_path / name
    folder.mkdir()
    build_tokenizer_json(str(folder / "tokenizer.json"))
    tok_config = {"chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                  "bos_token": None, "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    out = {}
    for fam, fname in [("qwen2", "qwen2_5.jinja"), ("qwen3", "qwen3.jinja"), ("qwen3_5", "qwen3_5.jinja")]:
        out[fam] = make_folder(tmp, template_text(fname), name=fam)
    out["qwen3_5_opt_in"] = make_folder(tmp, QWEN3_5_OPT_IN, name="qwen3_5_opt_in")
    return out


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    # earlier assistant turns carry thinking (stripped), the final one too (kept)
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nadd two and two\n</think>\n\n4"},
     {"role": "user", "content": "Again, times 3?"},
     {"role": "assistant", "content": "<think>4 * 3 = 12</think>12"}],
    # a final assistant turn without thinking: Qwen3 / 3.5 add an empty think block
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 🙂"}],
    # assistant turns after the last query: only the last (or one with reasoning) gets a block
    [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "one"},
     {"role": "assistant", "content": "<think>\nnext\n</think>two"}, {"role": "assistant", "content": "three"}],
    # whitespace around contents (Qwen3.5 trims), unicode, special-looking text
    [{"role": "system", "content": "  Be nice. \n"}, {"role": "user", "content": "\n héllo 世界 <think> \n"},
     {"role": "assistant", "content": "\n\n<think>\n\n  deep  \n\n</think>\n\n  answer \n"},
     {"role": "user", "content": "ok?  "}],
]
FAMILIES = ["qwen2", "qwen3", "qwen3_5", "qwen3_5_opt_in"]


def hf_apply(hf_tok, messages, tokenize, add_generation_prompt, enable_thinking):
    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    out = hf_tok.apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=add_generation_prompt,
                                     return_dict=False, **kw)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_matches_transformers(folders, family):
    ours = Tokenizer.from_pretrained(folders[family])
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(folders[family])
    assert ours.family == family.replace("_opt_in", "")
    checked = 0
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            for enable_thinking in (None, True, False):
                args = (messages, add_generation_prompt, enable_thinking)
                want_text = hf_apply(hf_tok, messages, False, add_generation_prompt, enable_thinking)
                want_ids = hf_apply(hf_tok, messages, True, add_generation_prompt, enable_thinking)
                assert ours.render(*args) == want_text, (family, args)
                assert ours.chat(*args) == list(want_ids), (family, args)
                checked += 1
    assert checked == len(CONVERSATIONS) * 6


def test_expected_prompts_spelled_out(folders):
    # the expected prompts written out, so a wrong fixture cannot silently agree with us
    msgs = [{"role": "user", "content": "Hi"}]
    q2, q3, q35 = (Tokenizer.from_pretrained(folders[f]) for f in ("qwen2", "qwen3", "qwen3_5"))
    assert q2.render(msgs) == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                               "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert q3.render(msgs) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert q3.render(msgs, enable_thinking=False) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert q35.render(msgs) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert q35.render(msgs, enable_thinking=False).endswith("assistant\n<think>\n\n</think>\n\n")
    ids = q35.chat(msgs, enable_thinking=False)
    think, end_think, nn = q35.encode("<think>"), q35.encode("</think>"), q35.encode("\n\n")
    assert len(think) == len(end_think) == 1  # one added-token id each, as in the real vocab
    assert ids[-(2 + 2 * len(nn)):] == think + nn + end_think + nn
    # the opt-in variant (thinking only when enable_thinking is True)
    assert QWEN3_5_OPT_IN != template_text("qwen3_5.jinja")
    opt_in = Tokenizer.from_pretrained(folders["qwen3_5_opt_in"])
    assert opt_in.render(msgs).endswith("assistant\n<think>\n\n</think>\n\n")
    assert opt_in.render(msgs, enable_thinking=True).endswith("assistant\n<think>\n")


def test_middle_system_message(folders):
    msgs = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}]
    for fam in ("qwen2", "qwen3"):
        ours = Tokenizer.from_pretrained(folders[fam])
        hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(folders[fam])
        assert ours.render(msgs) == hf_apply(hf_tok, msgs, False, True, None)
    q35 = Tokenizer.from_pretrained(folders["qwen3_5"])
    with pytest.raises(ValueError, match="system message only first"):
        q35.render(msgs)
    with pytest.raises(ValueError, match="at least one user message"):
        q35.render([{"role": "system", "content": "s"}])


def test_unknown_role_is_rejected():
    tok = Tokenizer.from_pretrained("tiny")  # tool turns are rendered (test_toolcalls.py); other roles are not
    with pytest.raises(ValueError, match="role 'function' is not supported"):
        tok.chat([{"role": "user", "content": "x"}, {"role": "function", "content": "y"}])


def test_encode_decode_and_ids(folders):
    tok = Tokenizer.from_pretrained(folders["qwen3"])
    hf = HFTokenizer.from_file(os.path.join(folders["qwen3"], "tokenizer.json"))
    ids = {s: hf.token_to_id(s) for s in SPECIAL + THINK}
    assert tok.eos_ids == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert tok.pad_id == ids["<|endoftext|>"] and tok.im_end_id == ids["<|im_end|>"]
    assert tok.vocab_size == max(hf.get_vocab(with_added_tokens=True).values()) + 1 == ids["</think>"] + 1
    for text in CORPUS[:5] + ["", "  leading and trailing  ", "tabs\tand\nnewlines\r\n", "ζ∂ ∑ 🙂🙂 ok"]:
        assert tok.decode(tok.encode(text)) == text
    text = "a<|im_start|>user\nhi<|im_end|><think>x</think><|endoftext|>"
    enc = tok.encode(text)
    for s in SPECIAL + THINK:
        assert ids[s] in enc  # each special string became its single id
    assert enc[0] != ids["<|endoftext|>"]  # no BOS
    assert tok.decode(enc) == text
    assert tok.decode(enc, skip_special_tokens=True) == "auser\nhi<think>x</think>"


def test_decode_stream_holds_back_partial_characters(folders):
    for tok in (Tokenizer.from_pretrained(folders["qwen3"]), Tokenizer.from_pretrained("tiny")):
        text = "€ and 世界 🙂<|im_end|>"
        stream = tok.decode_stream()
        pieces = [stream.step(i) for i in tok.encode(text)]
        assert "".join(pieces) + stream.flush() == text
        assert all("\ufffd" not in p for p in pieces)


def test_byte_tokenizer():
    tok = Tokenizer.from_pretrained("tiny")
    assert tok.family == "qwen3" and Tokenizer.from_pretrained("tiny-qwen3.5").family == "qwen3_5"
    assert tok.vocab_size == 261 and tok.eos_ids == [258, 256] and tok.pad_id == 256 and tok.im_end_id == 258
    assert tok.encode("a<|im_end|>b<think>") == [97, 258, 98, 259]
    assert tok.encode("é") == [0xC3, 0xA9]
    text = "<|im_start|>user\nhé 🙂<|im_end|>\n<think>\n</think><|endoftext|>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == "user\nhé 🙂\n<think>\n</think>"
    # a cut in the middle of a character decodes with U+FFFD (errors="replace"), never raises
    assert tok.decode([0xF0, 0x9F]) == "\ufffd"
    assert tok.decode([0xF0, 0x9F, 258, 97]) == "\ufffd<|im_end|>a"
    stream = tok.decode_stream()
    assert [stream.step(b) for b in "🙂".encode()] == ["", "", "", "🙂"]
    # chat for the tiny models: same rendering, ids are bytes + specials
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.chat(msgs, enable_thinking=False) == \
        [257] + list(b"user\nHi") + [258, 10, 257] + list(b"assistant\n") + [259, 10, 10, 260, 10, 10]
    tiny35 = Tokenizer.from_pretrained("tiny-qwen3.5")
    assert tiny35.decode(tiny35.chat(msgs)) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_family_rules(tmp_path):
    t3 = template_text("qwen3.jinja")
    assert detect_family("qwen2") == "qwen2" and detect_family("qwen3_moe") == "qwen3"
    assert detect_family("qwen3_5_text", t3) == "qwen3_5"  # model_type wins over the template
    assert detect_family(None, template_text("qwen2_5.jinja")) == "qwen2"
    assert detect_family(None, None, {"<|im_start|>": 151644}) == "qwen2"
    assert detect_family(None, None, {"<|im_start|>": 151644, "<think>": 151667}) == "qwen3"
    assert detect_family(None, None, {"<|im_start|>": 248045, "<think>": 248068}) == "qwen3_5"
    folder = make_folder(tmp_path, t3, config={"model_type": "qwen2"})
    assert Tokenizer.from_pretrained(folder).family == "qwen2"


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json: not found"):
        (tmp_path / "empty").mkdir()
        Tokenizer.from_pretrained(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad/tokenizer.json: cannot read"):
        Tokenizer.from_pretrained(str(bad))
    folder = make_folder(tmp_path, template_text("qwen3.jinja"), config={"model_type": "llama"})
    with pytest.raises(ValueError, match=r"config.json: model_type 'llama' is not a Qwen"):
        Tokenizer.from_pretrained(folder)
    (tmp_path / "tok" / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"config.json: not valid JSON"):
        Tokenizer.from_pretrained(folder)
    with pytest.raises(FileNotFoundError, match="no/such/dir"):
        Tokenizer.from_pretrained(str(tmp_path / "no/such/dir"))
