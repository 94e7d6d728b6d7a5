"""Drive pipeshard-server with the real Anthropic Python client (/v1/messages).

usage: anthropic_client.py BASE_URL MODE
MODE: messages | stream | tools | count_tokens
Prints one JSON object with what it saw; exits non-zero (with a message)
when the server's answer is not what the client expects.
"""

import json
import sys

import anthropic
from anthropic import Anthropic

# Greedy sampling (the client has no temperature parameter): llama.cpp's own field.
GREEDY = {"temperature": 0}

TOOLS = [{
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}]


def main() -> int:
    base, mode = sys.argv[1], sys.argv[2]
    client = Anthropic(base_url=base, api_key="no-key", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Name one colour."}]
    out = {"anthropic_version": anthropic.__version__}
    if mode == "messages":
        r = client.messages.create(
            model="any", max_tokens=16, messages=msgs, system="You are terse.", extra_body=GREEDY
        )
        assert r.type == "message" and r.role == "assistant", r
        assert r.content and r.content[0].type == "text" and r.content[0].text, r
        assert r.stop_reason in ("end_turn", "max_tokens"), r.stop_reason
        assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
        out.update(text=r.content[0].text, stop=r.stop_reason, usage=r.usage.model_dump())
    elif mode == "stream":
        with client.messages.stream(model="any", max_tokens=16, messages=msgs, extra_body=GREEDY) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text and final.content[0].text == text, (text, final)
        full = client.messages.create(model="any", max_tokens=16, messages=msgs, extra_body=GREEDY)
        assert full.content[0].text == text, (full.content[0].text, text)
        out.update(text=text, stop=final.stop_reason)
    elif mode == "tools":
        # A tiny model calls tools the way the conversation shows it (the
        # server runs a tool-call template: --chat-template-file).
        ask = []
        for i, city in enumerate(["London", "Rome", "Berlin"]):
            ask += [
                {"role": "user", "content": f"What is the weather in {city}?"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather", "input": {"city": city}},
                ]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "sunny"}]},
                {"role": "assistant", "content": f"It is sunny in {city}."},
            ]
        ask.append({"role": "user", "content": "What is the weather in Paris?"})
        r = client.messages.create(
            model="any", max_tokens=64, messages=ask, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY
        )
        assert r.stop_reason == "tool_use", r
        use = next(b for b in r.content if b.type == "tool_use")
        assert use.name == "get_weather" and isinstance(use.input["city"], str), use
        follow = client.messages.create(
            model="any",
            max_tokens=16,
            tools=TOOLS,
            extra_body=GREEDY,
            messages=ask + [
                {"role": "assistant", "content": [b.model_dump() for b in r.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]},
            ],
        )
        assert follow.role == "assistant" and follow.content, follow
        with client.messages.stream(
            model="any", max_tokens=64, messages=ask, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY
        ) as s:
            final = s.get_final_message()
        streamed = next(b for b in final.content if b.type == "tool_use")
        assert streamed.name == "get_weather" and streamed.input == use.input, (streamed, use)
        out.update(tool=use.name, input=use.input)
    elif mode == "count_tokens":
        n = client.messages.count_tokens(model="any", messages=msgs)
        assert n.input_tokens > 0, n
        out.update(input_tokens=n.input_tokens)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
