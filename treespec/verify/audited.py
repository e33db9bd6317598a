"""The audit record: which mlx-lm model modules the family sweep verified.

treespec accepts a model by its structure (treespec.verify.structure), not
by name. This record only says which of those structures the suite has
seen verify a branching tree and roll back exactly (or within the
documented differences) with tiny seeded models of mlx-lm's own classes:
``suites/families``, which also fails when this record and its results
disagree. A model outside it is accepted all the same and says so in its
diagnostics ("structurally accepted, no audit record"); the exactness probe
(treespec.evidence.gate) is its guard at run time.
"""

from typing import Optional

import mlx_lm
import mlx.nn as nn

__all__ = ["AUDITED", "MLX_LM", "audit_record"]

MLX_LM = "0.32.2"

# mlx_lm.models.<name> of every Model class the sweep verified (its results
# table is in docs/families.md#the-table).
AUDITED = frozenset({
    "mlx_lm.models.Klear",
    "mlx_lm.models.afm7",
    "mlx_lm.models.afmoe",
    "mlx_lm.models.apertus",
    "mlx_lm.models.bailing_hybrid",
    "mlx_lm.models.bailing_moe",
    "mlx_lm.models.bailing_moe_linear",
    "mlx_lm.models.bailing_moe_v3",
    "mlx_lm.models.bitnet",
    "mlx_lm.models.cohere",
    "mlx_lm.models.cohere2",
    "mlx_lm.models.dbrx",
    "mlx_lm.models.deepseek",
    "mlx_lm.models.deepseek_v2",
    "mlx_lm.models.deepseek_v3",
    "mlx_lm.models.deepseek_v32",
    "mlx_lm.models.dots1",
    "mlx_lm.models.ernie4_5",
    "mlx_lm.models.ernie4_5_moe",
    "mlx_lm.models.exaone",
    "mlx_lm.models.exaone4",
    "mlx_lm.models.exaone_moe",
    "mlx_lm.models.falcon_h1",
    "mlx_lm.models.gear",
    "mlx_lm.models.gemma",
    "mlx_lm.models.gemma2",
    "mlx_lm.models.gemma3",
    "mlx_lm.models.gemma3_text",
    "mlx_lm.models.gemma3n",
    "mlx_lm.models.gemma4",
    "mlx_lm.models.gemma4_text",
    "mlx_lm.models.glm",
    "mlx_lm.models.glm4",
    "mlx_lm.models.glm4_moe",
    "mlx_lm.models.glm4_moe_lite",
    "mlx_lm.models.glm_moe_dsa",
    "mlx_lm.models.gpt2",
    "mlx_lm.models.gpt_bigcode",
    "mlx_lm.models.gpt_neox",
    "mlx_lm.models.gpt_oss",
    "mlx_lm.models.gptj",
    "mlx_lm.models.granite",
    "mlx_lm.models.granitemoe",
    "mlx_lm.models.granitemoehybrid",
    "mlx_lm.models.helium",
    "mlx_lm.models.hunyuan",
    "mlx_lm.models.hunyuan_v1_dense",
    "mlx_lm.models.internlm2",
    "mlx_lm.models.internlm3",
    "mlx_lm.models.iquestloopcoder",
    "mlx_lm.models.jamba",
    "mlx_lm.models.kimi_k25",
    "mlx_lm.models.kimi_k3",
    "mlx_lm.models.kimi_linear",
    "mlx_lm.models.kimi_vl",
    "mlx_lm.models.laguna",
    "mlx_lm.models.lfm2",
    "mlx_lm.models.lfm2-vl",
    "mlx_lm.models.lfm2_moe",
    "mlx_lm.models.lille-130m",
    "mlx_lm.models.llama",
    "mlx_lm.models.llama4_text",
    "mlx_lm.models.longcat_flash",
    "mlx_lm.models.longcat_flash_ngram",
    "mlx_lm.models.mamba",
    "mlx_lm.models.mamba2",
    "mlx_lm.models.mellum",
    "mlx_lm.models.mimo",
    "mlx_lm.models.mimo_v2_flash",
    "mlx_lm.models.minicpm",
    "mlx_lm.models.minicpm3",
    "mlx_lm.models.minimax",
    "mlx_lm.models.ministral3",
    "mlx_lm.models.mistral3",
    "mlx_lm.models.mistral4",
    "mlx_lm.models.mixtral",
    "mlx_lm.models.muse_glimmer",
    "mlx_lm.models.nanbeige",
    "mlx_lm.models.nemotron",
    "mlx_lm.models.nemotron-nas",
    "mlx_lm.models.nemotron_h",
    "mlx_lm.models.olmo2",
    "mlx_lm.models.olmo3",
    "mlx_lm.models.olmo_hybrid",
    "mlx_lm.models.olmoe",
    "mlx_lm.models.openelm",
    "mlx_lm.models.phi",
    "mlx_lm.models.phi3",
    "mlx_lm.models.phimoe",
    "mlx_lm.models.phixtral",
    "mlx_lm.models.pixtral",
    "mlx_lm.models.plamo",
    "mlx_lm.models.plamo2",
    "mlx_lm.models.plamo3",
    "mlx_lm.models.prism_hadamard_qwen35",
    "mlx_lm.models.qwen",
    "mlx_lm.models.qwen2",
    "mlx_lm.models.qwen2_moe",
    "mlx_lm.models.qwen2_vl",
    "mlx_lm.models.qwen3",
    "mlx_lm.models.qwen3_5",
    "mlx_lm.models.qwen3_5_moe",
    "mlx_lm.models.qwen3_moe",
    "mlx_lm.models.qwen3_next",
    "mlx_lm.models.qwen3_vl",
    "mlx_lm.models.qwen3_vl_moe",
    "mlx_lm.models.recurrent_gemma",
    "mlx_lm.models.rwkv7",
    "mlx_lm.models.seed_oss",
    "mlx_lm.models.smollm3",
    "mlx_lm.models.solar_open",
    "mlx_lm.models.spark2_5",
    "mlx_lm.models.stablelm",
    "mlx_lm.models.starcoder2",
    "mlx_lm.models.step3p5",
    "mlx_lm.models.telechat3",
    "mlx_lm.models.youtu_llm",
})


def audit_record(model: nn.Module) -> Optional[str]:
    """A line for the diagnostics when ``model``'s class is in the record
    for the installed mlx-lm, else None."""
    module = type(model).__module__
    if module not in AUDITED:
        return None
    name = module.rsplit(".", 1)[-1]
    if mlx_lm.__version__ != MLX_LM:
        return None
    return f"audited: {name} (suites/families, mlx-lm {MLX_LM})"


def record_note(model: nn.Module) -> str:
    """What the diagnostics say about the model's audit record."""
    record = audit_record(model)
    if record is not None:
        return record
    module = type(model).__module__
    if module in AUDITED:
        return (f"structurally accepted; the audit record is for mlx-lm {MLX_LM}, "
                f"installed {mlx_lm.__version__}")
    return "structurally accepted, no audit record"
