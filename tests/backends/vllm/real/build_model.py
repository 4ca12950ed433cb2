"""Build the tiny random-weight Llama and its tokenizer that the real-vLLM tests serve.

Runs with the vLLM environment's Python (it has torch, transformers, tokenizers):

    $GATEWAY_VLLM_VENV/bin/python tests/backends/vllm/real/build_model.py OUT_DIR

Nothing is downloaded: the byte-level BPE tokenizer is trained on ``corpus.txt``
beside this file, and the weights are random with a fixed seed, so every machine
builds the same model (greedy output is deterministic across rebuilds).
Shapes follow ``shared/spec/vllm-on-cpu.md``: vLLM's CPU attention needs
``head_dim`` in {32, 64, 80, ...}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 1024
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
SEED = 1234
# The Codex CLI's turns are about 21k tokens; RoPE has no weights, so positions cost nothing until used.
POSITIONS = 32768


def build_tokenizer(corpus: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        add_bos_token=True,
        clean_up_tokenization_spaces=False,
        model_max_length=POSITIONS,
    )


def build(out: Path) -> None:
    corpus = Path(__file__).with_name("corpus.txt")
    tokenizer = build_tokenizer(corpus)
    vocab = len(tokenizer)
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    print(f"built tiny llama (vocab {vocab}) in {out}")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
