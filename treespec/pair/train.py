#!/usr/bin/env python3
"""Train treespec's default target/drafter pair on the Python standard library.

Two llama-architecture mlx-lm models share the zoo's byte-level BPE tokenizer
(vocab 384): a target (hidden 256, 4 layers, ~3.0M parameters) and a drafter
(hidden 128, 2 layers, ~0.47M parameters). Both are trained together, from one
seed, on the source of the standard library of the Python that builds the
corpus, and saved as float16 mlx-lm checkpoints (config.json,
model.safetensors, tokenizer) that ``mlx_lm.load`` opens offline.

Three steps, each runnable on the MLX CPU backend (slow) or on a GPU backend
with the same flags:

    # 1. the corpus: this Python's stdlib *.py files, sorted, tokenized; a file
    #    is held out when sha256(its relative path) % 20 == 0
    python treespec/pair/train.py corpus --out .device/pair-corpus.npz

    # 2. training (AdamW, warmup + cosine, both models in one compiled step)
    python treespec/pair/train.py train --corpus .device/pair-corpus.npz --out OUT

    # 3. held-out loss and greedy agreement of any saved pair
    python treespec/pair/train.py eval --corpus .device/pair-corpus.npz --pair OUT

``train`` writes OUT/target, OUT/draft, OUT/heldout_sample.json (held-out
text the suite evaluates), OUT/metrics.json and OUT/log.jsonl.

This file sits beside the weights it made (treespec/pair/README.md: how and
where they were trained; until issue 41 it was scripts/train_pair.py).
treespec/pair/ is package data, not a package: nothing imports this file;
run it as a script from the repository root.
"""

import argparse
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from functools import partial
from pathlib import Path

import numpy as np

from treespec import zoo
from treespec.backend.blas import detect


# Architectures. Untouched fields take mlx-lm's llama defaults (no biases,
# plain RoPE); every attention layer uses a plain KVCache.
TARGET = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 704,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
DRAFT = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 384,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

HELDOUT_MOD = 20  # a file is held out iff sha256(relpath) % HELDOUT_MOD == 0
SAMPLE_SEGMENTS = 6  # held-out text committed with the pair for the suite
SAMPLE_CHARS = 560
SAMPLE_MAX_TOKENS = 512
PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    "


def full_config(arch: dict) -> dict:

    cfg = dict(arch)
    cfg["vocab_size"] = zoo.VOCAB_SIZE
    cfg["bos_token_id"] = zoo.token_id(zoo.BOS)
    cfg["eos_token_id"] = zoo.token_id(zoo.EOS)
    cfg["pad_token_id"] = zoo.token_id(zoo.PAD)
    return cfg


def is_heldout(relpath: str) -> bool:
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h % HELDOUT_MOD == 0


# ---------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------


def stdlib_files(root: Path):
    """Sorted (relpath, text) of the stdlib's .py files: no site-packages,
    valid UTF-8 only, none containing a special-token string."""

    skipped = {"not_utf8": [], "special_token": []}
    out = []
    for f in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = f.relative_to(root).as_posix()
        if any(part in ("site-packages", "dist-packages", "__pycache__") for part in f.parts):
            continue
        if not f.is_file():
            continue
        try:
            text = f.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped["not_utf8"].append(rel)
            continue
        if any(t in text for t in zoo.SPECIAL_TOKENS):
            skipped["special_token"].append(rel)
            continue
        out.append((rel, text))
    return out, skipped


def heldout_sample(heldout):
    """SAMPLE_SEGMENTS runs of whole lines from evenly spaced held-out files
    (of at least 4 * SAMPLE_CHARS characters), each starting a third of the
    way into its file."""
    big = [(rel, text) for rel, text in heldout if len(text) >= 4 * SAMPLE_CHARS]
    picks = [big[(2 * i + 1) * len(big) // (2 * SAMPLE_SEGMENTS)] for i in range(SAMPLE_SEGMENTS)]
    segments = []
    for rel, text in picks:
        start = text.index("\n", len(text) // 3) + 1
        end = text.index("\n", start + SAMPLE_CHARS) + 1
        segments.append({"file": rel, "text": text[start:end]})
    return segments


def cmd_corpus(args):

    root = Path(args.stdlib or sysconfig.get_paths()["stdlib"])
    files, skipped = stdlib_files(root)
    tok = zoo.tokenizer()
    eos = zoo.token_id(zoo.EOS)
    t0 = time.time()
    ids = tok([text for _, text in files], add_special_tokens=False)["input_ids"]
    streams = {"train": [], "heldout": []}
    names = {"train": [], "heldout": []}
    nbytes = {"train": 0, "heldout": 0}
    for (rel, text), seq in zip(files, ids):
        split = "heldout" if is_heldout(rel) else "train"
        streams[split].extend(seq)
        streams[split].append(eos)
        names[split].append(rel)
        nbytes[split] += len(text.encode())
    arrays = {k: np.asarray(v, dtype=np.uint16) for k, v in streams.items()}
    meta = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "stdlib": str(root),
        "heldout_rule": f"sha256(relpath) % {HELDOUT_MOD} == 0",
        "files": {k: len(v) for k, v in names.items()},
        "bytes": nbytes,
        "tokens": {k: int(v.size) for k, v in arrays.items()},
        "bytes_per_token": {k: nbytes[k] / arrays[k].size for k in arrays},
        "skipped": skipped,
        "heldout_files": names["heldout"],
        "sha256": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in arrays.items()},
        "tokenizer_sha256": hashlib.sha256(zoo.tokenizer_json().encode()).hexdigest(),
        "sample": heldout_sample([(r, t) for r, t in files if is_heldout(r)]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, meta=np.array(json.dumps(meta)), **arrays)
    short = {k: v for k, v in meta.items() if k not in ("heldout_files", "sample", "skipped")}
    short["skipped"] = {k: len(v) for k, v in skipped.items()}
    print(json.dumps(short, indent=1))
    print(f"tokenized in {time.time() - t0:.1f}s; wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def cli_args(args):
    return {k: v for k, v in vars(args).items() if k != "func"}


def load_corpus(path):
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        return z["train"].astype(np.int32), z["heldout"].astype(np.int32), meta


# ---------------------------------------------------------------------------
# models, losses, evaluation
# ---------------------------------------------------------------------------


def build(arch):
    from mlx_lm.utils import _get_classes

    cfg = full_config(arch)
    model_class, args_class = _get_classes(config=cfg)
    return model_class(args_class.from_dict(dict(cfg))), cfg


def n_params(model):
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(model.parameters()))


def eval_windows(heldout, seq_len, n):
    """n evenly spaced, non-overlapping (seq_len + 1)-token windows."""
    w = seq_len + 1
    total = heldout.size // w
    idx = np.linspace(0, total - 1, num=min(n, total)).astype(np.int64)
    return np.stack([heldout[i * w : (i + 1) * w] for i in idx])


def evaluate(target, draft, windows, batch=16):
    """Held-out nats/token of both models and how often the drafter's greedy
    token equals the target's (both over the same next-token positions)."""
    import mlx.core as mx
    import mlx.nn as nn

    sums = {"target": 0.0, "draft": 0.0, "agree": 0.0}
    count = 0
    for i in range(0, len(windows), batch):
        w = mx.array(windows[i : i + batch])
        x, y = w[:, :-1], w[:, 1:]
        lt = target(x).astype(mx.float32)
        ld = draft(x).astype(mx.float32)
        ct = nn.losses.cross_entropy(lt, y, reduction="sum")
        cd = nn.losses.cross_entropy(ld, y, reduction="sum")
        ag = (mx.argmax(lt, -1) == mx.argmax(ld, -1)).sum()
        mx.eval(ct, cd, ag)
        sums["target"] += ct.item()
        sums["draft"] += cd.item()
        sums["agree"] += ag.item()
        count += y.size
    return {
        "target_loss": sums["target"] / count,
        "draft_loss": sums["draft"] / count,
        "greedy_agreement": sums["agree"] / count,
        "tokens": count,
    }


def evaluate_sample(target, draft, segments):
    """What suites/pair computes: each segment tokenized on its own, cut to
    SAMPLE_MAX_TOKENS, one forward each, losses summed over next tokens."""

    tok = zoo.tokenizer()
    windows = [tok.encode(s["text"])[:SAMPLE_MAX_TOKENS] for s in segments]
    out = {"target": 0.0, "draft": 0.0, "agree": 0.0, "tokens": 0}
    for ids in windows:
        r = evaluate(target, draft, np.asarray([ids]), batch=1)
        n = r["tokens"]
        out["target"] += r["target_loss"] * n
        out["draft"] += r["draft_loss"] * n
        out["agree"] += r["greedy_agreement"] * n
        out["tokens"] += n
    n = out["tokens"]
    return {
        "target_loss": out["target"] / n,
        "draft_loss": out["draft"] / n,
        "greedy_agreement": out["agree"] / n,
        "tokens": n,
    }


def greedy(model, prompt, n=80):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache


    tok = zoo.tokenizer()
    ids = tok.encode(prompt)
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    out = []
    for _ in range(n):
        t = int(mx.argmax(logits[0, -1]).item())
        if t == zoo.token_id(zoo.EOS):
            break
        out.append(t)
        logits = model(mx.array([[t]]), cache=cache)
    return tok.decode(out)


# ---------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------


class Pair:
    """Both models, their optimizers and the compiled joint step."""

    def __init__(self, args, total_steps):
        import mlx.core as mx
        import mlx.nn as nn
        import mlx.optimizers as optim

        mx.random.seed(args.seed)
        self.target, self.target_cfg = build(TARGET)
        self.draft, self.draft_cfg = build(DRAFT)
        self.model = nn.Module()
        self.model.target, self.model.draft = self.target, self.draft
        mx.eval(self.model.parameters())

        def schedule(lr):
            warm = min(args.warmup, max(total_steps - 1, 1))
            return optim.join_schedules(
                [
                    optim.linear_schedule(lr / warm, lr, warm),
                    optim.cosine_decay(lr, max(total_steps - warm, 1), lr * args.final_lr_frac),
                ],
                [warm],
            )

        def adamw(lr):
            return optim.AdamW(
                learning_rate=schedule(lr), betas=[0.9, 0.95], eps=1e-8,
                weight_decay=args.weight_decay,
            )

        self.opt_t, self.opt_d = adamw(args.lr), adamw(args.draft_lr)
        distill, clip = args.distill, args.clip

        def loss_fn(model, x, y):
            lt = model.target(x)
            ld = model.draft(x)
            ce_t = nn.losses.cross_entropy(lt, y, reduction="mean")
            ce_d = nn.losses.cross_entropy(ld, y, reduction="mean")
            loss_d = ce_d
            if distill > 0:
                # KL(target || drafter) with the target's logits held fixed:
                # the drafter learns what the target would say, not only the text.
                lpt = nn.log_softmax(mx.stop_gradient(lt), axis=-1)
                lpd = nn.log_softmax(ld, axis=-1)
                kl = (mx.exp(lpt) * (lpt - lpd)).sum(-1).mean()
                loss_d = (1 - distill) * ce_d + distill * kl
            return ce_t + loss_d, (ce_t, ce_d)

        grad_fn = nn.value_and_grad(self.model, loss_fn)
        state = [self.model.state, self.opt_t.state, self.opt_d.state]

        @partial(mx.compile, inputs=state, outputs=state)
        def step(x, y):
            (_, (ce_t, ce_d)), g = grad_fn(self.model, x, y)
            gt, nt = optim.clip_grad_norm(g["target"], clip)
            gd, nd = optim.clip_grad_norm(g["draft"], clip)
            self.opt_t.update(self.model.target, gt)
            self.opt_d.update(self.model.draft, gd)
            return ce_t, ce_d, nt, nd

        self.step = step
        self.state = state


def batches(train, seq_len, batch, seed):
    rng = np.random.RandomState(seed)
    hi = train.size - seq_len - 1
    while True:
        starts = rng.randint(0, hi, size=batch)
        yield np.stack([train[s : s + seq_len + 1] for s in starts])


def run_steps(pair, data, n, log=None, every=0, eval_fn=None, deadline=None):
    import mlx.core as mx

    t0 = time.time()
    done = 0
    for i in range(n):
        w = mx.array(next(data))
        ce_t, ce_d, nt, nd = pair.step(w[:, :-1], w[:, 1:])
        mx.eval(pair.state, ce_t, ce_d)
        done = i + 1
        if log is not None and (done % every == 0 or done == n):
            rec = {
                "step": done,
                "train_target": round(ce_t.item(), 4),
                "train_draft": round(ce_d.item(), 4),
                "gnorm_target": round(nt.item(), 3),
                "lr": float(pair.opt_t.learning_rate.item()),
                "elapsed_s": round(time.time() - t0, 1),
            }
            if eval_fn is not None:
                rec.update({f"heldout_{k}": round(v, 4) for k, v in eval_fn().items() if k != "tokens"})
            log(rec)
        if deadline is not None and time.time() > deadline:
            break
    return done, time.time() - t0


def save_pair(pair, out, dtype):
    import mlx.core as mx


    paths = {}
    with mx.stream(mx.cpu):
        for name, model, cfg in (
            ("target", pair.target, pair.target_cfg),
            ("draft", pair.draft, pair.draft_cfg),
        ):
            model.set_dtype(getattr(mx, dtype))
            mx.eval(model.parameters())
            paths[name] = zoo.save(model, out / name, config=cfg)
    return paths


def cmd_train(args):
    import mlx.core as mx

    t_start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, heldout, meta = load_corpus(args.corpus)
    windows = eval_windows(heldout, args.seq_len, args.eval_windows)
    logf = open(out / "log.jsonl", "w")

    def log(rec):
        print(json.dumps(rec), flush=True)
        logf.write(json.dumps(rec) + "\n")
        logf.flush()

    log({"device": str(mx.default_device()), "mlx": mx.__version__,
         "python": sys.version.split()[0], "corpus_python": meta["python"],
         "corpus_tokens": meta["tokens"], "args": cli_args(args)})

    steps = args.steps
    if steps <= 0:
        # Auto: time a few steps of a throwaway pair, then fit the schedule
        # to --time-budget. The resolved count is logged; rerunning with
        # --steps <that count> reproduces the run.
        probe = Pair(args, 1000)
        data = batches(train, args.seq_len, args.batch, args.seed + 1)
        run_steps(probe, data, 5)
        n, dt = run_steps(probe, data, args.probe_steps)
        per_step = dt / n
        # Leave room for the evaluations (each ~ eval_windows forwards).
        t0 = time.time()
        evaluate(probe.target, probe.draft, windows)
        eval_s = time.time() - t0
        left = args.time_budget - (time.time() - t_start) - (args.evals + 2) * eval_s - 20
        steps = max(int(left / per_step) // 100 * 100, 100)
        log({"probe_step_s": round(per_step, 4), "eval_s": round(eval_s, 2),
             "resolved_steps": steps})
        del probe

    pair = Pair(args, steps)
    log({"target_params": n_params(pair.target), "draft_params": n_params(pair.draft),
         "steps": steps, "tokens_per_step": args.batch * args.seq_len})
    data = batches(train, args.seq_len, args.batch, args.seed + 1)
    every = max(steps // max(args.evals, 1), 1)
    deadline = t_start + args.max_seconds if args.max_seconds else None
    done, train_s = run_steps(
        pair, data, steps, log=log, every=every,
        eval_fn=lambda: evaluate(pair.target, pair.draft, windows), deadline=deadline,
    )

    final32 = evaluate(pair.target, pair.draft, windows)
    sample32 = evaluate_sample(pair.target, pair.draft, meta["sample"])
    paths = save_pair(pair, out, args.dtype)
    final = evaluate(pair.target, pair.draft, windows)  # now in args.dtype
    sample = evaluate_sample(pair.target, pair.draft, meta["sample"])
    metrics = {
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "steps": steps,
        "steps_done": done,
        "stopped_early": done < steps,
        "train_seconds": round(train_s, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "tokens_seen": done * args.batch * args.seq_len,
        "target_params": n_params(pair.target),
        "draft_params": n_params(pair.draft),
        "dtype": args.dtype,
        "uniform_loss": math.log(384),
        "heldout_float32": final32,
        "heldout": final,
        "sample_float32": sample32,
        "sample": sample,
        "corpus": {k: meta[k] for k in ("python", "stdlib", "heldout_rule", "files",
                                        "bytes", "tokens", "sha256", "tokenizer_sha256")},
        "args": cli_args(args),
        "greedy_target": greedy(pair.target, PROMPT),
        "greedy_draft": greedy(pair.draft, PROMPT),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (out / "heldout_sample.json").write_text(json.dumps(
        {"python": meta["python"], "rule": meta["heldout_rule"],
         "max_tokens": SAMPLE_MAX_TOKENS, "segments": meta["sample"]}, indent=1))
    log({"final": final, "sample": sample, "paths": {k: str(v) for k, v in paths.items()}})
    print(metrics["greedy_target"])


# ---------------------------------------------------------------------------
# train-draft: a further drafter for an already trained target
# ---------------------------------------------------------------------------


class DraftOnly:
    """A new drafter trained against a frozen, already saved target: the same
    loss as the drafter's in ``Pair`` (``(1-a) CE + a KL(target || draft)``),
    the target's logits from its saved weights (upcast to float32 for the
    forward, held fixed)."""

    def __init__(self, args, target, total_steps):
        import mlx.core as mx
        import mlx.nn as nn
        import mlx.optimizers as optim

        mx.random.seed(args.seed)
        arch = dict(DRAFT, hidden_size=args.hidden, num_hidden_layers=args.layers,
                    intermediate_size=args.mlp, num_attention_heads=args.heads,
                    num_key_value_heads=args.heads)
        self.target = target
        self.draft, self.draft_cfg = build(arch)
        mx.eval(self.draft.parameters())
        warm = min(args.warmup, max(total_steps - 1, 1))
        lr = args.draft_lr
        self.opt = optim.AdamW(
            learning_rate=optim.join_schedules(
                [optim.linear_schedule(lr / warm, lr, warm),
                 optim.cosine_decay(lr, max(total_steps - warm, 1), lr * args.final_lr_frac)],
                [warm]),
            betas=[0.9, 0.95], eps=1e-8, weight_decay=args.weight_decay)
        self.opt_t = self.opt  # run_steps logs this one's learning rate
        distill, clip = args.distill, args.clip

        def loss_fn(draft, x, y, lt):
            ld = draft(x)
            ce = nn.losses.cross_entropy(ld, y, reduction="mean")
            if lt is None:
                return ce, ce
            lpt = nn.log_softmax(lt, axis=-1)
            lpd = nn.log_softmax(ld, axis=-1)
            kl = (mx.exp(lpt) * (lpt - lpd)).sum(-1).mean()
            return (1 - distill) * ce + distill * kl, ce

        grad_fn = nn.value_and_grad(self.draft, loss_fn)
        state = [self.draft.state, self.opt.state]

        @partial(mx.compile, inputs=state, outputs=state)
        def draft_step(x, y, lt):
            (_, ce), g = grad_fn(self.draft, x, y, lt)
            g, norm = optim.clip_grad_norm(g, clip)
            self.opt.update(self.draft, g)
            return ce, norm

        def step(x, y):
            # --distill 0 trains on the text alone: no target forward, the
            # cost of a step on the CPU.
            lt = mx.stop_gradient(self.target(x).astype(mx.float32)) if distill > 0 else None
            ce, norm = draft_step(x, y, lt)
            # run_steps reads (target CE, draft CE, target norm, draft norm).
            return mx.array(0.0), ce, mx.array(0.0), norm

        self.step = step
        self.state = state


def cmd_train_draft(args):
    import mlx.core as mx
    import mlx_lm

    t_start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, heldout, meta = load_corpus(args.corpus)
    windows = eval_windows(heldout, args.seq_len, args.eval_windows)
    target, _ = mlx_lm.load(str(args.target))
    saved_dtype = target.model.embed_tokens.weight.dtype
    target.set_dtype(mx.float32)  # the training forward; evaluations use the saved dtype
    mx.eval(target.parameters())
    logf = open(out / "log.jsonl", "w")

    def log(rec):
        print(json.dumps(rec), flush=True)
        logf.write(json.dumps(rec) + "\n")
        logf.flush()

    log({"device": str(mx.default_device()), "mlx": mx.__version__, "blas": str(detect()),
         "python": sys.version.split()[0], "target": str(args.target), "args": cli_args(args)})
    pair = DraftOnly(args, target, args.steps)
    log({"draft_params": n_params(pair.draft), "steps": args.steps,
         "tokens_per_step": args.batch * args.seq_len})
    data = batches(train, args.seq_len, args.batch, args.seed + 1)
    every = max(args.steps // max(args.evals, 1), 1)
    deadline = t_start + args.max_seconds if args.max_seconds else None
    done, train_s = run_steps(pair, data, args.steps, log=log, every=every,
                              eval_fn=lambda: evaluate(target, pair.draft, windows),
                              deadline=deadline)
    final32 = evaluate(target, pair.draft, windows)
    target.set_dtype(saved_dtype)  # the target as shipped, for the final figures
    pair.draft.set_dtype(getattr(mx, args.dtype))
    mx.eval(target.parameters(), pair.draft.parameters())
    path = zoo.save(pair.draft, out / "draft", config=pair.draft_cfg)
    final = evaluate(target, pair.draft, windows)
    sample = evaluate_sample(target, pair.draft, meta["sample"])
    metrics = {
        "device": str(mx.default_device()), "mlx": mx.__version__, "blas": str(detect()),
        "target": str(args.target), "steps": args.steps, "steps_done": done,
        "stopped_early": done < args.steps, "train_seconds": round(train_s, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "tokens_seen": done * args.batch * args.seq_len,
        "draft_params": n_params(pair.draft), "dtype": args.dtype,
        "uniform_loss": math.log(384),
        "heldout_float32_draft": final32, "heldout": final, "sample": sample,
        "args": cli_args(args), "greedy_draft": greedy(pair.draft, PROMPT),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    log({"final": final, "sample": sample, "path": str(path)})


def cmd_eval(args):
    import mlx_lm

    _, heldout, meta = load_corpus(args.corpus)
    target, _ = mlx_lm.load(str(Path(args.pair) / "target"))
    draft, _ = mlx_lm.load(str(Path(args.pair) / "draft"))
    windows = eval_windows(heldout, args.seq_len, args.eval_windows)
    t0 = time.time()
    res = {"heldout": evaluate(target, draft, windows),
           "sample": evaluate_sample(target, draft, meta["sample"]),
           "uniform_loss": math.log(384)}
    res["seconds"] = round(time.time() - t0, 1)
    res["greedy_target"] = greedy(target, PROMPT)
    res["greedy_draft"] = greedy(draft, PROMPT)
    print(json.dumps(res, indent=1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("corpus", help="tokenize this Python's stdlib into an .npz")
    c.add_argument("--out", required=True)
    c.add_argument("--stdlib", help="default: sysconfig.get_paths()['stdlib']")
    c.set_defaults(func=cmd_corpus)

    t = sub.add_parser("train", help="train the pair, save float16 checkpoints")
    t.add_argument("--corpus", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=0,
                   help="optimizer steps; 0: fit to --time-budget after a timing probe")
    t.add_argument("--time-budget", type=float, default=300.0)
    t.add_argument("--max-seconds", type=float, default=0.0,
                   help="hard stop (saves what it has); 0: none")
    t.add_argument("--probe-steps", type=int, default=20)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seq-len", type=int, default=512)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--draft-lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--final-lr-frac", type=float, default=0.1)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--distill", type=float, default=0.5,
                   help="drafter loss = (1-a) CE + a KL(target || drafter)")
    t.add_argument("--evals", type=int, default=8, help="held-out evaluations during training")
    t.add_argument("--eval-windows", type=int, default=64)
    t.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("train-draft", help="train a further drafter for a saved target")
    d.add_argument("--corpus", required=True)
    d.add_argument("--target", required=True, help="the saved target checkpoint (frozen)")
    d.add_argument("--out", required=True)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--steps", type=int, required=True)
    d.add_argument("--max-seconds", type=float, default=0.0,
                   help="hard stop (saves what it has); 0: none")
    d.add_argument("--hidden", type=int, default=64)
    d.add_argument("--layers", type=int, default=1)
    d.add_argument("--mlp", type=int, default=192)
    d.add_argument("--heads", type=int, default=1)
    d.add_argument("--batch", type=int, default=16)
    d.add_argument("--seq-len", type=int, default=256)
    d.add_argument("--draft-lr", type=float, default=3e-3)
    d.add_argument("--warmup", type=int, default=100)
    d.add_argument("--final-lr-frac", type=float, default=0.1)
    d.add_argument("--weight-decay", type=float, default=0.1)
    d.add_argument("--clip", type=float, default=1.0)
    d.add_argument("--distill", type=float, default=0.5)
    d.add_argument("--evals", type=int, default=6)
    d.add_argument("--eval-windows", type=int, default=64)
    d.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    d.set_defaults(func=cmd_train_draft)

    e = sub.add_parser("eval", help="held-out loss and agreement of a saved pair")
    e.add_argument("--corpus", required=True)
    e.add_argument("--pair", required=True)
    e.add_argument("--seq-len", type=int, default=512)
    e.add_argument("--eval-windows", type=int, default=64)
    e.set_defaults(func=cmd_eval)

    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
