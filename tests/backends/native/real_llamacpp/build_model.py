"""Write a tiny random-weight Llama as GGUF for the real-llama.cpp tests (nothing is downloaded).

    python tests/backends/native/real_llamacpp/build_model.py OUT.gguf

Needs only ``gguf`` and ``numpy`` (``pip install gguf``). The vocabulary is byte-level BPE
(llama.cpp's ``gpt2`` tokenizer) over printable ASCII and newline, so every generated token
is valid UTF-8 text; weights are random with a fixed seed, so greedy output is the same on
every machine. The model is nonsense by design: the tests check shapes and semantics
(determinism, stop, limits, grammars), not language.
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 64, 4, 2, 128, 512
SEED = 1234


def byte_char(b: int) -> str:
    """GPT-2's byte -> printable unicode mapping (what byte-level BPE vocabularies store)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if b in printable:
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if x not in printable))


def main(out: str) -> None:
    space = byte_char(0x20)
    merges = [f"{space} t", "h e", f"{space}t he"]  # llama.cpp requires some merges; these make " the"
    tokens = ["<s>", "</s>"] + [byte_char(b) for b in [0x0A, *range(0x20, 0x7F)]] + [f"{space}t", "he", f"{space}the"]
    types = [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(tokens) - 2)
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name("gateway-test-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(False)

    rng = np.random.default_rng(SEED)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    writer.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", rand(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", rand(n_vocab, N_EMBD) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
