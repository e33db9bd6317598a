#!/usr/bin/env python3
"""Train the built-in pair's hidden-state heads: an MTP-style head and an EAGLE-3 head.

Both read the trained target (treespec/pair/target, frozen) and are trained on
the pair's corpus (``train.py corpus`` builds it; the same split):

    python treespec/pair/train.py corpus --out .device/pair-corpus.npz
    python treespec/pair/train_heads.py --corpus .device/pair-corpus.npz --out treespec/pair

* MTP (treespec.heads.mtp, llama layer, the target's final normed hidden):
  cross-entropy of the text token two ahead, x[t+2], given the target's
  hidden at t and the token x[t+1].
* EAGLE-3 (treespec.heads.eagle3, speculators layout, taps = outputs of the
  target's layers 0, 1 and 3; a 256-token draft vocabulary, the most
  frequent tokens of the training split): soft cross-entropy against the
  target's distribution (restricted to the draft vocabulary), unrolled
  UNROLL steps ("training-time test"): step k runs every anchor t at
  position t + k on the text token x[t+1+k] and the head's own hidden of
  step k - 1, attending to step 0's keys of positions <= t and to its own
  keys of steps 1..k (what the head's cache holds when it drafts a chain);
  step k's loss is weighted DECAY**k.

Held-out figure: on evenly spaced held-out windows, how often the head's
argmax equals the target's argmax at depth 1 (the next-next token, the
separate drafter's 81.4 % is the same measure for its next token), and at
depth 2 where depth 1 was right and the text follows the target's greedy
token. Writes OUT/head-mtp/, OUT/head-eagle3/ (float16) and
OUT/heads-metrics.json (with the saved heads' heldout_sample.json figures,
which suites/heads recomputes; ``--eval-sample`` redoes only those). ``--init
DIR`` continues from the heads saved under DIR (README.md: the shipped heads
are a run and its continuation). A script, not imported.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import mlx_lm
from mlx.utils import tree_flatten

from treespec import zoo
from treespec.heads.eagle3 import Eagle3Head
from treespec.heads.load import load_head
from treespec.heads.mtp import MTPHead

HERE = Path(__file__).resolve().parent
TAP_IDS = [1, 2, 4]  # hidden-state indices: outputs of layers 0, 1, 3
DRAFT_VOCAB = 256
UNROLL = 3
DECAY = 0.8
EAGLE_LAYER = {  # the head's llama layer; target hidden 256, MLP halved to stay < 2 MB
    "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 352,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "num_hidden_layers": 1, "vocab_size": 384, "tie_word_embeddings": False,
}


def target_forward(target, x):
    """Every layer's output (pre-norm), the final normed hidden and logits,
    recomputed layer by layer (independent of treespec's verify taps)."""
    inner = target.model
    h = inner.embed_tokens(x)
    outs = []
    for layer in inner.layers:
        h = layer(h, "causal", None)
        outs.append(h)
    final = inner.norm(h)
    return outs, final, inner.embed_tokens.as_linear(final)


def attend(attn, xin, k, bank):
    """Unrolled attention of step k (see the docstring). bank: step 0's
    (K, V) over all positions, then steps 1..k-1's per-anchor (K, V)."""
    B, T, _ = xin.shape
    q = attn.q_proj(xin).reshape(B, T, attn.n_heads, -1).transpose(0, 2, 1, 3)
    kk = attn.k_proj(xin).reshape(B, T, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    vv = attn.v_proj(xin).reshape(B, T, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, kk = attn.rope(q, offset=k), attn.rope(kk, offset=k)
    rep = attn.n_heads // attn.n_kv_heads
    if k == 0:
        bank.append((kk, vv))
        out = mx.fast.scaled_dot_product_attention(q, kk, vv, scale=attn.scale, mask="causal")
    else:
        bank.append((kk, vv))
        k0, v0 = (mx.repeat(a, rep, axis=1) for a in bank[0])
        s0 = (q * attn.scale) @ k0.transpose(0, 1, 3, 2)
        s0 = s0 + mx.triu(mx.full((T, T), -mx.inf), k=1)
        # anchors beyond the step-0 window shift: anchor t at step k sees K0[s <= t]
        diag = [((q * attn.scale) * mx.repeat(kj, rep, axis=1)).sum(-1, keepdims=True)
                for kj, _ in bank[1:]]
        p = mx.softmax(mx.concatenate([s0] + diag, axis=-1).astype(mx.float32), axis=-1).astype(q.dtype)
        out = p[..., :T] @ v0
        for j, (_, vj) in enumerate(bank[1:]):
            out = out + p[..., T + j : T + j + 1] * mx.repeat(vj, rep, axis=1)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, T, -1))


def mtp_steps(head, tokens_per_step, h0, steps):
    """MTP head unrolled: hidden (normed) of each step; llama layer."""
    layer = head.layers[0]
    bank, h, outs = [], h0, []
    for k in range(steps):
        e = head.shared.embed(tokens_per_step[k])
        x = head.fc(mx.concatenate([head.pre_fc_norm_embedding(e), head.pre_fc_norm_hidden(h)], -1))
        x = x + attend(layer.self_attn, layer.input_layernorm(x), k, bank)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        h = head.norm(x)
        outs.append(head.shared.logits(h))
    return outs


def eagle_steps(head, tokens_per_step, feats, steps):
    """EAGLE-3 head unrolled: draft-vocabulary logits of each step."""
    layer = head.layers[0]
    bank, h, outs = [], head.fc(feats), []
    for k in range(steps):
        e = head.shared.embed(tokens_per_step[k])
        normed = layer.hidden_norm(h)
        xin = mx.concatenate([layer.input_layernorm(e), normed], -1)
        x = h + attend(layer.self_attn, xin, k, bank)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        h = x
        outs.append(head.lm_head(head.norm(x)))
    return outs


def train(name, head, loss_fn, data, steps, lr, deadline, log):
    opt = optim.AdamW(learning_rate=optim.cosine_decay(lr, steps, lr * 0.1), weight_decay=0.0)
    head.freeze(keys=["d2t"], strict=False)
    grad = nn.value_and_grad(head, loss_fn)
    t0 = time.time()
    done = 0
    for i in range(steps):
        w = mx.array(next(data))
        loss, g = grad(head, w)
        g, _ = optim.clip_grad_norm(g, 1.0)
        opt.update(head, g)
        mx.eval(head.parameters(), opt.state, loss)
        done = i + 1
        if done % 10 == 0 or done == steps:
            log({"head": name, "step": done, "loss": round(loss.item(), 4),
                 "elapsed_s": round(time.time() - t0, 1)})
        if time.time() > deadline:
            break
    return done, time.time() - t0


def batches(train, length, batch, seed):
    rng = np.random.RandomState(seed)
    hi = train.size - length - 1
    while True:
        starts = rng.randint(0, hi, size=batch)
        yield np.stack([train[s : s + length] for s in starts])


def windows(heldout, length, n):
    total = heldout.size // length
    idx = np.linspace(0, total - 1, num=min(n, total)).astype(np.int64)
    return np.stack([heldout[i * length : (i + 1) * length] for i in idx])


def evaluate(target, mtp_head, eagle_head, ids, wins):
    """Depth-1 and depth-2 argmax agreement with the target (docstring)."""
    counts = {k: [0, 0, 0] for k in ("mtp", "eagle3")}  # depth-1 hits, depth-2 hits, depth-2 tries
    total = 0
    for w in wins:
        x = mx.array(w[None])
        outs, final, logits = target_forward(target, x)
        greedy = mx.argmax(logits, -1)  # target's token after position t
        L = x.shape[1]
        T = L - 3
        toks = [x[:, 1 + k : 1 + k + T] for k in range(2)]
        m = mtp_steps(mtp_head, toks, final[:, :T], 2)
        feats = mx.concatenate([outs[i - 1] for i in TAP_IDS], -1)[:, :T]
        e = eagle_steps(eagle_head, toks, feats, 2)
        e = [ids[mx.argmax(d, -1)] for d in e]
        m = [mx.argmax(d, -1) for d in m]
        tgt1, tgt2 = greedy[:, 1 : 1 + T], greedy[:, 2 : 2 + T]
        follows = x[:, 2 : 2 + T] == tgt1  # the text is the target's greedy token
        for key, (d1, d2) in (("mtp", m), ("eagle3", e)):
            hit1 = d1 == tgt1
            cond = hit1 & follows
            counts[key][0] += hit1.sum().item()
            counts[key][1] += (cond & (d2 == tgt2)).sum().item()
            counts[key][2] += cond.sum().item()
        total += T
    return {k: {"depth1": c[0] / total, "depth2_given_depth1": c[1] / max(c[2], 1),
                "depth2_tries": c[2], "positions": total} for k, c in counts.items()}


def check_unrolled(target, head, kind, x):
    """The unrolled training forward equals the head's own cached calls."""
    outs, final, _ = target_forward(target, x)
    T = 6
    if kind == "mtp":
        feats = final[:, :T]
        unrolled = mtp_steps(head, [x[:, 1 : 1 + T], x[:, 2 : 2 + T]], feats, 2)
    else:
        feats = mx.concatenate([outs[i - 1] for i in TAP_IDS], -1)[:, :T]
        unrolled = eagle_steps(head, [x[:, 1 : 1 + T], x[:, 2 : 2 + T]], feats, 2)
    t = T - 1  # anchor t: the cache holds positions 0..t, then one own step
    cache = head.make_cache()
    l1, h1 = head(x[:, 1 : 1 + T], feats, cache)
    l2, _ = head(x[:, t + 2 : t + 3], h1[:, t : t + 1], cache, own=True)
    if kind != "mtp":  # compare over the draft vocabulary (the rest is -inf)
        l1, l2 = l1[..., head.target_ids()], l2[..., head.target_ids()]
    a = mx.abs(l1 - unrolled[0]).max().item()
    b = mx.abs(l2[:, 0] - unrolled[1][:, t]).max().item()
    assert a < 1e-3 and b < 1e-3, (kind, a, b)
    return a, b


def sample_agreement(target, head, tap_ids=None):
    """Depth-1 agreement on heldout_sample.json (what suites/heads
    recomputes): each segment tokenized alone, cut to its max_tokens, one
    call of the head over the whole segment (features of positions
    0..n-3, tokens 1..n-2) against the target's argmax at 1..n-2."""
    sample = json.loads((HERE / "heldout_sample.json").read_text())
    tok = zoo.tokenizer()
    hits = total = 0
    for seg in sample["segments"]:
        ids = tok.encode(seg["text"])[: sample["max_tokens"]]
        x = mx.array([ids])
        outs, final, logits = target_forward(target, x)
        feats = final if tap_ids is None else mx.concatenate([outs[i - 1] for i in tap_ids], -1)
        n = x.shape[1]
        got, _ = head(x[:, 1 : n - 1], feats[:, : n - 2], None)
        hits += (mx.argmax(got, -1) == mx.argmax(logits[:, 1 : n - 1], -1)).sum().item()
        total += n - 2
    return {"depth1": hits / total, "positions": total}


def save_head(head, out: Path, config: dict, weights: dict):
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--mtp-steps", type=int, default=700)
    p.add_argument("--eagle-steps", type=int, default=280)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-seconds", type=float, default=540.0, help="per head")
    p.add_argument("--eval-windows", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", default=None,
                   help="continue from the heads saved under this folder (head-mtp/, head-eagle3/)")
    p.add_argument("--eval-sample", action="store_true",
                   help="only add the saved heads' heldout_sample.json figures to OUT/heads-metrics.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.eval_sample:
        return eval_sample(out)
    mx.random.seed(args.seed)
    with np.load(args.corpus) as z:
        train_ids, heldout = z["train"].astype(np.int32), z["heldout"].astype(np.int32)
    log_path = out / "heads-train_log.jsonl"
    log_file = open(log_path, "w")

    def log(rec):
        print(json.dumps(rec), flush=True)
        log_file.write(json.dumps(rec) + "\n")

    target, _ = mlx_lm.load(str(HERE / "target"))
    target.set_dtype(mx.float32)  # features in float32 while training
    target.freeze()
    cfg = json.loads((HERE / "target" / "config.json").read_text())

    # Draft vocabulary: the DRAFT_VOCAB most frequent training tokens.
    freq = np.bincount(train_ids, minlength=cfg["vocab_size"])
    draft_ids = np.sort(np.argsort(-freq, kind="stable")[:DRAFT_VOCAB]).astype(np.int32)
    coverage = float(freq[draft_ids].sum() / freq.sum())
    ids = mx.array(draft_ids)
    d2t = ids - mx.arange(DRAFT_VOCAB, dtype=mx.int32)
    t2d = np.zeros(cfg["vocab_size"], dtype=bool)
    t2d[draft_ids] = True

    mtp_head = MTPHead.build(target)
    eagle_config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": EAGLE_LAYER,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": cfg["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": TAP_IDS,
        "norm_before_residual": False,
    }
    eagle_head = Eagle3Head.build(eagle_config, target)
    eagle_head.d2t = d2t
    # lm_head starts as the target's (tied) output rows of the draft vocabulary
    eagle_head.lm_head.weight = target.model.embed_tokens.weight[ids]
    if args.init:  # continue a saved run (float16 on disk, trained on in float32)
        for head, name in ((mtp_head, "head-mtp"), (eagle_head, "head-eagle3")):
            saved = mx.load(str(Path(args.init) / name / "model.safetensors"))
            saved.pop("t2d", None)
            saved = {k: v.astype(mx.int32) if k == "d2t" else v.astype(mx.float32) for k, v in saved.items()}
            head.load_weights(list(saved.items()), strict=True)
    mx.eval(mtp_head.parameters(), eagle_head.parameters())

    def mtp_loss(head, w):
        _, final, _ = target_forward(target, w[:, :-2])
        logits, _ = head(w[:, 1:-1], mx.stop_gradient(final), None)
        return nn.losses.cross_entropy(logits, w[:, 2:], reduction="mean")

    def eagle_loss(head, w):
        L = w.shape[1]
        T = L - UNROLL - 1
        outs, _, logits = target_forward(target, w)
        feats = mx.stop_gradient(mx.concatenate([outs[i - 1] for i in TAP_IDS], -1)[:, :T])
        lp_t = mx.stop_gradient(nn.log_softmax(logits, -1)[..., ids])
        toks = [w[:, 1 + k : 1 + k + T] for k in range(UNROLL)]
        total, norm = 0.0, 0.0
        for k, d in enumerate(eagle_steps(head, toks, feats, UNROLL)):
            p = mx.exp(lp_t[:, 1 + k : 1 + k + T])
            ce = -(p * nn.log_softmax(d, -1)).sum(-1).mean()
            total, norm = total + DECAY**k * ce, norm + DECAY**k
        return total / norm

    x = mx.array(heldout[None, :16])
    log({"check_unrolled": {"mtp": check_unrolled(target, mtp_head, "mtp", x),
                            "eagle3": check_unrolled(target, eagle_head, "eagle3", x)}})
    wins = windows(heldout, 259, args.eval_windows)
    before = evaluate(target, mtp_head, eagle_head, ids, wins)
    log({"before": before})
    runs = {}
    for name, head, fn, length, steps in (
        ("mtp", mtp_head, mtp_loss, args.length + 2, args.mtp_steps),
        ("eagle3", eagle_head, eagle_loss, args.length + UNROLL + 1, args.eagle_steps),
    ):
        if steps == 0:
            runs[name] = {"steps": 0, "seconds": 0.0}
            continue
        data = batches(train_ids, length, args.batch, args.seed + (1 if args.init else 0))
        done, secs = train(name, head, fn, data, steps, args.lr,
                           time.time() + args.max_seconds, log)
        runs[name] = {"steps": done, "seconds": round(secs, 1)}
    mx.eval(mtp_head.parameters(), eagle_head.parameters())
    x = mx.array(heldout[None, 100:116])
    log({"check_unrolled_after": {"mtp": check_unrolled(target, mtp_head, "mtp", x),
                                  "eagle3": check_unrolled(target, eagle_head, "eagle3", x)}})

    # Save float16, then evaluate what was saved with the float16 target.
    f16 = {k: v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v
           for k, v in tree_flatten(mtp_head.parameters())}
    save_head(mtp_head, out / "head-mtp", {"model_type": "llama_mtp", "text_config": cfg}, f16)
    e16 = {k: v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v
           for k, v in tree_flatten(eagle_head.parameters())}
    e16["d2t"] = d2t.astype(mx.int64)
    e16["t2d"] = mx.array(t2d)
    save_head(eagle_head, out / "head-eagle3", eagle_config, e16)

    target16, _ = mlx_lm.load(str(HERE / "target"))
    m16 = load_head(str(out / "head-mtp"), target16, HERE / "target")
    e16h = load_head(str(out / "head-eagle3"), target16, HERE / "target")
    after = evaluate(target16, m16, e16h, ids, wins)
    metrics = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                    "mlx": mx.__version__, "device": str(mx.default_device())},
        "args": vars(args), "tap_ids": TAP_IDS, "draft_vocab": DRAFT_VOCAB,
        "draft_vocab_coverage_train": coverage, "unroll": UNROLL, "decay": DECAY,
        "runs": runs, "heldout_before_training": before, "heldout_saved_float16": after,
        "heldout_windows": {"count": len(wins), "tokens_each": 259},
        "bytes": {n: (out / n / "model.safetensors").stat().st_size for n in ("head-mtp", "head-eagle3")},
    }
    (out / "heads-metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    log({"after": after})
    eval_sample(out)


def eval_sample(out: Path):
    """The saved heads on heldout_sample.json, with the float16 target, into
    OUT/heads-metrics.json (key heldout_sample)."""
    target, _ = mlx_lm.load(str(HERE / "target"))
    figures = {
        "mtp": sample_agreement(target, load_head(str(out / "head-mtp"), target, HERE / "target")),
        "eagle3": sample_agreement(target, load_head(str(out / "head-eagle3"), target, HERE / "target"),
                                   TAP_IDS),
    }
    path = out / "heads-metrics.json"
    metrics = json.loads(path.read_text())
    metrics["heldout_sample"] = figures
    path.write_text(json.dumps(metrics, indent=1) + "\n")
    print(json.dumps({"heldout_sample": figures}), flush=True)


if __name__ == "__main__":
    main()
