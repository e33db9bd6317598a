"""The zoo's families: each one's config.json (minus the vocabulary fields,
which the tokenizer sets), and the per-family constants of its seeded
weights."""

import copy


from .tokenizer import BOS, EOS, PAD, VOCAB_SIZE, token_id

# ---------------------------------------------------------------------------
# Configs: the config.json of each family, minus the vocabulary fields.
# ---------------------------------------------------------------------------

CONFIGS = {
    # Llama 3 shape: GQA, llama3 rope scaling, untied head. Plain KVCache.
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    # Qwen3 shape: q/k RMSNorm per head, head_dim * heads > hidden, tied head.
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
    # Gemma 3: layer i is global iff i % pattern == pattern - 1, so layers
    # 0, 1, 3 slide (RotatingKVCache, window 8) and layer 2 is global
    # (KVCache, linear-scaled rope). One KV head, (1 + w) norms, tied head.
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "max_position_embeddings": 32768,
    },
    # Gemma 4 (E2B-like, minus KV sharing): explicit layer_types, sliding
    # layers with head_dim 16 on RotatingKVCache (window 16, keep 0), full
    # layers with global_head_dim 32 and proportional rope rotating 1/4 of
    # it on KVCache, per-layer input embeddings, logit softcapping, tied head.
    "gemma4_text": {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "rms_norm_eps": 1e-6,
        "layer_types": [
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        "sliding_window": 16,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 16,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    },
    # Qwen3.5 text model, flat config: mlx-lm's qwen3_5.ModelArgs.from_dict
    # wraps a config without "text_config" as the text config itself, and
    # the model is then Model.language_model. Layers 0-2 are GatedDeltaNet
    # (ArraysCache: conv state + recurrent state), layer 3 is gated full
    # attention (KVCache) with partial rope. linear_key_head_dim 32 is the
    # smallest that takes the Metal kernel on Apple machines.
    "qwen3_5": {
        "model_type": "qwen3_5",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
    },
    # Qwen3-Next: GatedDeltaNet and gated attention alternate (interval 2:
    # layers 0, 2 linear on ArraysCache, 1, 3 full on KVCache); every MLP is
    # a sparse MoE (4 experts, top 2) plus a gated shared expert. Untied.
    "qwen3_next": {
        "model_type": "qwen3_next",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "norm_topk_prob": True,
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    },
}

FAMILIES = tuple(CONFIGS)

# Standard deviation of the token embedding. With a tied head a large
# embedding dominates the residual stream and the model just echoes its
# input token (greedy argmax == current token); 1/8 keeps the echo rate at
# a few percent. Gemma also multiplies embeddings by sqrt(hidden) = 8.
EMBED_STD = {
    "llama": 1.0,
    "qwen3": 0.125,
    "gemma3_text": 0.125,
    "gemma4_text": 0.0625,
    "qwen3_5": 0.125,
    "qwen3_next": 1.0,
}

# Gain of the final norm: it sets the logit scale (std ~3.5, mean top-1
# probability ~0.35-0.4, like a small trained model) and never the argmax.
FINAL_NORM_GAIN = {
    "llama": 3.5,
    "qwen3": 3.5,
    "gemma3_text": 2.5,  # Gemma 3 scales by 1 + w, with w stored as ~1
    "gemma4_text": 7.0,
    "qwen3_5": 3.5,
    "qwen3_next": 3.5,
}

# Weights a family's loader would not find in a real checkpoint. Gemma 3's
# Model always builds lm_head and its sanitize drops it (tying the head to
# the embedding) when the checkpoint has none, as real Gemma 3 ones do.
_DROPPED = {"gemma3_text": ("lm_head.weight",)}

# Relative noise (see `drafter`) that makes the default drafter agree with
# its float32 target's greedy token on 54-61% of positions of random
# contexts and 54-67% of positions of the target's own greedy text (64 + 16
# sequences, measured). Recurrent and tied-head families are far more
# sensitive to weight noise than llama.
DRAFT_NOISE = {
    "llama": 0.13,
    "qwen3": 0.10,
    "gemma3_text": 0.03,
    "gemma4_text": 0.02,
    "qwen3_5": 0.02,
    "qwen3_next": 0.06,
}


def config(family: str) -> dict:
    """The config.json dict of `family` (a fresh copy, with model_type)."""
    if family not in CONFIGS:
        raise ValueError(f"unknown zoo family {family!r}; known: {FAMILIES}")
    cfg = copy.deepcopy(CONFIGS[family])
    cfg["vocab_size"] = VOCAB_SIZE
    if family == "gemma4_text":
        cfg["vocab_size_per_layer_input"] = VOCAB_SIZE
    cfg["bos_token_id"] = token_id(BOS)
    cfg["eos_token_id"] = token_id(EOS)
    cfg["pad_token_id"] = token_id(PAD)
    return cfg
