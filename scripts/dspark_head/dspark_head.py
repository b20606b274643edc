"""The DSpark head in PyTorch, for training (docs/training.md): the same computation as
src/speculative/dspark.cpp and dspark_backbone.cpp (docs/speculative.md §11, DeepSpec schema,
slot convention logits_start 0, bidirectional block), the target's embedding and lm_head shared
and frozen, plus the target's own weights (dequantized from its MLX checkpoint) and the shard
reader of make_dataset.py's output.
"""
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file
from safetensors.torch import save_file

BLOCK_SIZE = 7
MASK_TOKEN_ID = 16  # <empty_output>: a SmolLM2 special token that chat text never contains


def dequantize_mlx(packed, scales, biases, bits, group_size):
    """MLX affine dequantization: w = scale * q + bias per group, q packed little-end first in
    uint32 words (docs/model-math.md §8)."""
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    q = (packed[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(packed.shape[0], -1).astype(np.float32)
    groups = q.reshape(q.shape[0], -1, group_size)
    w = groups * scales[..., None].astype(np.float32) + biases[..., None].astype(np.float32)
    return w.reshape(q.shape[0], -1)


class Target:
    """The target's tensors a DSpark head shares or is initialised from, as float32 tensors."""

    def __init__(self, model_dir):
        model_dir = Path(model_dir)
        self.config = json.loads((model_dir / "config.json").read_text())
        self.raw = load_file(str(model_dir / "model.safetensors"))
        self.quantization = self.config.get("quantization", {})

    def weight(self, name):
        if name + ".weight" in self.raw and name + ".scales" not in self.raw:
            return torch.from_numpy(self.raw[name + ".weight"].astype(np.float32))
        spec = self.quantization.get(name, self.quantization)
        return torch.from_numpy(dequantize_mlx(self.raw[name + ".weight"],
                                               self.raw[name + ".scales"],
                                               self.raw[name + ".biases"], spec["bits"],
                                               spec["group_size"]))

    def embedding(self):
        return self.weight("model.embed_tokens")


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, positions, theta):
    """Non-interleaved (half-split) RoPE over the last dimension; x [..., rows, heads, hd],
    positions [..., rows]."""
    hd = x.shape[-1]
    even = torch.arange(0, hd, 2, dtype=torch.float64, device=x.device)
    inv_freq = 1.0 / (theta ** (even / hd))
    angles = positions.to(torch.float64)[..., None] * inv_freq
    return rotate_half_split(x, torch.cos(angles).to(x.dtype)[..., None, :],
                             torch.sin(angles).to(x.dtype)[..., None, :])


def rotate_half_split(x, cos, sin):
    """RoPE's rotation of x's two halves by angles whose cos and sin broadcast against a half."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class DSparkHead(torch.nn.Module):
    def __init__(self, config, embedding):
        super().__init__()
        self.config = config
        H, I = config["hidden_size"], config["intermediate_size"]
        heads, kv, hd = (config["num_attention_heads"], config["num_key_value_heads"],
                         config["head_dim"])
        taps, r = len(config["target_layer_ids"]), config["markov_rank"]
        V = config["vocab_size"]
        Vd = config.get("draft_vocab_size") or V
        self.register_buffer("embedding", embedding, persistent=False)  # shared, frozen
        # A draft vocabulary (reduce_vocab.py): the head's own lm_head rows and each draft id's
        # target id; without one, the target's tied lm_head and the identity.
        self.lm_head = torch.nn.Parameter(torch.zeros(Vd, H)) if Vd != V else None
        self.register_buffer("draft_ids", torch.arange(Vd) if Vd != V else None,
                             persistent=False)

        def linear(rows, cols):
            return torch.nn.Parameter(torch.randn(rows, cols) / math.sqrt(cols))

        self.fc = linear(H, taps * H)
        self.hidden_norm = torch.nn.Parameter(torch.ones(H))
        self.layers = torch.nn.ModuleList()
        for _ in range(config["num_hidden_layers"]):
            layer = torch.nn.Module()
            layer.input_layernorm = torch.nn.Parameter(torch.ones(H))
            layer.post_attention_layernorm = torch.nn.Parameter(torch.ones(H))
            layer.q_proj = linear(heads * hd, H)
            layer.k_proj = linear(kv * hd, H)
            layer.v_proj = linear(kv * hd, H)
            layer.o_proj = linear(H, heads * hd)
            layer.q_norm = torch.nn.Parameter(torch.ones(hd))
            layer.k_norm = torch.nn.Parameter(torch.ones(hd))
            layer.gate_proj = linear(I, H)
            layer.up_proj = linear(I, H)
            layer.down_proj = torch.nn.Parameter(torch.zeros(H, I))
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.markov_w1 = torch.nn.Parameter(torch.randn(V, r) * 0.02)
        self.markov_w2 = torch.nn.Parameter(torch.zeros(Vd, r))
        self.confidence_w = torch.nn.Parameter(torch.zeros(1, H + r))
        self.confidence_b = torch.nn.Parameter(torch.zeros(1))

    def init_from_target(self, target, first_layer):
        """Backbone layers from the target's layers first_layer.. (same shapes; the q/k norms,
        which the llama target lacks, start at one), fc passing the deepest tap through, the
        final norm from the target's: training starts from a head whose hidden state already
        looks like the target's."""
        H = self.config["hidden_size"]
        with torch.no_grad():
            self.fc.zero_()
            self.fc[:, -H:] = torch.eye(H)
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{first_layer + i}"
                layer.input_layernorm.copy_(target.weight(p + ".input_layernorm"))
                layer.post_attention_layernorm.copy_(target.weight(p + ".post_attention_layernorm"))
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(layer, name).copy_(target.weight(f"{p}.self_attn.{name}"))
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(layer, name).copy_(target.weight(f"{p}.mlp.{name}"))
            self.norm.copy_(target.weight("model.norm"))

    def context(self, taps):
        """Per layer (K, V) of the context rows: taps [T, n_taps*H] -> [T, kv, hd] each, at
        positions 0..T-1 (docs/speculative.md §11.3)."""
        c = self.config
        eps, hd, kv = c["rms_norm_eps"], c["head_dim"], c["num_key_value_heads"]
        fused = rms_norm(taps @ self.fc.T, self.hidden_norm, eps)
        positions = torch.arange(taps.shape[0], device=taps.device)
        out = []
        for layer in self.layers:
            k = rms_norm((fused @ layer.k_proj.T).view(-1, kv, hd), layer.k_norm, eps)
            out.append((rope(k, positions, c["rope_theta"]),
                        (fused @ layer.v_proj.T).view(-1, kv, hd)))
        return out

    def backbone(self, context, anchors, anchor_tokens):
        """Hidden states [N, BLOCK, H] of N blocks [anchor, mask x 6] at positions anchor..;
        block n sees the context rows before its anchor and its own slots (§11.4, §11.5)."""
        c = self.config
        eps, hd = c["rms_norm_eps"], c["head_dim"]
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        N, W = anchors.shape[0], BLOCK_SIZE
        tokens = torch.full((N, W), MASK_TOKEN_ID, dtype=torch.long, device=anchors.device)
        tokens[:, 0] = anchor_tokens
        x = self.embedding[tokens]
        positions = anchors[:, None] + torch.arange(W, device=anchors.device)[None, :]
        T = context[0][0].shape[0]
        visible = torch.arange(T, device=anchors.device)[None, :] < anchors[:, None]  # [N, T]
        ctx_bias = torch.where(visible, 0.0, float("-inf"))[:, None, None, :]
        group = heads // kv
        for layer, (ctx_k, ctx_v) in zip(self.layers, context):
            a = rms_norm(x, layer.input_layernorm, eps)
            q = rope(rms_norm((a @ layer.q_proj.T).view(N, W, heads, hd), layer.q_norm, eps),
                     positions, c["rope_theta"])
            k = rope(rms_norm((a @ layer.k_proj.T).view(N, W, kv, hd), layer.k_norm, eps),
                     positions, c["rope_theta"])
            v = (a @ layer.v_proj.T).view(N, W, kv, hd)
            q = q.permute(0, 2, 1, 3)  # [N, heads, W, hd]
            kc = ctx_k.repeat_interleave(group, dim=1).permute(1, 0, 2)  # [heads, T, hd]
            vc = ctx_v.repeat_interleave(group, dim=1).permute(1, 0, 2)
            kb = k.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)  # [N, heads, W, hd]
            vb = v.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
            scale = 1.0 / math.sqrt(hd)
            scores = torch.cat([torch.einsum("nhwd,htd->nhwt", q, kc) * scale + ctx_bias,
                                torch.einsum("nhwd,nhud->nhwu", q, kb) * scale], dim=-1)
            p = torch.softmax(scores, dim=-1)
            o = torch.einsum("nhwt,htd->nhwd", p[..., :T], vc) + \
                torch.einsum("nhwu,nhud->nhwd", p[..., T:], vb)
            x = x + o.permute(0, 2, 1, 3).reshape(N, W, heads * hd) @ layer.o_proj.T
            m = rms_norm(x, layer.post_attention_layernorm, eps)
            x = x + (F.silu(m @ layer.gate_proj.T) * (m @ layer.up_proj.T)) @ layer.down_proj.T
        return rms_norm(x, self.norm, eps)

    def slot_outputs(self, hidden, prev_tokens):
        """Markov-biased logits [N, W, draft vocabulary] and confidence logits [N, W] with the
        previous token of each slot given (teacher forcing: the anchor, then the sequence's
        tokens)."""
        markov = self.markov_w1[prev_tokens]  # [N, W, r]
        logits = self.base_logits(hidden) + markov @ self.markov_w2.T
        # The confidence head only reads the drafter's features: its loss must not steer them.
        features = torch.cat([hidden.detach(), markov.detach()], dim=-1)
        confidence = (features @ self.confidence_w.T).squeeze(-1) + self.confidence_b
        return logits, confidence

    def base_logits(self, hidden):
        """The lm_head's logits over the draft vocabulary, before the Markov bias."""
        return hidden @ (self.embedding if self.lm_head is None else self.lm_head).T

    def to_target(self, draft_ids):
        return draft_ids if self.draft_ids is None else self.draft_ids[draft_ids]

    def from_target(self, target_ids):
        """Each target id's draft id, -1 for one outside the draft vocabulary."""
        if self.draft_ids is None:
            return target_ids
        table = torch.full((self.embedding.shape[0],), -1, dtype=torch.long,
                           device=target_ids.device)
        table[self.draft_ids] = torch.arange(len(self.draft_ids), device=target_ids.device)
        return table[target_ids]

    def narrow(self, draft_ids):
        """This full-vocabulary head as one over draft_ids (sorted target ids): its own lm_head
        holds those rows of the target's (frozen: they are the target's), markov_w2 keeps their
        rows. Training a narrowed head computes the product inference computes, over N rows
        instead of the whole vocabulary."""
        if self.draft_ids is not None:
            raise ValueError("the head already has a draft vocabulary")
        draft_ids = torch.as_tensor(draft_ids, dtype=torch.long)
        self.config = {**self.config, "draft_vocab_size": len(draft_ids)}
        self.lm_head = torch.nn.Parameter(self.embedding[draft_ids].clone(), requires_grad=False)
        self.markov_w2 = torch.nn.Parameter(self.markov_w2.detach()[draft_ids].clone())
        self.draft_ids = draft_ids

    def widen(self, q):
        """A distribution over the draft vocabulary as one over the target's (zeros elsewhere)."""
        if self.draft_ids is None:
            return q
        full = q.new_zeros(q.shape[:-1] + (self.embedding.shape[0],))
        full[..., self.draft_ids] = q
        return full

    def named_tensors(self):
        """The checkpoint's tensor names (DeepSpec schema) and this module's parameters."""
        t = {"fc.weight": self.fc, "hidden_norm.weight": self.hidden_norm,
             "norm.weight": self.norm, "markov_head.markov_w1.weight": self.markov_w1,
             "markov_head.markov_w2.weight": self.markov_w2,
             "confidence_head.proj.weight": self.confidence_w,
             "confidence_head.proj.bias": self.confidence_b}
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}"
            t[f"{p}.input_layernorm.weight"] = layer.input_layernorm
            t[f"{p}.post_attention_layernorm.weight"] = layer.post_attention_layernorm
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                t[f"{p}.self_attn.{name}.weight"] = getattr(layer, name)
            for name in ("gate_proj", "up_proj", "down_proj"):
                t[f"{p}.mlp.{name}.weight"] = getattr(layer, name)
        if self.lm_head is not None:
            t["lm_head.weight"] = self.lm_head
        return t

    def export(self, out_dir, dtype=torch.bfloat16):
        """config.json + model.safetensors in the DeepSpec schema, without the shared tensors
        (no embed_tokens, no lm_head: the target's are used, §11.9)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to(dtype).cpu().contiguous()
                   for k, v in self.named_tensors().items()}
        if self.draft_ids is not None:
            # target id = draft id + d2t[draft id] (§11.1)
            tensors["d2t"] = (self.draft_ids - torch.arange(len(self.draft_ids))).cpu()
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "mlx"})
        (out_dir / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")

    @classmethod
    def load_exported(cls, head_dir, embedding):
        """A head from its exported directory, every tensor widened to float32."""
        from safetensors.torch import load_file as load_tensors
        head_dir = Path(head_dir)
        head = cls(json.loads((head_dir / "config.json").read_text()), embedding)
        stored = load_tensors(str(head_dir / "model.safetensors"))
        with torch.no_grad():
            for name, parameter in head.named_tensors().items():
                parameter.copy_(stored[name].float())
            if head.draft_ids is not None:
                head.draft_ids = torch.arange(len(stored["d2t"])) + stored["d2t"].long()
        return head


def head_config(target_config, taps, layers, markov_rank):
    return {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": target_config["hidden_size"],
        "vocab_size": target_config["vocab_size"],
        "num_hidden_layers": layers,
        "intermediate_size": target_config["intermediate_size"],
        "num_attention_heads": target_config["num_attention_heads"],
        "num_key_value_heads": target_config["num_key_value_heads"],
        "head_dim": target_config["head_dim"],
        "rms_norm_eps": 1e-6,
        "rope_theta": target_config["rope_theta"],
        "attention_bias": False,
        "block_size": BLOCK_SIZE,
        "mask_token_id": MASK_TOKEN_ID,
        "markov_rank": markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "target_layer_ids": list(taps),
        "num_target_layers": target_config["num_hidden_layers"],
    }


class Sequence:
    """One answered prompt of a shard: tokens, taps at the shard's candidate layers, and the
    target's top-k next-token distribution per row."""

    def __init__(self, record, taps, top_ids, top_probs, shard_taps):
        self.id = record["id"]
        self.prompt_tokens = record["prompt_tokens"]
        self.tokens = np.asarray(record["tokens"], dtype=np.int64)
        self.taps = taps  # float16 [n, len(shard_taps), H]
        self.shard_taps = shard_taps
        self.top_ids = top_ids
        self.top_probs = top_probs

    def fused_taps(self, layers):
        columns = [self.shard_taps.index(layer) for layer in layers]
        return torch.from_numpy(self.taps[:, columns, :].reshape(len(self.tokens), -1)
                                .astype(np.float32))


def read_shards(directory):
    sequences = []
    for index_path in sorted(Path(directory).glob("shard-*.json")):
        if index_path.name.endswith(".script.json"):
            continue
        index = json.loads(index_path.read_text())
        H, taps, K = index["hidden"], index["taps"], index["top_k"]
        # Mapped, not read: a few hundred thousand rows of taps are gigabytes, and a step touches
        # only the sequences it draws.
        blob = np.memmap(index_path.with_suffix(".bin"), dtype=np.uint8, mode="r")
        offset = 0
        for record in index["sequences"]:
            n = len(record["tokens"])

            def take(dtype, count):
                nonlocal offset
                size = np.dtype(dtype).itemsize * count
                out = blob[offset:offset + size].view(dtype)
                offset += size
                return out

            tap_rows = take(np.float16, n * len(taps) * H).reshape(n, len(taps), H)
            top_ids = take(np.int32, n * K).reshape(n, K)
            top_probs = take(np.float32, n * K).reshape(n, K)
            sequences.append(Sequence(record, tap_rows, top_ids, top_probs, taps))
        if offset != blob.size:
            raise ValueError(f"{index_path}: the .bin holds {blob.size} bytes, the index "
                             f"describes {offset}")
    return sequences
