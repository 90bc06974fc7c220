"""Tool calls in Qwen's own format: the pieces of the chat templates that render tools, calls and results, and the
parser that reads the calls back out of a policy turn.

Qwen2.5 and Qwen3 ("qwen2", "qwen3") write a JSON object per call inside <tool_call></tool_call>; Qwen3.5
("qwen3_5") writes a <function=...> block holding one <parameter=...> block per argument. Every family wraps a
tool's result as <tool_response> text inside a user turn; consecutive tool messages share that one turn.
tests/model/test_toolcalls.py checks the rendering byte for byte against the official templates run by
transformers; both formats, written out: docs/agentic.md, "Tool calls in Qwen's own format".
parse_tool_calls never raises on what a policy wrote: a malformed call becomes an error string saying what is
wrong, for the environment to show the policy as an observation and to count.
"""

import json
import re

# -----------------------------------------------------------------------------
# rendering (called by minigrpo.tokenizer's render_* functions)

_JSON_CALL_HELP = ("For each function call, return a json object with function name and arguments within "
                   "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                   "<args-json-object>}\n</tool_call>")
_XML_CALL_HELP = (
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer "
    "the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>")


def tojson(value):
    # transformers' own `tojson` filter for chat templates: json.dumps, non-ASCII kept as is
    return json.dumps(value, ensure_ascii=False)


def tools_system_json(tools, system):
    """Qwen2.5 / Qwen3: the system turn's text with the `# Tools` block; `system` is prepended when given."""
    listed = "".join("\n" + tojson(t) for t in tools)
    head = "" if system is None else system + "\n\n"
    return (f"{head}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>{listed}\n"
            f"</tools>\n\n{_JSON_CALL_HELP}")


def tools_system_xml(tools, system):
    """Qwen3.5: the tools come first, then the (trimmed) system prompt if any is left."""
    listed = "".join("\n" + tojson(t) for t in tools)
    tail = f"\n\n{system}" if system else ""
    head = f"# Tools\n\nYou have access to the following functions:\n\n<tools>{listed}\n</tools>\n\n"
    return head + _XML_CALL_HELP + tail


def _function(call):
    # OpenAI-style {"type": "function", "function": {...}} or the bare {"name": ..., "arguments": ...}
    return call["function"] if "function" in call else call


def calls_json(calls, newline_first, raw_strings):
    """Qwen2.5 (a newline before every call; string arguments JSON-quoted) and Qwen3 (a newline before the first
    call only after some text; string arguments written as they are, raw_strings True)."""
    out = []
    for j, call in enumerate(calls):
        f = _function(call)
        args = f["arguments"] if raw_strings and isinstance(f["arguments"], str) else tojson(f["arguments"])
        sep = "\n" if j > 0 or newline_first else ""
        out.append(f'{sep}<tool_call>\n{{"name": "{f["name"]}", "arguments": {args}}}\n</tool_call>')
    return "".join(out)


def calls_xml(calls, content):
    """Qwen3.5: one <parameter=...> block per argument; mappings and lists as JSON, anything else as str()."""
    out = []
    for j, call in enumerate(calls):
        f = _function(call)
        sep = "\n" if j > 0 else ("\n\n" if content.strip() else "")
        params = "".join(f"<parameter={k}>\n{tojson(v) if isinstance(v, (dict, list, tuple)) else v}\n</parameter>\n"
                         for k, v in f.get("arguments", {}).items())
        out.append(f"{sep}<tool_call>\n<function={f['name']}>\n{params}</function>\n</tool_call>")
    return "".join(out)


def tool_response(messages, i, content, open_at_start=True):
    """A tool message: consecutive ones share one user turn. Qwen3.5 opens no turn for a tool message that comes
    first (open_at_start False), as its template does."""
    opens = messages[i - 1]["role"] != "tool" if i > 0 else open_at_start
    closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
    return ("<|im_start|>user" if opens else "") + f"\n<tool_response>\n{content}\n</tool_response>" + \
        ("<|im_end|>\n" if closes else "")


def check_tool_calls(i, calls, family):
    """Raise ValueError unless `calls` is a list of {"name": str, "arguments": dict (or str, not on Qwen3.5)}."""
    if not isinstance(calls, list):
        raise ValueError(f"messages[{i}]: tool_calls must be a list")
    for j, call in enumerate(calls):
        f = _function(call) if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ValueError(f"messages[{i}].tool_calls[{j}]: needs a str 'name'")
        allowed = (dict,) if family == "qwen3_5" else (dict, str)
        if not isinstance(f.get("arguments"), allowed):
            raise ValueError(f"messages[{i}].tool_calls[{j}]: 'arguments' must be a dict"
                             + ("" if family == "qwen3_5" else " or a JSON str"))


# -----------------------------------------------------------------------------
# parsing a policy turn

_TAG = re.compile(r"<tool_call>|</tool_call>")
_XML_FUNCTION = re.compile(r"\A<function=([^>\n]+)>\n?(.*?)</function>\Z", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def tool_names(tools):
    """The names in a list of tool schemas (OpenAI style, or bare {"name": ...})."""
    return [_function(t).get("name") for t in tools or []]


def _schema_types(tools):
    # {tool: {parameter: JSON type}}, for turning Qwen3.5's text values back into numbers, lists, ...
    out = {}
    for t in tools or []:
        f = _function(t)
        props = (f.get("parameters") or {}).get("properties") or {}
        out[f.get("name")] = {k: (v or {}).get("type") for k, v in props.items() if isinstance(v, dict)}
    return out


def _parse_json_call(body):
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at char {e.pos})"
    except (ValueError, RecursionError) as e:   # an integer of thousands of digits; thousands of nested brackets
        return None, f"not valid JSON ({type(e).__name__}: {str(e)[:80]})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object but a {type(obj).__name__}"
    if not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, 'no "name" string'
    if not isinstance(obj.get("arguments"), dict):
        what = "missing" if "arguments" not in obj else f"a {type(obj['arguments']).__name__}"
        return None, f'"arguments" must be a JSON object, is {what}'
    return {"name": obj["name"], "arguments": obj["arguments"]}, None


def _parse_xml_call(body, types):
    m = _XML_FUNCTION.match(body)
    if m is None:
        return None, "not a <function=NAME>...</function> block"
    name, inner = m.group(1).strip(), m.group(2)
    args, declared = {}, types.get(name, {})
    for k, v in _XML_PARAM.findall(inner):
        k = k.strip()
        if declared.get(k) not in (None, "string"):
            try:
                v = json.loads(v)
            except (ValueError, RecursionError):     # JSONDecodeError is a ValueError
                return None, f"parameter {k!r}: {v[:40]!r} is not a valid {declared[k]}"
        args[k] = v
    if _XML_PARAM.sub("", inner).strip():
        return None, "text outside <parameter=...></parameter> blocks (an unclosed parameter?)"
    return {"name": name, "arguments": args}, None


def parse_tool_calls(text, tools=None, family="qwen3"):
    """The tool calls of one policy turn: (calls, errors). calls: [{"name": str, "arguments": dict}] in order;
    errors: one string per malformed call or stray tag ("tool call 2: not valid JSON (...)"). With `tools` (the
    schemas the prompt offered), a call to a name not among them is an error too. Never raises."""
    calls, errors = [], []
    known = set(tool_names(tools)) if tools is not None else None
    types = _schema_types(tools)
    tags = list(_TAG.finditer(text))
    n, k = 0, 0
    while k < len(tags):
        tag = tags[k]
        if tag.group() == "</tool_call>":
            errors.append(f"a </tool_call> at char {tag.start()} closes no <tool_call>")
            k += 1
            continue
        n += 1
        if k + 1 == len(tags) or tags[k + 1].group() != "</tool_call>":
            errors.append(f"tool call {n}: <tool_call> is never closed by </tool_call>")
            k += 1
            continue
        body = text[tag.end():tags[k + 1].start()].strip()
        k += 2
        call, err = _parse_xml_call(body, types) if family == "qwen3_5" else _parse_json_call(body)
        if err is None and known is not None and call["name"] not in known:
            err = f"unknown tool {call['name'][:60]!r} (tools: {', '.join(sorted(known)) or 'none'})"
        if err is None:
            calls.append(call)
        else:
            errors.append(f"tool call {n}: {err}")
    return calls, errors
