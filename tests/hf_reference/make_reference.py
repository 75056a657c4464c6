#!/usr/bin/env python3
"""Builds a tiny random HF transformers model of one case, saves it (config.json, safetensors,
tokenizer), and writes what transformers computes on fixed tokens: logits, loss and the gradient
of every parameter. hf_check (C++) then loads the same directory in ctxengine and compares.

Usage: make_reference.py CASE OUT_DIR
  CASE: gpt2 | neox_parallel | neox_sequential_linear | neox_dynamic | neox_yarn | neox_llama3 |
        neox_longrope | bloom | llama | mistral | qwen2
Writes OUT_DIR/hf/ (config.json, model.safetensors, tokenizer files), OUT_DIR/corpus/*.txt (the
text the tokenizer was trained on, for the recipe test) and OUT_DIR/reference.safetensors:
  tokens (B, T) and tokens_long (B, 2 * context) as F32, logits (B, T, V), loss (scalar),
  grad.<HF parameter name> for every parameter.
Some cases also save the model the other ways checkpoints come: gpt2 sharded
(OUT_DIR/hf_sharded: model.safetensors.index.json + shards) and in F16 (OUT_DIR/hf_f16),
neox_parallel in BF16 (OUT_DIR/hf_bf16), each with the logits of those weights computed in fp32
(logits_sharded, logits_f16, logits_bf16).
"""
import os
import random
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel,
                          GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM)

CONTEXT = 32  # n_positions / max_position_embeddings / seq_length of every tiny model
B, T = 2, 24  # the reference batch (within the context)
WORDS = ("the model reads long documents and keeps every fact it saw before a question about "
         "vault code harbor station river lamp seven blue quiet north window garden number "
         "answer remember later while window extends context position rotary linear bias").split()


def corpus(rng, n_docs=24):
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(40, 70)):
            k = rng.randint(4, 12)
            s = " ".join(rng.choice(WORDS) for _ in range(k))
            if rng.random() < 0.3:
                s += " " + str(rng.randint(0, 99999))
            sentences.append(s.capitalize() + rng.choice([".", "?", "!"]))
        docs.append(" ".join(sentences))
    return docs


def train_tokenizer(docs, vocab_size=320):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def build(case, vocab, eos):
    common = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos)
    if case in ("gpt2", "gpt2_relu"):
        # gpt2_relu: an OPT-style ReLU MLP (ctxengine's activation "relu"; contextual sparsity)
        act = "relu" if case == "gpt2_relu" else "gelu_new"
        cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=CONTEXT,
                         activation_function=act, **common)
        return GPT2LMHeadModel(cfg)
    if case.startswith("neox"):
        scaling = None
        if case == "neox_sequential_linear":
            scaling = {"type": "linear", "factor": 2.0}  # the legacy spelling
        elif case == "neox_dynamic":
            scaling = {"rope_type": "dynamic", "factor": 2.0,
                       "original_max_position_embeddings": CONTEXT}
        # transformers' own rope types on every dim of the head (rotary_pct 1: 8 pairs)
        elif case == "neox_yarn":
            scaling = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0, "beta_slow": 0.5}
        elif case == "neox_llama3":
            scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": CONTEXT}
        elif case == "neox_longrope":
            # transformers 4.49's GPT-NeoX computes longrope once, without a sequence length,
            # i.e. always with short_factor; pe/rope switches to long_factor beyond L0 (METHODS
            # 5.1, unit-tested). Equal lists keep this end-to-end check valid at 2 x context.
            f = [1.0, 1.05, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0]
            scaling = {"rope_type": "longrope", "factor": 2.0, "short_factor": f,
                       "long_factor": f, "attention_factor": 1.1}
        pct = 1.0 if case in ("neox_yarn", "neox_llama3", "neox_longrope") else 0.25
        cfg = GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=112, rotary_pct=pct, rotary_emb_base=10000,
                            max_position_embeddings=CONTEXT, hidden_act="gelu",
                            use_parallel_residual=(case == "neox_parallel"),
                            rope_scaling=scaling, tie_word_embeddings=False, **common)
        return GPTNeoXForCausalLM(cfg)
    if case == "bloom":
        # 6 heads: ALiBi's slopes for a head count that is not a power of two
        cfg = BloomConfig(hidden_size=48, n_layer=2, n_head=6, seq_length=CONTEXT, **common)
        return BloomForCausalLM(cfg)
    # The Llama family: RMSNorm, SwiGLU, RoPE on whole heads (8 pairs), grouped-query attention
    llama_like = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=112, max_position_embeddings=CONTEXT, **common)
    if case == "llama":
        # 2 key/value heads of 4, untied head, a larger rope_theta and llama3 scaling
        cfg = LlamaConfig(num_key_value_heads=2, rope_theta=50000.0, tie_word_embeddings=False,
                          rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": CONTEXT},
                          **llama_like)
        return LlamaForCausalLM(cfg)
    if case == "mistral":
        # multi-query (1 key/value head) and a sliding window shorter than the rows
        cfg = MistralConfig(num_key_value_heads=1, sliding_window=8, tie_word_embeddings=False,
                            **llama_like)
        return MistralForCausalLM(cfg)
    if case == "qwen2":
        # q/k/v biases without an output bias, and a tied head
        cfg = Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, **llama_like)
        return Qwen2ForCausalLM(cfg)
    raise SystemExit(f"unknown case {case}")


def randomize(model, gen):
    # Larger than the default init (0.02) so every mapping mistake shows in the logits, and
    # layernorm weights / biases away from 1 / 0 so swapping two of them shows as well.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def main():
    case, out = sys.argv[1], sys.argv[2]
    rng = random.Random(7)
    torch.manual_seed(7)
    gen = torch.Generator().manual_seed(11)
    docs = corpus(rng)
    os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
    for i, d in enumerate(docs):
        with open(os.path.join(out, "corpus", f"doc{i:03d}.txt"), "w") as f:
            f.write(d + "\n")
    tok = train_tokenizer(docs)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    model = build(case, len(tok), eos)
    randomize(model, gen)
    model.eval()  # no dropout
    hf_dir = os.path.join(out, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    tok.save_pretrained(hf_dir)

    ids = tok(docs[0])["input_ids"]
    assert len(ids) >= 2 * CONTEXT * B, "the first document is too short"
    tokens = torch.tensor(ids[: B * T]).view(B, T)
    tokens_long = torch.tensor(ids[: B * 2 * CONTEXT]).view(B, 2 * CONTEXT)
    result = model(input_ids=tokens, labels=tokens)
    result.loss.backward()
    tensors = {
        "tokens": tokens.float(),
        "tokens_long": tokens_long.float(),
        "logits": result.logits.detach().float().contiguous(),
        "loss": result.loss.detach().float().reshape(()),
    }
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad.detach().float().contiguous()

    # Other ways checkpoints come: sharded, and half-precision weights (read as fp32).
    def variant(tag, dtype=None, **save_args):
        copy = build(case, len(tok), eos)
        copy.load_state_dict(model.state_dict())
        copy.eval()
        if dtype is not None:
            copy = copy.to(dtype)
        path = os.path.join(out, "hf_" + tag)
        copy.save_pretrained(path, safe_serialization=True, **save_args)
        # transformers' own fp32 reading of those files (buffers such as RoPE's inv_freq are
        # recomputed in fp32, as ctxengine does)
        loaded = type(model).from_pretrained(path, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            tensors["logits_" + tag] = loaded(input_ids=tokens).logits.float().contiguous()

    if case == "gpt2":
        variant("sharded", max_shard_size="100KB")
        variant("f16", torch.float16)
    if case == "neox_parallel":
        variant("bf16", torch.bfloat16)
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    print(f"{case}: {sum(p.numel() for p in model.parameters())} parameters, vocab {len(tok)}, "
          f"loss {result.loss.item():.6f}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
