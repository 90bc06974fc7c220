"""The LLM judge's backends: a prompt in, the grader's reply text out, BackendError on any failure.

  claude             `claude -p --output-format json [--model M] [--max-turns N] [claude_args...]`, the prompt on
                     stdin; the JSON envelope's "result" holds the grader's reply.
  cmd:<command line> any program (shlex-split) reading the prompt on stdin and printing the verdict on stdout.
  http(s)://host...  an OpenAI-compatible /v1/chat/completions server, temperature 0; key from
                     $MINIGRPO_JUDGE_API_KEY or $OPENAI_API_KEY (`api_key_env=`).

A reply over `max_output` bytes, a non-zero exit, an HTTP error or a call past its timeout is a failure; the judge
(minigrpo/judge/grader.py) retries and, in the end, gives None.
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref

class BackendError(RuntimeError):
    pass


def run_capped(argv, stdin_text, timeout, max_output, cwd=None):
    """Run argv in its own process group with stdin_text; stdout, or BackendError on timeout (the whole group is
    killed), non-zero exit, or more than max_output bytes of stdout."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, start_new_session=True)
    except OSError as e:
        raise BackendError(f"cannot run {argv[0]!r}: {e}") from None
    out, err, over = bytearray(), bytearray(), threading.Event()

    def pump(stream, buf, cap):    # read until EOF; past the cap, flag it and stop the program
        while chunk := stream.read(65536):
            if len(buf) + len(chunk) > cap:
                over.set()
                _killpg(proc)
                return
            buf += chunk

    def feed():
        try:
            proc.stdin.write(stdin_text.encode())
            proc.stdin.close()
        except OSError:    # the program exited without reading it all
            pass

    threads = [threading.Thread(target=f, args=a, daemon=True)
               for f, a in [(pump, (proc.stdout, out, max_output)), (pump, (proc.stderr, err, 65536)), (feed, ())]]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        proc.wait()
        raise BackendError(f"{argv[0]} timed out after {timeout}s") from None
    finally:
        for t in threads:
            t.join(timeout=5)
    if over.is_set():
        raise BackendError(f"{argv[0]} printed more than {max_output} bytes")
    if rc != 0:
        raise BackendError(f"{argv[0]} exited {rc}: {err.decode(errors='replace').strip()[-300:]}")
    return out.decode("utf-8", "replace")


def _killpg(proc):
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


class CommandBackend:
    def __init__(self, command, max_output):
        self.argv, self.max_output = shlex.split(command), max_output
        self.key = ["cmd", self.argv]
        self.cwd = tempfile.mkdtemp(prefix="minigrpo-judge-")   # the grader never runs inside the repo
        weakref.finalize(self, shutil.rmtree, self.cwd, True)

    def __call__(self, prompt, timeout):
        return run_capped(self.argv, prompt, timeout, self.max_output, self.cwd)


class ClaudeBackend(CommandBackend):
    def __init__(self, max_output, claude_bin="claude", model=None, max_turns=None, claude_args=()):
        super().__init__("", max_output)
        extra = shlex.split(claude_args) if isinstance(claude_args, str) else list(claude_args)
        self.argv = [claude_bin, "-p", "--output-format", "json"] + (["--model", model] if model else []) \
            + (["--max-turns", str(max_turns)] if max_turns else []) + extra
        self.key = ["claude", self.argv[1:]]

    def __call__(self, prompt, timeout):
        out = super().__call__(prompt, timeout)
        try:
            envelope = json.loads(out)
        except ValueError:
            raise BackendError(f"claude printed no JSON envelope: {out[:200]!r}") from None
        if isinstance(envelope, list):    # with --verbose, a list of messages ending in the result
            envelope = next((m for m in reversed(envelope) if isinstance(m, dict) and m.get("type") == "result"), {})
        if not isinstance(envelope, dict) or envelope.get("is_error") or not isinstance(envelope.get("result"), str):
            raise BackendError(f"claude reported an error: {str(envelope)[:300]}")
        return envelope["result"]


class HttpBackend:
    def __init__(self, url, max_output, model=None, api_key_env=None, max_tokens=2048):
        base = url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else \
            base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        self.model = model or os.environ.get("MINIGRPO_JUDGE_MODEL", "default")
        names = [api_key_env] if api_key_env else ["MINIGRPO_JUDGE_API_KEY", "OPENAI_API_KEY"]
        self.api_key = next((os.environ[n] for n in names if os.environ.get(n)), None)
        self.max_output, self.max_tokens = max_output, max_tokens
        self.key = ["http", self.url, self.model]

    def __call__(self, prompt, timeout):
        body = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": prompt}]}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        deadline = time.monotonic() + timeout
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                data = bytearray()
                # urllib's timeout is per socket read; the loop makes it a deadline for the whole reply
                while chunk := response.read(65536):
                    data += chunk
                    if len(data) > self.max_output or time.monotonic() > deadline:
                        raise BackendError(f"{self.url}: reply over {self.max_output} bytes or past {timeout}s")
        except urllib.error.HTTPError as e:
            raise BackendError(f"{self.url}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:    # refused, reset, socket timeout
            raise BackendError(f"{self.url}: {e}") from None
        try:
            content = json.loads(data)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise BackendError(f"{self.url}: not a chat-completions reply: {bytes(data[:200])!r}")
        return content


def make_backend(spec, max_output, **opts):
    if spec == "claude":
        return ClaudeBackend(max_output, **opts)
    if spec.startswith("cmd:"):
        return CommandBackend(spec[4:], max_output, **opts)
    if spec.startswith(("http://", "https://")):
        return HttpBackend(spec, max_output, **opts)
    raise ValueError(f"judge spec {spec!r} unknown: use local, claude, cmd:<command line> or http(s)://host")
