"""
Tool calls: minigrpo.tokenizer renders tools, calls and tool results byte for byte as the official Qwen2.5, Qwen3 and
Qwen3.5 templates do under transformers' apply_chat_template(tools=...) (the fixture templates and tokenizer files
of tests/model/test_tokenizer.py), and parse_tool_calls reads calls back, turning every malformed one into an error
entry instead of an exception.
"""

import os
import random
import sys

import pytest

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")
from minigrpo.tokenizer import Tokenizer  # noqa: E402
from minigrpo.toolcalls import parse_tool_calls  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from test_tokenizer import hf_apply, make_folder, template_text  # noqa: E402

SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a bash command in the task folder.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"]}}}
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up a key (clé, 鍵).",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer"},
                                                    "opts": {"type": "object"}}, "required": ["key"]}}}
TOOLS = [SHELL, LOOKUP]


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


CONVERSATIONS = [
    [{"role": "user", "content": "List the files."}],
    [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List the files."}],
    # a call with no text, its result, the generation prompt after it
    [{"role": "user", "content": "List the files."},
     {"role": "assistant", "content": "", "tool_calls": [call("shell", command="ls -la")]},
     {"role": "tool", "content": "a.txt\nb.txt"}],
    # thinking + text + two calls; two consecutive results share one user turn; a final answer; a new query
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Count lines of a.txt and b.txt"},
     {"role": "assistant", "content": "<think>\nuse wc\n</think>\n\nLet me count.",
      "tool_calls": [call("shell", command="wc -l a.txt"), call("shell", command="wc -l b.txt")]},
     {"role": "tool", "content": "3 a.txt"}, {"role": "tool", "content": " 5 b.txt \n"},
     {"role": "assistant", "content": "3 and 5."}, {"role": "user", "content": "Thanks"}],
    # OpenAI-style calls; arguments with numbers, nesting and non-ASCII; the final turn after a result
    [{"role": "user", "content": "Look up ключ"},
     {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": call("lookup", key="ключ", n=3, opts={"deep": [1, 2]})}]},
     {"role": "tool", "content": "значение"},
     {"role": "assistant", "content": "<think>got it</think>The value is значение."}],
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    return {fam: make_folder(tmp, template_text(name), name=fam)
            for fam, name in [("qwen2", "qwen2_5.jinja"), ("qwen3", "qwen3.jinja"), ("qwen3_5", "qwen3_5.jinja")]}


def hf_render(hf_tok, messages, tools, add_generation_prompt):
    return hf_tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                      add_generation_prompt=add_generation_prompt, return_dict=False)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_5"])
def test_tools_render_as_the_template_does(folders, family):
    ours = Tokenizer.from_pretrained(folders[family])
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(folders[family])
    for messages in CONVERSATIONS:
        for tools in (TOOLS, None):
            for add_generation_prompt in (True, False):
                want = hf_render(hf_tok, messages, tools, add_generation_prompt)
                got = ours.render(messages, add_generation_prompt, tools=tools)
                assert got == want, (family, messages, tools is not None, add_generation_prompt)
                assert ours.chat(messages, add_generation_prompt, tools=tools) == \
                    list(hf_apply(hf_tok, messages, True, add_generation_prompt, None) if tools is None else
                         hf_tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False,
                                                    add_generation_prompt=add_generation_prompt))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_string_arguments(folders, family):
    # Qwen3 writes a JSON-string argument as it is, Qwen2.5 quotes it once more: both as their templates do
    ours = Tokenizer.from_pretrained(folders[family])
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(folders[family])
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "shell", "arguments": '{"command": "ls"}'}]}]
    assert ours.render(msgs, tools=TOOLS) == hf_render(hf_tok, msgs, TOOLS, True)


def test_spelled_out(folders):
    # the formats written out, so that a wrong fixture cannot silently agree with us
    q3, q35 = Tokenizer.from_pretrained(folders["qwen3"]), Tokenizer.from_pretrained(folders["qwen3_5"])
    msgs = CONVERSATIONS[2]
    text = q3.render(msgs, tools=[SHELL])
    assert text.startswith('<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the '
                           'user query.\n\nYou are provided with function signatures within <tools></tools> XML '
                           'tags:\n<tools>\n{"type": "function", "function": {"name": "shell", ')
    assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls -la"}}'
                         '\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response>'
                         '<|im_end|>\n<|im_start|>assistant\n')
    text = q35.render(msgs, tools=[SHELL])
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=shell>\n"
                         "<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n")


def test_bad_messages_are_refused():
    tok = Tokenizer.from_pretrained("tiny")
    with pytest.raises(ValueError, match="role 'robot' is not supported"):
        tok.render([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="only an assistant message has tool_calls"):
        tok.render([{"role": "user", "content": "x", "tool_calls": [call("shell", command="ls")]}])
    with pytest.raises(ValueError, match=r"tool_calls\[0\]: needs a str 'name'"):
        tok.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{}]}])
    with pytest.raises(ValueError, match="'arguments' must be a dict$"):
        Tokenizer.from_pretrained("tiny-qwen3.5").render(
            [{"role": "user", "content": "x"},
             {"role": "assistant", "content": "", "tool_calls": [{"name": "shell", "arguments": "{}"}]}])


# -----------------------------------------------------------------------------
# parsing


def test_parse_round_trip(folders):
    for family in ("qwen2", "qwen3", "qwen3_5"):
        tok = Tokenizer.from_pretrained(folders[family])
        calls = [call("shell", command="grep -c x 'a b.txt'\necho done"), call("lookup", key="k", n=7, opts={"a": [1]})]
        msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Sure.", "tool_calls": calls}]
        prompt = tok.render(msgs[:1], tools=TOOLS)
        turn = tok.render(msgs, add_generation_prompt=False, tools=TOOLS)
        head = prompt[:-len("<|im_start|>assistant\n")]
        assert turn.startswith(head)  # the policy's turn is what follows the prompt (the system turn has examples)
        assert tok.parse_tool_calls(turn[len(head):], TOOLS) == (calls, []), family


JSON_CASES = [
    ('<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}\n</tool_call>', "not valid JSON"),
    ('<tool_call>\n["shell", {"command": "ls"}]\n</tool_call>', "not a JSON object but a list"),
    ('<tool_call>\n{"arguments": {"command": "ls"}}\n</tool_call>', 'no "name" string'),
    ('<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>', 'no "name" string'),
    ('<tool_call>\n{"name": "shell"}\n</tool_call>', '"arguments" must be a JSON object, is missing'),
    ('<tool_call>\n{"name": "shell", "arguments": "ls"}\n</tool_call>', '"arguments" must be a JSON object, is a str'),
    ('<tool_call>\n{"name": "shell", "arguments": ["ls"]}\n</tool_call>', "is a list"),
    ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "unknown tool 'rm_rf' (tools: lookup, shell)"),
    ('<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}', "<tool_call> is never closed"),
    ('done </tool_call>', "closes no <tool_call>"),
    ('<tool_call>\n{"name": "shell", "argu', "<tool_call> is never closed"),  # cut; another call may follow
]


@pytest.mark.parametrize("text,error", JSON_CASES)
def test_malformed_json_calls(text, error):
    good = '<tool_call>\n{"name": "shell", "arguments": {"command": "pwd"}}\n</tool_call>'
    for combined in (text, f"Thinking... {text}\n{good}", f"{good}{text}"):
        calls, errors = parse_tool_calls(combined, TOOLS, "qwen3")
        assert len(errors) == 1 and error in errors[0], (combined, errors)
        assert calls == ([] if combined == text else [call("shell", command="pwd")])


XML_CASES = [
    ("<tool_call>\nshell ls\n</tool_call>", "not a <function=NAME>...</function> block"),
    ("<tool_call>\n<function=shell>\n<parameter=command>\nls\n</function>\n</tool_call>", "unclosed parameter"),
    ("<tool_call>\n<function=lookup>\n<parameter=n>\nseven\n</parameter>\n</function>\n</tool_call>",
     "parameter 'n': 'seven' is not a valid integer"),
    ("<tool_call>\n<function=nope>\n</function>\n</tool_call>", "unknown tool 'nope'"),
    ("<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>", "never closed"),
]


@pytest.mark.parametrize("text,error", XML_CASES)
def test_malformed_xml_calls(text, error):
    calls, errors = parse_tool_calls(text, TOOLS, "qwen3_5")
    assert calls == [] and len(errors) == 1 and error in errors[0], errors


def test_no_calls_and_no_tool_list():
    assert parse_tool_calls("Just an answer: 42.") == ([], [])
    # without a tool list every name is accepted; with an empty one, none is
    text = '<tool_call>{"name": "anything", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text) == ([call("anything")], [])
    assert parse_tool_calls(text, [])[1] == ["tool call 1: unknown tool 'anything' (tools: none)"]


def test_parser_never_raises():
    rng = random.Random(0)
    pieces = ["<tool_call>", "</tool_call>", "{", "}", '"name"', ":", '"shell"', '"arguments"', ",", "[", "]", "\n",
              "<function=shell>", "</function>", "<parameter=n>", "</parameter>", "x", "null", "3", "\ufffd"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        for family in ("qwen3", "qwen3_5"):
            calls, errors = parse_tool_calls(text, TOOLS if rng.random() < 0.5 else None, family)
            assert all(isinstance(c["arguments"], dict) and isinstance(c["name"], str) for c in calls)
            assert all(isinstance(e, str) for e in errors)
            assert len(calls) + len(errors) >= text.count("<tool_call>") > 0 or text.count("<tool_call>") == 0


def test_the_parser_survives_deep_json_and_huge_integers():
    deep = {"qwen3": ["[" * 5000, "{" * 3000, '{"name": "shell", "arguments": {"n": ' + "9" * 5000 + "}}"],
            "qwen3_5": ["<function=lookup>\n<parameter=n>\n" + "[" * 5000 + "\n</parameter>\n</function>",
                        "<function=lookup>\n<parameter=n>\n" + "9" * 5000 + "\n</parameter>\n</function>"]}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"properties": {
        "n": {"type": "integer"}}}}}]
    for family, bodies in deep.items():
        for body in bodies:
            calls, errors = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>", tools, family)
            assert calls == [] and len(errors) == 1 and len(errors[0]) < 200, (family, body[:50], errors)
