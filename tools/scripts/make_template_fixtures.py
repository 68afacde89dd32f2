#!/usr/bin/python3
"""Regenerates tests/data/templates/reference.json: llama.cpp's renderings of the chat templates in
tests/data/templates/ for a set of conversations, the oracle that tests/test_jinja.cpp checks
tandem's Jinja interpreter against byte for byte.

For each template it starts llama-server with --chat-template-file and asks POST /apply-template
to render each conversation. Each case records the context exactly as llama.cpp hands it to the
template (common/chat.cpp): messages normalised (content "" when absent, tool calls as
{type, function: {name, arguments}, id}, a system message merged into the next one where the
template does not take system messages), bos_token/eos_token from the model's vocabulary,
enable_thinking, tools when given, the `datetime` and `date_string` llama.cpp adds (overridden here
through chat_template_kwargs so renderings do not depend on the day), and add_generation_prompt only
when true. A template that calls strftime_now() gets the day's date from llama.cpp; such cases store
`now` (noon UTC of that day) for the test to pass to the renderer.

Usage (from the repository root; needs only the standard library):
  /usr/bin/python3 tools/scripts/make_template_fixtures.py [--llama-bin DIR] [--check-jinja2]
--check-jinja2 also renders each case with Python's jinja2 (transformers' settings) when it is
importable and reports differences: a check on the context, not part of the fixture.
"""
import argparse
import calendar
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peers import free_port, stage_bin  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(ROOT, "tests", "data", "templates")
MODEL = os.path.join(ROOT, "tests", "data", "stories260K.gguf")
FIXED_DATE = {"date_string": "26 Jul 2024", "datetime": "Jul 26 2024"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone (é, 日本)",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": []},
    },
}


def tool_call(name, args, call_id="call12345"):
    # arguments as a JSON string, as OpenAI clients send them; llama.cpp keeps the string.
    return {"type": "function", "function": {"name": name, "arguments": args}, "id": call_id}


SYS = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [SYS, {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [
        SYS,
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "no_system": [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question"},
    ],
    "whitespace_unicode": [
        {"role": "user", "content": "  Héllo, \"wörld\" 'quotes' \\ back 😀 \n\t"},
        {"role": "assistant", "content": "\n answer with <tags> & {braces} {{ not jinja }}  \n"},
        {"role": "user", "content": "日本語で? {% raw %}\n\n"},
    ],
    "thinking": [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of scattering."},
        {"role": "user", "content": "And sunsets?"},
    ],
    "tool_call": [
        SYS,
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", "{\"location\": \"Paris\", \"unit\": \"celsius\"}")]},
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}", "tool_call_id": "call12345"},
    ],
    "tool_call_no_system": [
        {"role": "user", "content": "Weather in Oslo, please"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", "{\"location\": \"Oslo\"}", "callAbCd9")]},
        {"role": "tool", "content": "-3 degrees", "tool_call_id": "callAbCd9"},
        {"role": "assistant", "content": "It is -3 degrees in Oslo."},
        {"role": "user", "content": "Thanks!"},
    ],
    "parallel_tool_calls": [
        {"role": "user", "content": "Weather and time in Tokyo?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            tool_call("get_weather", "{\"location\": \"Tokyo\"}", "call00001"),
            tool_call("get_time", "{\"tz\": \"Asia/Tokyo\"}", "call00002")]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call00001"},
        {"role": "tool", "content": "10:00", "tool_call_id": "call00002"},
    ],
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

BASIC = ["single_user", "system_user", "multi_turn", "no_system", "whitespace_unicode"]
# Per template: conversations, whether llama.cpp sees system-message support (else it merges the
# system message into the next one), whether it passes tool-call arguments as objects, the
# conversations rendered with the tool list, and enable_thinking values.
CONFIG = {
    "llama3.jinja": {"convs": BASIC + ["thinking"]},
    "llama3.1.jinja": {"convs": BASIC + ["tool_call", "tool_call_no_system"], "tools": ["system_user", "tool_call", "tool_call_no_system"],
                       "object_args": True, "kwargs": {"tools_in_user_message": False}, "kwargs_cases": ["tool_call"]},
    "llama3.2.jinja": {"convs": BASIC + ["tool_call"], "tools": ["single_user", "tool_call"], "object_args": True},
    "qwen2.5.jinja": {"convs": BASIC + ["tool_call", "tool_call_no_system", "parallel_tool_calls"],
                      "tools": ["single_user", "system_user", "tool_call", "parallel_tool_calls"], "object_args": True},
    "qwen3.jinja": {"convs": BASIC + ["thinking", "tool_call", "parallel_tool_calls"], "tools": ["system_user", "tool_call", "parallel_tool_calls"],
                    "object_args": True, "thinking": [True, False]},
    "gemma2.jinja": {"convs": BASIC, "system": False},
    "gemma3.jinja": {"convs": BASIC},
    "mistral-v0.3.jinja": {"convs": BASIC + ["tool_call", "tool_call_no_system"], "tools": ["single_user", "tool_call"], "object_args": True},
    "phi3.jinja": {"convs": BASIC},
    "smollm2.jinja": {"convs": BASIC},
    "zephyr.jinja": {"convs": BASIC},
    "deepseek-r1-distill.jinja": {"convs": BASIC + ["thinking", "tool_call"], "thinking": [True]},
}


def gguf_without_auto_bos(src, dst):
    """A copy of the model with tokenizer.ggml.add_bos_token/add_eos_token = false: llama.cpp strips
    a rendered leading BOS when the vocabulary adds one itself, and the fixture wants the
    template's own output."""
    f = open(src, "rb").read()
    off = [4]

    def rd(fmt):
        v = struct.unpack_from("<" + fmt, f, off[0])
        off[0] += struct.calcsize("<" + fmt)
        return v[0]

    def skip_str():
        n = rd("Q")
        off[0] += n

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_val(t):
        if t == 8:
            skip_str()
        elif t == 9:
            at, n = rd("I"), rd("Q")
            for _ in range(n):
                skip_val(at)
        else:
            off[0] += sizes[t]

    assert f[:4] == b"GGUF"
    ver, nt, nkv = rd("I"), rd("Q"), rd("Q")
    kv_start = off[0]
    for _ in range(nkv):
        skip_str()
        skip_val(rd("I"))
    kv_end = off[0]
    for _ in range(nt):
        skip_str()
        dims = rd("I")
        off[0] += 8 * dims + 4 + 8
    ti_end = off[0]
    align = 32
    data_start = (ti_end + align - 1) // align * align

    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    extra = b"".join(s(k) + struct.pack("<I", 7) + b"\0" for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"))
    head = f[:4] + struct.pack("<IQQ", ver, nt, nkv + 2) + f[kv_start:kv_end] + extra + f[kv_end:ti_end]
    head += b"\0" * ((-len(head)) % align)
    open(dst, "wb").write(head + f[data_start:])


class server:
    def __init__(self, bin_dir, model, template):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.p = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "--jinja", "--chat-template-file", template,
                                   "--port", str(self.port), "-t", "1", "-c", "512", "--no-prefill-assistant"],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(300):
            if self.p.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(self.log.read().decode(errors="replace")[-3000:])
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port).read()
                return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("llama-server did not start")

    def apply(self, body):
        req = urllib.request.Request("http://127.0.0.1:%d/apply-template" % self.port, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            return json.loads(urllib.request.urlopen(req).read())["prompt"], None
        except urllib.error.HTTPError as e:
            return None, e.read().decode(errors="replace")

    def close(self):
        self.p.terminate()
        self.p.wait()


def normalise(messages, cfg):
    """The messages as llama.cpp passes them to the template (common_chat_msg::to_json_oaicompat
    and the workarounds in common_chat_templates_apply_jinja)."""
    out = []
    for m in messages:
        j = {"role": m["role"], "content": m.get("content") or ""}
        if "tool_call_id" in m:
            j["tool_call_id"] = m["tool_call_id"]
        if m.get("tool_calls"):
            j["tool_calls"] = []
            for tc in m["tool_calls"]:
                args = tc["function"]["arguments"]
                if cfg.get("object_args"):
                    args = json.loads(args)
                j["tool_calls"].append({"type": "function", "function": {"name": tc["function"]["name"], "arguments": args}, "id": tc["id"]})
        out.append(j)
    if not cfg.get("system", True) and out and out[0]["role"] == "system":
        if len(out) > 1:
            out[1]["content"] = out[0]["content"] + "\n" + out[1]["content"]
        out = out[1:]
    return out


def jinja2_render(src, ctx):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from datetime import datetime

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.utcfromtimestamp(ctx.get("__now__", time.time())).strftime(fmt)
    c = {k: v for k, v in ctx.items() if k != "__now__"}
    return env.from_string(src).render(**c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default="/work/shared/peers/llama.cpp/bin")
    ap.add_argument("--out", default=os.path.join(TEMPLATES, "reference.json"))
    ap.add_argument("--only", help="one template file name")
    ap.add_argument("--check-jinja2", action="store_true")
    args = ap.parse_args()

    # stage_bin wants the folder holding bin/ (the peers' llama.cpp).
    bin_dir = stage_bin(os.path.dirname(os.path.abspath(args.llama_bin)), tempfile.mkdtemp(prefix="llama-bin-"))
    model = os.path.join(bin_dir, "model.gguf")
    gguf_without_auto_bos(MODEL, model)
    # stories260K's vocabulary: what llama.cpp passes as bos_token / eos_token.
    bos, eos = "<s>", "</s>"
    today = time.gmtime()
    noon = calendar.timegm((today.tm_year, today.tm_mon, today.tm_mday, 12, 0, 0))

    cases, skipped, mismatched = [], [], []
    for name in sorted(CONFIG):
        if args.only and name != args.only:
            continue
        cfg = CONFIG[name]
        path = os.path.join(TEMPLATES, name)
        src = open(path, encoding="utf-8").read()
        srv = server(bin_dir, model, path)
        try:
            variants = []
            for conv in cfg["convs"]:
                for agp in (True, False):
                    for think in cfg.get("thinking", [False]):
                        variants.append((conv, agp, think, False, False))
                        if conv in cfg.get("tools", []):
                            variants.append((conv, agp, think, True, False))
                        if conv in cfg.get("kwargs_cases", []):
                            variants.append((conv, agp, think, True, True))
            for conv, agp, think, with_tools, with_kwargs in variants:
                kwargs = dict(FIXED_DATE, enable_thinking=think)
                if with_kwargs:
                    kwargs.update(cfg["kwargs"])
                body = {"messages": CONVERSATIONS[conv], "add_generation_prompt": agp, "chat_template_kwargs": kwargs}
                if with_tools:
                    body["tools"] = TOOLS
                label = "%s%s%s%s/%s" % (conv, "+tools" if with_tools else "", "+kwargs" if with_kwargs else "",
                                         "+think" if think else "", "gen" if agp else "nogen")
                prompt, err = srv.apply(body)
                if prompt is None:
                    skipped.append((name, label, err[:300]))
                    continue
                ctx = {"messages": normalise(CONVERSATIONS[conv], cfg), "bos_token": bos, "eos_token": eos, "enable_thinking": think}
                if with_tools:
                    ctx["tools"] = TOOLS
                ctx.update(kwargs)
                if agp:
                    ctx["add_generation_prompt"] = True
                case = {"template": name, "name": label, "context": ctx, "expected": prompt}
                if cfg.get("dated"):
                    case["now"] = noon
                cases.append(case)
                if args.check_jinja2:
                    try:
                        j = jinja2_render(src, dict(ctx, __now__=noon))
                    except Exception as e:  # noqa: BLE001 - report whatever jinja2 says
                        j = "ERROR: %s" % e
                    if j != prompt:
                        mismatched.append((name, label, prompt, j))
        finally:
            srv.close()

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("%d cases written to %s" % (len(cases), args.out))
    for s in skipped:
        print("skipped (llama.cpp refused): %s %s: %s" % s)
    for name, label, l, j in mismatched:
        print("jinja2 differs: %s %s\n  llama.cpp: %r\n  jinja2:    %r" % (name, label, l, j))
    shutil.rmtree(os.path.dirname(bin_dir), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
