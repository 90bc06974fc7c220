"""Tokenizer for Qwen checkpoints, and the chat templates rendered in plain Python.

Two backends behind one class: a checkpoint's `tokenizer.json` (byte-level BPE), run by the `tokenizers` library,
and a byte tokenizer for the tiny random models (ids 0..255 are raw bytes, then five specials: ByteCodec).
chat() does not run the checkpoint's Jinja template: it renders the three Qwen templates (docs/qwen.md, "Chat
templates") in Python, so the library needs no jinja2 and the rules are readable here; tools, tool calls and tool
results are rendered as the templates do (minigrpo.toolcalls, which also parses them). tests/model/test_tokenizer.py
checks the output against transformers' apply_chat_template on the official templates. The template text is still
read and kept (`.chat_template`), for reference. Which template a checkpoint gets: `detect_family`.
"""

import codecs
import json
import os
import re
import shutil

from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
from tokenizers.decoders import DecodeStream

from minigrpo.errors import first_line
from minigrpo.pretrained import TOKENIZER_FILES, local_folder
from minigrpo.toolcalls import calls_json, calls_xml, check_tool_calls, parse_tool_calls, tool_response, \
    tools_system_json, tools_system_xml

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CONTROL = SPECIALS[:3]  # what skip_special_tokens drops; <think> tags are plain added tokens in Qwen
QWEN2_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TINY = {"tiny": "qwen3", "tiny-qwen3.5": "qwen3_5", "tiny-moe": "qwen3_5"}
_PLACEHOLDER = "PLACEHOLDER-OF-THE-SAMPLED-TURN"  # Tokenizer.continuation: no template changes it

# -----------------------------------------------------------------------------
# chat templates


def _check_messages(messages, family):
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"messages[{i}]: role {m.get('role')!r} is not supported "
                             "(minigrpo renders system/user/assistant/tool)")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}]: content must be a str")
        if m.get("tool_calls"):
            if m["role"] != "assistant":
                raise ValueError(f"messages[{i}]: only an assistant message has tool_calls")
            check_tool_calls(i, m["tool_calls"], family)


def _split_think(content):
    # "<think>\nR\n</think>\n\nA" -> ("R", "A"), exactly as the Qwen3 templates split it
    if "</think>" not in content:
        return "", content
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _last_query_index(messages, strip=False):
    # the last user turn that is a real query (not a wrapped tool result); earlier assistant
    # turns lose their reasoning. -1 when there is none.
    for i in range(len(messages) - 1, -1, -1):
        c = messages[i]["content"].strip() if strip else messages[i]["content"]
        if messages[i]["role"] == "user" and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            return i
    return -1


def _turn(role, body):
    return f"<|im_start|>{role}\n{body}<|im_end|>\n"


def _first_system(messages):
    return messages[0]["content"] if messages and messages[0]["role"] == "system" else None


def render_qwen2(messages, add_generation_prompt, tools=None):
    # Qwen2.5-Instruct: a default system prompt, then plain ChatML; <think> text is left as is
    system = _first_system(messages)
    out = []
    if tools:
        out.append(_turn("system", tools_system_json(tools, QWEN2_SYSTEM if system is None else system)))
    elif system is None:
        out.append(_turn("system", QWEN2_SYSTEM))
    for i, m in enumerate(messages):
        if i == 0 and system is not None and tools:
            continue  # already in the tools system turn
        if m["role"] == "tool":
            out.append(tool_response(messages, i, m["content"]))
        elif m.get("tool_calls"):
            text = "\n" + m["content"] if m["content"] else ""
            out.append(f"<|im_start|>assistant{text}{calls_json(m['tool_calls'], True, raw_strings=False)}<|im_end|>\n")
        else:
            out.append(_turn(m["role"], m["content"]))
    return "".join(out) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render_qwen3(messages, add_generation_prompt, enable_thinking, tools=None):
    # Qwen3 hybrid thinking (0.6B ... 32B)
    last_query = _last_query_index(messages)
    if last_query < 0:
        last_query = len(messages) - 1  # the template's default: no assistant turn gets a think block
    system = _first_system(messages)
    out = [_turn("system", tools_system_json(tools, system))] if tools else []
    for i, m in enumerate(messages):
        if i == 0 and system is not None and tools:
            continue
        if m["role"] == "tool":
            out.append(tool_response(messages, i, m["content"]))
            continue
        if m["role"] != "assistant":
            out.append(_turn(m["role"], m["content"]))
            continue
        reasoning, content = _split_think(m["content"])
        if i > last_query and (i == len(messages) - 1 or reasoning):
            # after the last query the reasoning is kept; a final turn gets a (maybe empty) block
            body = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
        else:
            body = content  # earlier turns: the thinking is dropped
        out.append(_turn("assistant", body + calls_json(m.get("tool_calls") or [], bool(content), raw_strings=True)))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.append("<think>\n\n</think>\n\n")  # an empty think block: answer right away
    return "".join(out)


def render_qwen3_5(messages, add_generation_prompt, enable_thinking, tools=None):
    # Qwen3.5: every content is trimmed; the generation prompt opens the think block itself
    last_query = _last_query_index(messages, strip=True)
    if last_query < 0:
        raise ValueError("messages: the Qwen3.5 template needs at least one user message")
    system = _first_system(messages)
    out = [_turn("system", tools_system_xml(tools, (system or "").strip()))] if tools else []
    for i, m in enumerate(messages):
        content = m["content"].strip()
        if m["role"] == "system":
            if i != 0:
                raise ValueError(f"messages[{i}]: the Qwen3.5 template allows a system message only first")
            if not tools:
                out.append(_turn("system", content))
        elif m["role"] == "user":
            out.append(_turn("user", content))
        elif m["role"] == "tool":
            out.append(tool_response(messages, i, content, open_at_start=False))
        else:
            reasoning, content = _split_think(content)
            calls = calls_xml(m.get("tool_calls") or [], content)
            if i > last_query:
                content = f"<think>\n{reasoning.strip()}\n</think>\n\n{content}"
            out.append(_turn("assistant", content + calls))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        out.append("<think>\n" if enable_thinking else "<think>\n\n</think>\n\n")
    return "".join(out)


def detect_family(model_type=None, template=None, vocab=None):
    """Which chat template a checkpoint gets: "qwen2", "qwen3" or "qwen3_5", by the first rule that applies:
    1. config.json `model_type`: qwen3_5* -> "qwen3_5", qwen3* -> "qwen3", qwen2* -> "qwen2"; any other is an error.
    2. the chat template text: renders `<think>` and trims contents (`|trim`) -> "qwen3_5"; renders `<think>` ->
       "qwen3"; otherwise a ChatML template -> "qwen2".
    3. the vocabulary: no `<think>` token -> "qwen2"; <|im_start|> at id >= 200000 (Qwen3.5's 248k vocabulary) ->
       "qwen3_5"; else "qwen3".
    vocab: {token: id} of the added tokens at least."""
    if model_type is not None:
        for prefix in ("qwen3_5", "qwen3", "qwen2"):
            if model_type.startswith(prefix):
                return prefix
        raise ValueError(f"model_type {model_type!r} is not a Qwen2/Qwen3/Qwen3.5 model")
    if template:
        if "<think>" in template:
            return "qwen3_5" if "|trim" in template else "qwen3"
        if "<|im_start|>" in template:
            return "qwen2"
    if vocab is not None and "<|im_start|>" in vocab:
        if "<think>" not in vocab:
            return "qwen2"
        return "qwen3_5" if vocab["<|im_start|>"] >= 200_000 else "qwen3"
    raise ValueError("cannot tell the Qwen family: no config.json model_type, no ChatML chat "
                     "template and no <|im_start|> token")


# -----------------------------------------------------------------------------
# the byte tokenizer of the tiny models


class ByteCodec:
    """ids 0..255 are bytes, 256..260 the SPECIALS; same encode/decode surface as `tokenizers`."""

    def __init__(self):
        self.special_ids = {s: 256 + i for i, s in enumerate(SPECIALS)}
        self.split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

    def encode(self, text):
        ids = []
        for piece in self.split.split(text):  # odd pieces are the special tokens
            ids += [self.special_ids[piece]] if piece in self.special_ids else list(piece.encode("utf-8"))
        return ids

    def decode(self, ids, skip_special_tokens=False):
        stream = ByteDecodeStream(skip_special_tokens)
        return "".join(stream.step(i) for i in ids) + stream.flush()


class ByteDecodeStream:
    """Incremental byte decoding: a character split across tokens comes out once it is whole."""

    def __init__(self, skip_special_tokens=False):
        self.skip = skip_special_tokens
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, i):
        if i < 256:
            return self.utf8.decode(bytes([i]))
        special = SPECIALS[i - 256]
        # a special token ends any pending partial character (it becomes U+FFFD, as in a full decode)
        text = self.utf8.decode(b"", final=True)
        self.utf8.reset()
        return text + ("" if self.skip and special in CONTROL else special)

    def flush(self):
        return self.utf8.decode(b"", final=True)


class HFDecodeStream:
    """The same for a `tokenizers` backend (its DecodeStream holds back partial byte sequences)."""

    def __init__(self, hf, skip_special_tokens=False):
        self.hf, self.stream = hf, DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, i):
        return self.stream.step(self.hf, int(i)) or ""

    def flush(self):
        return ""


# -----------------------------------------------------------------------------
# the public Tokenizer


class Tokenizer:
    def __init__(self, family, hf=None, chat_template=None, name=""):
        self.family, self.hf, self.chat_template, self.name = family, hf, chat_template, name
        self.byte = ByteCodec() if hf is None else None
        ids = {s: self.token_to_id(s) for s in SPECIALS}
        for s in CONTROL:
            if ids[s] is None:
                raise ValueError(f"{name}: tokenizer has no {s} token; is this a Qwen tokenizer?")
        self.pad_id = ids["<|endoftext|>"]
        self.im_end_id = ids["<|im_end|>"]
        self.eos_ids = [self.im_end_id, self.pad_id]  # stop on both, whatever the model
        if hf is None:
            self.vocab_size = 256 + len(SPECIALS)
        else:  # real number of ids; the embedding usually has padding rows beyond it
            self.vocab_size = max(hf.get_vocab(with_added_tokens=True).values()) + 1
        # Qwen3.5 only: the generation prompt opens a think block unless the template makes thinking opt-in
        self.thinking_default = not (chat_template and "enable_thinking is true" in chat_template)

    @classmethod
    def from_pretrained(cls, path_or_hub_id):
        if path_or_hub_id in TINY:
            return cls(TINY[path_or_hub_id], name=path_or_hub_id)
        folder = local_folder(path_or_hub_id, TOKENIZER_FILES)
        tok_path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(tok_path):
            raise FileNotFoundError(f"{tok_path}: not found (minigrpo needs the checkpoint's tokenizer.json)")
        try:
            hf = HFTokenizer.from_file(tok_path)
        except Exception as e:
            raise ValueError(f"{tok_path}: cannot read it as a tokenizers file ({first_line(e)})") from None
        template = _read_template(folder)
        config = _read_json(os.path.join(folder, "config.json"))
        model_type = config.get("model_type") if config else None
        try:
            family = detect_family(model_type, template, hf.get_vocab(with_added_tokens=True))
        except ValueError as e:
            where = "config.json" if model_type else "tokenizer.json"
            raise ValueError(f"{os.path.join(folder, where)}: {e}") from None
        return cls(family, hf=hf, chat_template=template, name=tok_path)

    # --- ids <-> text

    def token_to_id(self, token):
        return self.byte.special_ids.get(token) if self.hf is None else self.hf.token_to_id(token)

    def encode(self, text):
        # special-token strings in the text map to their ids; no BOS (Qwen has none)
        return self.byte.encode(text) if self.hf is None else self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens=False):
        ids = [int(i) for i in ids]
        if self.hf is None:
            return self.byte.decode(ids, skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens=False):
        """An object with .step(id) -> str giving only complete characters, for streaming output."""
        if self.hf is None:
            return ByteDecodeStream(skip_special_tokens)
        return HFDecodeStream(self.hf, skip_special_tokens)

    # --- chat

    def render(self, messages, add_generation_prompt=True, enable_thinking=None, tools=None):
        """The prompt text, as the family's official template renders it. enable_thinking: None = unset.
        tools: JSON function schemas the model may call (rendered in the system turn); assistant messages may
        carry "tool_calls" ([{"name", "arguments"}], or OpenAI's {"function": {...}}), and "tool" messages are
        their results."""
        _check_messages(messages, self.family)
        if self.family == "qwen2":
            return render_qwen2(messages, add_generation_prompt, tools)
        if self.family == "qwen3":
            return render_qwen3(messages, add_generation_prompt, enable_thinking, tools)
        thinking = self.thinking_default if enable_thinking is None else enable_thinking
        return render_qwen3_5(messages, add_generation_prompt, thinking, tools)

    def chat(self, messages, add_generation_prompt=True, enable_thinking=None, tools=None):
        return self.encode(self.render(messages, add_generation_prompt, enable_thinking, tools))

    def continuation(self, messages, ended, enable_thinking=None, tools=None):
        """The ids that follow a sampled assistant turn when `messages` (an environment's reply: tool results, a
        user turn; none: the policy just takes another turn) are appended, up to and including the next assistant
        turn's generation prompt: the end of the assistant turn (its <|im_end|> unless `ended`, the sample having
        emitted it), "\n", the messages' turns and the new assistant header (with whatever the template puts after
        it, e.g. Qwen3.5's "<think>\n"). Taken from the template's own rendering of a conversation whose assistant
        turn is a placeholder, as the text that follows the placeholder: an episode appends these ids to the ids
        the policy sampled, so that nothing the policy wrote is ever decoded and encoded again
        (minigrpo/tasks/episodes.py)."""
        conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PLACEHOLDER}]
        text = self.render(conversation + list(messages), True, enable_thinking, tools)
        after = text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER):]
        if not after.startswith("<|im_end|>"):      # every Qwen template closes an assistant turn so
            raise ValueError(f"continuation: the {self.family} template does not end an assistant turn with "
                             "<|im_end|>")
        return self.encode(after[len("<|im_end|>"):] if ended else after)

    def parse_tool_calls(self, text, tools=None):
        """The tool calls in a decoded policy turn, in this family's format: (calls, errors), never raises."""
        return parse_tool_calls(text, tools, "qwen3_5" if self.family == "qwen3_5" else "qwen3")

    def __repr__(self):
        return f"Tokenizer({self.name!r}, family={self.family}, vocab_size={self.vocab_size})"

    # --- files

    def save_files(self, folder):
        """Write this tokenizer's files into `folder`, so that the folder loads without the original: a
        checkpoint's files are copied (never its config.json); the byte tokenizer is written as the equivalent
        tokenizer.json (byte_tokenizer_json) with a tokenizer_config.json naming Qwen's special tokens."""
        if self.hf is None:
            with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
                f.write(byte_tokenizer_json())
            with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                           "pad_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False}, f, indent=2)
            return
        source = os.path.dirname(self.name)
        for name in TOKENIZER_COPIES:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))


# What save_files copies from a checkpoint's folder: the tokenizer and its chat template, nothing of the model's.
TOKENIZER_COPIES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                    "added_tokens.json", "chat_template.jinja", "chat_template.json")


def byte_tokenizer_json() -> str:
    """The tiny models' byte tokenizer as a `tokenizers` file, for transformers and for minigrpo alike: byte-level
    BPE without merges whose vocabulary maps each byte's GPT-2 character to the byte's value, then the five
    SPECIALS at 256..260 (the first three special, the <think> tags plain added tokens, as in Qwen). It encodes and
    decodes every text as ByteCodec does (tests/run/test_export.py)."""
    chars = _bytes_to_unicode()
    hf = HFTokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in CONTROL])
    hf.add_tokens([AddedToken(s, special=False, normalized=False) for s in SPECIALS[len(CONTROL):]])
    return hf.to_str(pretty=True)


def _bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _read_json(path):
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object ({{...}}), got a {type(data).__name__}")
    return data


def _read_template(folder):
    # transformers 5 writes chat_template.jinja; older checkpoints keep it in tokenizer_config.json
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    template = (_read_json(os.path.join(folder, "tokenizer_config.json")) or {}).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template
