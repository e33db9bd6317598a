"""Start-up and end-to-end time of the command line, as a user sees it.

    python -m benchmarks.startup --repeats 7 --generate-args "--max-tokens 64"
    python -m benchmarks.startup --baseline DIR [--baseline-generate-args ARGS] [--cold-memo]
    python -m benchmarks.startup --json results/startup/NAME.json

Times, each as a fresh process, ``--repeats`` times interleaved: ``treespec
--help``, ``python -c "import treespec.cli.main"`` and ``treespec generate`` on
the default pair. ``--baseline DIR``: the same commands from another checkout
of treespec (e.g. ``git archive COMMIT | tar -x -C DIR``; run from DIR, so its
package is the one imported), interleaved with this one's run by run, so a
busy machine slows both alike. Before the timed runs one untimed ``generate``
per checkout warms the OS file cache and (where the probe's verdict is
memoized on disk) the memo, so every timed generate is a second invocation;
``--cold-memo`` gives every generate a fresh, empty TREESPEC_CACHE_DIR
instead. Prints medians of wall time and of CPU time (user + system of the
child, which load inflates less), every wall sample, the ratios this /
baseline, and the load average before and after; ``--json PATH`` also
writes the samples.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

COMMANDS = {
    "help": ["-m", "treespec", "--help"],
    "import": ["-c", "import treespec.cli.main"],
    "generate": ["-m", "treespec", "generate"],
}


def timed(args, env, cwd):
    """(wall s, CPU s of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None):
    ap = harness.parser("startup", __doc__, pairs=(), repeats=7, calls=None)
    ap.add_argument("--generate-args", default="",
                    help="extra flags for treespec generate, e.g. '--max-tokens 64'")
    ap.add_argument("--baseline", help="another treespec checkout, timed interleaved")
    ap.add_argument("--baseline-generate-args", default=None,
                    help="its generate flags (default: --generate-args)")
    ap.add_argument("--cold-memo", action="store_true",
                    help="a fresh, empty TREESPEC_CACHE_DIR for every generate")
    ap.add_argument("--json", help="also write the samples as JSON here")
    args = ap.parse_args(argv)
    harness.prepare(args)  # --blas: the children inherit its LD_PRELOAD
    memo = tempfile.mkdtemp(prefix="treespec-startup-memo-")
    sides = {"this": (harness.ROOT, args.generate_args)}
    if args.baseline:
        extra = args.generate_args if args.baseline_generate_args is None \
            else args.baseline_generate_args
        sides["baseline"] = (Path(args.baseline).resolve(), extra)
    envs = {}
    for side, (root, _) in sides.items():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=str(root), TREESPEC_CACHE_DIR=memo)
        envs[side] = env
    cmds = {side: {**COMMANDS, "generate": COMMANDS["generate"] + extra.split()}
            for side, (_, extra) in sides.items()}
    with harness.record(args, what="treespec's command line, each command a fresh process"
                        + (f", against {args.baseline}" if args.baseline else "")) as say:
        load_before = os.getloadavg()
        for side, (root, _) in sides.items():  # warm-up: file cache, and the memo if any
            timed(cmds[side]["generate"], envs[side], root)
        wall = {s: {k: [] for k in COMMANDS} for s in sides}
        cpu = {s: {k: [] for k in COMMANDS} for s in sides}
        for order in harness.rotated(list(sides), args.repeats):
            for name in COMMANDS:
                for side in order:
                    env = envs[side]
                    if name == "generate" and args.cold_memo:
                        env = {**env, "TREESPEC_CACHE_DIR": tempfile.mkdtemp(
                            prefix="treespec-memo-")}
                    w, c = timed(cmds[side][name], env, sides[side][0])
                    wall[side][name].append(w)
                    cpu[side][name].append(c)
        load_after = os.getloadavg()
        med = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in wall.items()}
        cmed = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in cpu.items()}
        for side in sides:
            gen = " ".join(cmds[side]["generate"][3:]) or "(defaults)"
            say(f"{side}: {sides[side][0]} generate {gen}")
            for k in COMMANDS:
                say(f"  {k:<9} wall median {med[side][k]:6.2f} s, CPU median "
                    f"{cmed[side][k]:6.2f} s; wall " + " ".join(f"{x:.2f}" for x in wall[side][k]))
        if "baseline" in sides:
            for k in COMMANDS:
                say(f"  {k:<9} this / baseline: wall {med['this'][k] / med['baseline'][k]:.2f}, "
                    f"CPU {cmed['this'][k] / cmed['baseline'][k]:.2f}")
        say(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
            f"{os.cpu_count()} CPUs; cold memo: {args.cold_memo}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "sides": {s: {"root": str(r), "generate_args": e} for s, (r, e) in sides.items()},
            "wall_medians_s": med, "cpu_medians_s": cmed, "wall_s": wall, "cpu_s": cpu,
            "repeats": args.repeats, "cold_memo": args.cold_memo,
            "loadavg_before": load_before, "loadavg_after": load_after,
            "cpus": os.cpu_count()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
