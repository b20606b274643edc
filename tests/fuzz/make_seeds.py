"""Writes the seed corpora of tests/fuzz/corpus/ (committed; rerun only to change them):
small real inputs per harness, built from the repository's fixtures and the PyPI writers of
each format (safetensors, gguf, tokenizers), so every seed is a file those libraries accept.

    ~/.cache/dspark/venv/bin/python tests/fuzz/make_seeds.py [--shared ../shared]
"""
import argparse
import json
import pathlib
import struct
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


def write(harness, name, data):
    path = CORPUS / harness / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def dumps(value):
    return json.dumps(value, ensure_ascii=False)


# --- safetensors -----------------------------------------------------------------------------
def safetensors_seeds():
    from safetensors.numpy import save
    write("safetensors", "f32_bf16_i8.safetensors", save({
        "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b.scales": np.ones((2, 2), dtype=np.float16),
        "c.ids": np.array([1, -2, 3], dtype=np.int8),
        "d.empty": np.zeros((0, 4), dtype=np.float32)}, metadata={"format": "mlx"}))
    write("safetensors", "u32_scalar.safetensors", save({
        "q.weight": np.array([[0x12345678, 0x9abcdef0]], dtype=np.uint32),
        "s": np.array(2.5, dtype=np.float32)}))
    # Written by hand: bf16 (numpy has none) and a header padded with spaces.
    header = dumps({"__metadata__": {"format": "pt"},
                    "w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    write("safetensors", "bf16_padded.safetensors",
          struct.pack("<Q", len(header)) + header + bytes(range(8)))


# --- GGUF ------------------------------------------------------------------------------------
def gguf_seeds():
    import gguf
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + \
        [bytes([b]).decode("latin-1") for b in range(33, 127)] + ["Ġ", "He", "ll", "Hell", "Ġw"]
    with tempfile.TemporaryDirectory() as tmp:
        def build(name, arch, quant):
            path = pathlib.Path(tmp) / name
            writer = gguf.GGUFWriter(str(path), arch)
            writer.add_block_count(1)
            writer.add_context_length(64)
            writer.add_tokenizer_model("gpt2")
            writer.add_tokenizer_pre("smollm")
            writer.add_token_list(tokens)
            writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
            writer.add_token_merges(["H e", "l l", "He ll", "Ġ w"])
            writer.add_bos_token_id(1)
            writer.add_eos_token_id(2)
            writer.add_string("general.name", "seed")
            writer.add_array("seed.list", [1, 2, 3])
            weights = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
            if quant:
                data = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
                writer.add_tensor("blk.0.w", data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                writer.add_tensor("blk.0.w", weights)
            writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            write("gguf", name, path.read_bytes())
        build("llama_f32.gguf", "llama", False)
        build("llama_q8_0.gguf", "llama", True)


# --- tokenizer.json ----------------------------------------------------------------------------
TEXT = ("Hello world! The quick brown fox jumps over the lazy dog. caf\u00e9 na\u00efve \u4e2d\u6587 "
        "\U0001f600 1234567 <|im_start|>user\nhi<|im_end|> tabs\tand  spaces\n\n")


def tokenizer_seeds():
    from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                            trainers, AddedToken)
    corpus = [TEXT * 3, "def f(x):\n    return x * 2\n", "Le caf\u00e9 est tr\u00e8s bon."]
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    byte_level.post_processor = processors.ByteLevel(trim_offsets=False)
    byte_level.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    byte_level.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    write("tokenizer", "byte_level_bpe.json", byte_level.to_str() + "\0" + TEXT)

    metaspace = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    metaspace.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                 normalizers.Replace(" ", "\u2581")])
    metaspace.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    metaspace.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"] +
        [f"<0x{b:02X}>" for b in range(256)]))
    metaspace.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A </s> $B", special_tokens=[("<s>", 1), ("</s>", 2)])
    write("tokenizer", "metaspace_byte_fallback.json", metaspace.to_str() + "\0" + TEXT)

    split = Tokenizer(models.BPE())
    split.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    split.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    split.decoder = decoders.ByteLevel()
    split.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=280, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    write("tokenizer", "nfkc_split_regex.json", split.to_str() + "\0" + TEXT.upper())


# --- config.json ---------------------------------------------------------------------------------
def config_seeds(shared):
    nemotron = {"model_type": "nemotron_h", "vocab_size": 96, "hidden_size": 64,
                "hybrid_override_pattern": "M*E-", "num_hidden_layers": 4,
                "layer_norm_epsilon": 1e-5, "max_position_embeddings": 512, "mamba_num_heads": 4,
                "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
                "use_conv_bias": True, "chunk_size": 8, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "n_routed_experts": 8,
                "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5, "moe_intermediate_size": 32, "n_shared_experts": 1,
                "moe_shared_expert_intermediate_size": 48, "intermediate_size": 96}
    llama = {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2,
             "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
             "tie_word_embeddings": True}
    write("model_config", "tiny_nemotron_h.json", json.dumps(nemotron, indent=2))
    write("model_config", "tiny_llama.json", json.dumps(llama, indent=2))
    write("model_config", "tiny_llama_rope_scaling.json", json.dumps(dict(
        llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
        indent=2))
    write("model_config", "tiny_qwen3_quantized.json", json.dumps(dict(
        llama, model_type="qwen3", head_dim=16, tie_word_embeddings=False,
        quantization={"group_size": 64, "bits": 4}), indent=2))
    write("model_config", "smollm2.json", (shared / "fixtures/smollm2/config.json").read_text())
    write("model_config", "nemotron_3_nano.json",
          (shared / "fixtures/nemotron-3-nano/config.from-jax-test-literal.json").read_text())
    for drafter in ["specforge-qwen3-4b-dspark", "specforge-qwen3-4b-dflash",
                    "zlab-dflash2-test-fixture"]:
        write("model_config", f"drafter_{drafter}.json",
              (shared / "fixtures/drafter-configs" / drafter / "config.json").read_text())


# --- chat templates ------------------------------------------------------------------------------
CONVERSATION = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
         "tool_calls": [{"type": "function", "id": "c1",
                         "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks <|im_end|> {{ 7*7 }}"}],
    "tools": [{"type": "function", "function": {
        "name": "weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}],
    "add_generation_prompt": True, "enable_thinking": False, "bos_token": "<s>",
    "eos_token": "</s>"}

SYNTHETIC_TEMPLATES = {
    "macros_and_filters.jinja": (
        "{%- macro show(m, depth=0) -%}{{ m.role | upper }}: {{ m.content | trim }}"
        "{%- if m.tool_calls %}{% for c in m.tool_calls %} [{{ c.function.name }}"
        "({{ c.function.arguments | tojson }})]{% endfor %}{% endif %}{%- endmacro -%}"
        "{%- set ns = namespace(n=0) -%}"
        "{%- for m in messages if m.role != 'tool' -%}{%- set ns.n = ns.n + 1 -%}"
        "{{ loop.index }}/{{ loop.length }} {{ show(m) }}\n{%- endfor -%}"
        "{{ ns.n ~ ' messages; ' ~ (tools | length) }} {{ '%05d' | format(42) }}"
        "{{ messages[-1].content.split(' ') | join(',') | replace(',', ';') }}"
        "{{ {'a': [1, 2.5, none, true]} | tojson(indent=2) }}{{ range(3) | list | sum }}"
        "{%- if add_generation_prompt %}\nassistant:{% endif %}"),
    "call_blocks.jinja": (
        "{% macro wrap() %}<{{ caller() }}>{% endmacro %}"
        "{% call wrap() %}{{ messages | selectattr('role', 'equalto', 'user') | map(attribute="
        "'content') | join(' / ') }}{% endcall %}"
        "{% filter upper %}{{ raise_exception is defined }}{% endfilter %}"
        "{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }}{% if not loop.last %}&{% endif %}"
        "{% endfor %}{{ 'abc'[::-1] }}{{ (3 // 2, 7 % 3, 2 ** 10) }}{{ messages[0]['content'][:4] }}"),
}


def jinja_seeds(shared):
    context = dumps(CONVERSATION)
    write("jinja", "qwen3.jinja", (shared / "fixtures/qwen3/chat_template.jinja").read_text()
          + "\0" + context)
    for name in ["HuggingFaceTB-SmolLM3-3B.jinja", "NVIDIA-Nemotron-Nano-v2.jinja",
                 "google-gemma-2-2b-it.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja"]:
        write("jinja", name, (shared / "fixtures/templates" / name).read_text() + "\0" + context)
    for name, source in SYNTHETIC_TEMPLATES.items():
        write("jinja", name, source + "\0" + context)


# --- JSON Schema ---------------------------------------------------------------------------------
SCHEMAS = {
    "object_required.json": ({"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                             "maxItems": 3}},
        "required": ["name"]}, {"name": "Bob", "age": 7, "tags": ["a"]}),
    "anyof_ref_recursive.json": ({"$defs": {"node": {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
        "$ref": "#/$defs/node"}, {"v": 1.5, "kids": [{"v": None, "kids": []}]}),
    "types_const_oneof.json": ({"oneOf": [{"const": "yes"}, {"type": ["boolean", "null"]},
                                          {"type": "object", "additionalProperties": True}]},
                               {"x": [1, "\u00e9", {"y": False}]}),
    "strict_openai.json": ({"type": "object", "additionalProperties": False, "properties": {
        "steps": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "explanation": {"type": "string"}, "output": {"type": "string"}},
            "required": ["explanation", "output"], "additionalProperties": False}},
        "final_answer": {"type": "string"}}, "required": ["steps", "final_answer"]},
        {"steps": [{"explanation": "x", "output": "y"}], "final_answer": "z"}),
}


def schema_seeds():
    for name, (schema, answer) in SCHEMAS.items():
        # json.dumps' default separators are the layout the grammars write.
        write("json_schema", name, dumps(schema) + "\0" + dumps(answer))
    write("json_schema", "true_schema.json", "true\0[1, 2]")


# --- request bodies ------------------------------------------------------------------------------
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = CONVERSATION["tools"]
REQUESTS = {
    "chat_basic.json": {"model": "m", "messages": QUESTION, "max_tokens": 16, "temperature": 0.7,
                        "top_p": 0.9, "stop": ["\n\n"], "seed": 7, "stream": True,
                        "stream_options": {"include_usage": True}},
    "chat_tools.json": {"messages": CONVERSATION["messages"], "tools": TOOLS,
                        "tool_choice": {"type": "function", "function": {"name": "weather"}},
                        "parallel_tool_calls": False, "chat_template_kwargs":
                        {"enable_thinking": True}, "logit_bias": {"0": -100, "15": 2.5},
                        "logprobs": True, "top_logprobs": 3, "reasoning_effort": "low"},
    "chat_schema.json": {"messages": QUESTION, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "strict": True,
                                               "schema": SCHEMAS["object_required.json"][0]}},
        "reasoning_budget": 16, "reasoning_budget_message": "Done."},
    "chat_string_arguments.json": {"messages": QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "21C"}]}],
        "tools": TOOLS, "tool_choice": "required", "n": 1},
    "completion.json": {"prompt": "Once upon a time", "max_tokens": 8, "logprobs": 2,
                        "json_schema": {"type": "string"}, "top_k": 40, "min_p": 0.05},
    "messages_tools.json": {"model": "claude", "max_tokens": 32, "system": [
        {"type": "text", "text": "Be brief."}], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it"},
            {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "21C", "is_error": False},
            {"type": "text", "text": "And tomorrow?"}]}],
        "tools": [{"name": "weather", "description": "d", "input_schema": TOOLS[0]["function"]
                   ["parameters"]}], "tool_choice": {"type": "auto",
                                                     "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 64}, "stop_sequences": ["END"],
        "stream": True, "metadata": {"user_id": "u1"}},
    "messages_format.json": {"max_tokens": 8, "messages": QUESTION, "output_config": {
        "format": {"type": "json_schema", "schema": SCHEMAS["anyof_ref_recursive.json"][0]}},
        "temperature": 0},
    "responses.json": {"model": "m", "instructions": "Be brief.", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "21C"}],
        "tools": [{"type": "function", "name": "weather", "parameters": TOOLS[0]["function"]
                   ["parameters"]}], "text": {"format": {"type": "json_object"}},
        "reasoning": {"effort": "none"}, "max_output_tokens": 16, "stream": False},
    "responses_string.json": {"input": "Hello", "text": {"format": {
        "type": "json_schema", "name": "s", "schema": SCHEMAS["strict_openai.json"][0]}}},
}


def request_seeds():
    for name, body in REQUESTS.items():
        write("request", name, dumps(body))
    # Refusals the body checks make before any translator runs.
    write("request", "nan_and_overflow.txt",
          '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN, "x": 1e999}')
    write("request", "deep.txt", '{"a":' * 200 + "1" + "}" * 200)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared"))
    shared = pathlib.Path(parser.parse_args().shared)
    safetensors_seeds()
    gguf_seeds()
    tokenizer_seeds()
    config_seeds(shared)
    jinja_seeds(shared)
    schema_seeds()
    request_seeds()


if __name__ == "__main__":
    main()
