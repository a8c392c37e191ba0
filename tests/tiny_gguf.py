"""A tiny Llama-architecture GGUF file, written with the `gguf` package (no download)."""

import numpy as np


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: 256 one-character tokens."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_gguf(path, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, seed=0) -> None:
    import gguf

    tokens = _byte_tokens() + ["<|endoftext|>", "Ġt", "he"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 1, 1])
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    rng = np.random.default_rng(seed)
    kv = kv_heads * hidden // heads

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(len(tokens), hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        for name, shape in [
            ("attn_q", (hidden, hidden)),
            ("attn_k", (kv, hidden)),
            ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, hidden)),
            ("ffn_gate", (ffn, hidden)),
            ("ffn_up", (ffn, hidden)),
            ("ffn_down", (hidden, ffn)),
        ]:
            w.add_tensor(p + name + ".weight", mat(*shape))
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
