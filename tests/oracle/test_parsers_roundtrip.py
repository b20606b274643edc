"""Reasoning and tool-call parsing of real renderings, streamed in random chunks.

Python jinja2 renders assistant turns (reasoning, content, tool calls) with the fixture chat
templates; the text between the generation prompt and the end-of-turn token is what the model
would have generated. dspark_tool_parser must recover the message from it (reasoning, content,
tool calls with their typed arguments), identically in one shot and for every chunking.
"""
import json
import random
import subprocess

from conftest import tool
from test_chat_templates_jinja2 import ENV, SEARCH_TOOL, SYSTEM, TEMPLATES, USER, WEATHER_TOOL, _call

TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
# Template, its end-of-turn token, whether it renders an assistant's content next to its tool
# calls (Llama 3 renders only the call), and whether it renders reasoning_content.
ROUNDTRIP_TEMPLATES = {
    "nemotron3-crlf": ("<|im_end|>", True, True),
    "nemotron3-lf": ("<|im_end|>", True, True),
    "qwen3": ("<|im_end|>", True, True),
    "llama3.1": ("<|eot_id|>", False, False),
    "llama3.2": ("<|eot_id|>", False, False),
}

FINAL_TURNS = {
    "content": {"role": "assistant", "content": "It is sunny in Paris."},
    "reasoning": {"role": "assistant", "content": "Sunny, 21 °C.", "reasoning_content": "The user wants the weather.\nI will answer."},
    "angle_brackets": {"role": "assistant", "content": "Use a < b and <b>bold</b>; not </think> tags.",
                       "reasoning_content": "Mention <tool_call> syntax without calling anything."},
    "unicode": {"role": "assistant", "content": "Bien sûr — 好的！🙂\nLine two.", "reasoning_content": "思考中… ✓"},
    "call": {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"location": "Paris, France", "unit": "celsius"})]},
    "reasoning_call": {"role": "assistant", "content": "", "reasoning_content": "I need the tool.",
                       "tool_calls": [_call("get_weather", {"location": "Rome", "days": 3})]},
    "content_call": {"role": "assistant", "content": "Let me check that for you.",
                     "tool_calls": [_call("get_weather", {"location": "Oslo"})]},
    "typed_arguments": {"role": "assistant", "content": "", "tool_calls": [_call("search_docs", {
        "query": "multi-line\n  query with \"quotes\" and <tags>", "tags": ["rain", "gear"],
        "filters": {"lang": "en", "year": 2024}, "exact": True, "limit": 2.5})]},
    "two_calls": {"role": "assistant", "content": "Checking both.", "tool_calls": [
        _call("get_weather", {"location": "Paris", "days": 2}),
        _call("search_docs", {"query": "umbrella", "tags": []}, "call67890")]},
}


def _model_output(template, messages, kwargs, end_token):
    """The text a model would generate for messages[-1], or None when the template does not
    render that turn as a continuation of its own generation prompt."""
    variables = dict(tools=TOOLS, documents=None, bos_token="", eos_token=end_token, **kwargs)
    try:
        prompt = template.render(messages=messages[:-1], add_generation_prompt=True, **variables)
        full = template.render(messages=messages, add_generation_prompt=False, **variables)
    except Exception:  # noqa: BLE001 - a template refusing the shape (e.g. Llama's single call)
        return None
    if not full.startswith(prompt):
        return None
    turn = full[len(prompt):]
    end = turn.rfind(end_token)
    if end < 0:
        return None
    return prompt, turn[:end]


def _expected(message, renders_content_with_calls, renders_reasoning):
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message.get("tool_calls", [])]
    content = message["content"].strip()
    if calls and not renders_content_with_calls:
        content = ""
    reasoning = message.get("reasoning_content", "").strip() if renders_reasoning else ""
    return {"reasoning": reasoning, "content": content, "tool_calls": calls}


def _normalise(parsed):
    return {"reasoning": parsed["reasoning"], "content": parsed["content"],
            "tool_calls": [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in parsed["tool_calls"]]}


def test_rendered_turns_parse_back_in_any_chunking(tmp_path):
    rng = random.Random(1234)
    cases, expectations = [], []
    for name, (end_token, *renders) in ROUNDTRIP_TEMPLATES.items():
        path = TEMPLATES[name][0]
        template = ENV.from_string(path.read_bytes().decode("utf-8"))
        for turn_name, turn in FINAL_TURNS.items():
            for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
                for history in ([USER], [SYSTEM, USER]):
                    rendered = _model_output(template, history + [turn], kwargs, end_token)
                    if rendered is None:
                        continue
                    prompt, output = rendered
                    chunkings = [[1] * len(output.encode())] + [
                        [rng.randint(1, 9) for _ in range(len(output.encode()))] for _ in range(6)]
                    cases.append({"template_file": str(path), "prompt": prompt, "tools": TOOLS, "output": output,
                                  "chunkings": chunkings})
                    expectations.append((f"{name}/{turn_name}/{kwargs}/{len(history)}", turn, renders))
    covered = {label.split("/")[0] for label, _, _ in expectations}
    assert covered == set(ROUNDTRIP_TEMPLATES), covered
    assert len(cases) >= 80, len(cases)

    cases_path, results_path = tmp_path / "cases.json", tmp_path / "results.json"
    cases_path.write_text(json.dumps({"cases": cases}, ensure_ascii=False), encoding="utf-8")
    subprocess.run([tool("parser"), str(cases_path), str(results_path)], check=True, timeout=300)
    results = json.loads(results_path.read_text(encoding="utf-8"))

    failures = []
    for case, (label, turn, renders), result in zip(cases, expectations, results, strict=True):
        oneshot = _normalise(result["oneshot"])
        expected = _expected(turn, *renders)
        if oneshot != expected:
            failures.append(f"{label}: output {case['output']!r}\n  parsed   {oneshot}\n  expected {expected}")
        for streamed in result["streamed"]:
            if streamed != result["oneshot"]:
                failures.append(f"{label}: streamed {streamed} != one-shot {result['oneshot']}")
                break
    assert not failures, "\n".join(failures[:20])
