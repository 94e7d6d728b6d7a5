"""Drive pipeshard-server with the real OpenAI Python client.

usage: openai_client.py BASE_URL MODE [API_KEY]
MODE: chat | stream | embeddings | json_schema | tools | unauthorized
Prints one JSON object with what it saw; exits non-zero (with a message)
when the server's answer is not what the client expects.
"""

import json
import sys

import openai  # noqa: F401  (fail loudly when the client is missing)
from openai import OpenAI


def main() -> int:
    base, mode = sys.argv[1], sys.argv[2]
    key = sys.argv[3] if len(sys.argv) > 3 else "no-key"
    client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Name one colour."}]
    out = {"openai_version": openai.__version__}
    if mode == "chat":
        models = client.models.list()
        model = models.data[0].id
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0, seed=1)
        c = r.choices[0]
        assert r.object == "chat.completion", r.object
        assert c.message.role == "assistant"
        assert isinstance(c.message.content, str) and c.message.content, c
        assert c.finish_reason in ("stop", "length"), c.finish_reason
        assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        lp = client.chat.completions.create(
            model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
        )
        content = lp.choices[0].logprobs.content
        assert len(content) >= 1, lp
        for t in content:
            assert t.logprob <= 0.0 and len(t.top_logprobs) == 3, t
            assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        out.update(model=model, text=c.message.content, usage=r.usage.model_dump(), n_logprobs=len(content))
    elif mode == "stream":
        stream = client.chat.completions.create(
            model="any", messages=msgs, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage, n = "", None, None, 0
        for chunk in stream:
            n += 1
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    text += ch.delta.content
                if ch.finish_reason:
                    finish = ch.finish_reason
        assert finish in ("stop", "length"), finish
        assert usage is not None and usage.completion_tokens > 0, usage
        full = client.chat.completions.create(model="any", messages=msgs, max_tokens=16, temperature=0)
        assert full.choices[0].message.content == text, (full.choices[0].message.content, text)
        out.update(text=text, chunks=n, finish=finish, usage=usage.model_dump())
    elif mode == "embeddings":
        r = client.embeddings.create(model="any", input=["hello world", "a completely different sentence"])
        assert len(r.data) == 2, r
        a, b = r.data[0].embedding, r.data[1].embedding
        assert len(a) == len(b) and len(a) > 0
        norm = sum(x * x for x in a) ** 0.5
        assert abs(norm - 1.0) < 1e-3, norm
        assert a != b
        f = client.embeddings.create(model="any", input="hello world", encoding_format="float")
        assert max(abs(x - y) for x, y in zip(f.data[0].embedding, a)) < 1e-5
        assert r.usage.prompt_tokens > 0
        out.update(dim=len(a), norm=norm)
    elif mode == "json_schema":
        schema = {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["name", "age", "ok"],
            "additionalProperties": False,
        }
        r = client.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            max_tokens=96,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
        )
        text = r.choices[0].message.content
        obj = json.loads(text)
        assert set(obj) == {"name", "age", "ok"}, obj
        assert isinstance(obj["name"], str) and isinstance(obj["age"], int) and isinstance(obj["ok"], bool), obj
        out.update(json=obj)
    elif mode == "tools":
        tools = [{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"],
                },
            },
        }]
        # A tiny model calls tools the way the conversation shows it (the
        # server runs a tool-call template: --chat-template-file).
        ask = []
        for i, city in enumerate(["London", "Rome", "Berlin"]):
            ask += [
                {"role": "user", "content": f"What is the weather in {city}?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": f"call_{i}", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
                }]},
                {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
                {"role": "assistant", "content": f"It is sunny in {city}."},
            ]
        ask.append({"role": "user", "content": "What is the weather in Paris?"})
        r = client.chat.completions.create(
            model="any", messages=ask, tools=tools, tool_choice="required", max_tokens=64, temperature=0
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather", call
        args = json.loads(call.function.arguments)
        assert isinstance(args["city"], str), args
        # The tool's answer goes back in the conversation.
        follow = client.chat.completions.create(
            model="any",
            messages=ask + [
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
            ],
            tools=tools,
            max_tokens=16,
            temperature=0,
        )
        assert follow.choices[0].message.role == "assistant", follow
        # Streamed, the call arrives in deltas that add up to the same call.
        stream = client.chat.completions.create(
            model="any", messages=ask, tools=tools, tool_choice="required", max_tokens=64, temperature=0, stream=True
        )
        name, arguments, finish = "", "", None
        for chunk in stream:
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    name += tc.function.name or ""
                    arguments += tc.function.arguments or ""
                finish = ch.finish_reason or finish
        assert name == "get_weather" and json.loads(arguments) == args, (name, arguments)
        assert finish == "tool_calls", finish
        out.update(tool=call.function.name, arguments=args)
    elif mode == "unauthorized":
        try:
            client.chat.completions.create(model="any", messages=msgs, max_tokens=2)
        except openai.AuthenticationError as e:
            out.update(status=e.status_code)
        else:
            raise AssertionError("expected a 401")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
