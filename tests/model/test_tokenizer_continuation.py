"""Tokenizer.continuation: the ids an episode appends after a sampled assistant turn are, token for token, what the
chat template renders after that turn's text when the environment's messages follow it, on the official templates
(transformers, the oracle) and on the built-in renderers of the tiny tokenizers."""
import pytest

pytestmark = pytest.mark.oracle     # transformers renders the official templates; the tokenizers package
pytest.importorskip("tokenizers")
from test_tokenizer import FAMILIES, folders, transformers  # noqa: E402,F401  (folders: the fixture)

from minigrpo.tokenizer import Tokenizer  # noqa: E402

ANSWER = "ANSWER-OF-THE-POLICY"     # the sampled turn's text: found once in the rendering, its end is the cut
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
BEFORE = [  # the conversation before the sampled turn
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List the files."},
     {"role": "assistant", "content": "<think>\nlook\n</think>\n\ncalling"}, {"role": "tool", "content": "a.txt"}],
]
REPLIES = [  # what the environment appends
    [{"role": "user", "content": "Wrong: try again."}],
    [{"role": "tool", "content": "417"}],
    [{"role": "tool", "content": "first\nresult"}, {"role": "tool", "content": "second"}],
    [{"role": "tool", "content": "héllo 世界"}, {"role": "user", "content": "  and now?  "}],
]


def cases():
    for before in BEFORE:
        for reply in REPLIES:
            for tools in (None, TOOLS):
                for thinking in (None, True, False):
                    yield before + [{"role": "assistant", "content": ANSWER}], reply, tools, thinking


def after_answer(text):
    return text[text.index(ANSWER) + len(ANSWER):]


@pytest.mark.parametrize("family", FAMILIES)
def test_continuation_is_what_the_official_template_renders_after_the_turn(folders, family):  # noqa: F811
    ours = Tokenizer.from_pretrained(folders[family])
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(folders[family])
    checked = 0
    for conversation, reply, tools, thinking in cases():
        kw = {"tools": tools} if tools else {}
        whole = hf_tok.apply_chat_template(conversation + reply, tokenize=False, add_generation_prompt=True,
                                           **kw, **({} if thinking is None else {"enable_thinking": thinking}))
        ids = ours.continuation(reply, False, thinking, tools)
        assert ours.decode(ids) == after_answer(whole), (family, reply, tools, thinking)
        assert ids == hf_tok.encode(after_answer(whole), add_special_tokens=False)
        assert ids[0] == ours.im_end_id and ours.continuation(reply, True, thinking, tools) == ids[1:]
        checked += 1
    assert checked == len(BEFORE) * len(REPLIES) * 6


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3.5"])
def test_continuation_of_the_built_in_renderers(name):
    tok = Tokenizer.from_pretrained(name)
    for conversation, reply, tools, thinking in cases():
        whole = tok.render(conversation + reply, True, thinking, tools)
        assert tok.continuation(reply, False, thinking, tools) == tok.encode(after_answer(whole))
    assert tok.decode(tok.continuation([{"role": "tool", "content": "7"}], True, False)) == (
        "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n")


def test_no_messages_is_a_new_assistant_turn():
    tok = Tokenizer.from_pretrained("tiny-qwen3.5")
    assert tok.decode(tok.continuation([], False)) == "<|im_end|>\n<|im_start|>assistant\n<think>\n"
