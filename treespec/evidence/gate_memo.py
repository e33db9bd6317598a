"""The exactness probe's results on disk, so a second run does not pay for
the probe (treespec.evidence.gate measures; this module only stores and checks).

One JSON file per probe, ``gate/<name>.json`` under ``$TREESPEC_CACHE_DIR``
(default ``~/.cache/treespec``), holding the probe's whole key (everything
``treespec.evidence.gate`` keys it by: weights digest, dtypes, weight and KV
quantization, BLAS, device, MLX version, the cache mode, draws, seed, the
adapter's name, the shapes) plus what the key cannot see: a digest of
treespec's own source and mlx-lm's version. A file is used only when it is
this format and every one of those fields equals the ones asked for, and
each result is well formed; anything else (unreadable, corrupt, another
key's, another version's) is ignored with a note and measured again. Only
probes of treespec's own adapter are stored: a caller's adapter is code this
digest does not cover.
"""

import hashlib
import json
import os
import sys
import tempfile
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, List, Optional, Sequence

FORMAT = "treespec-gate-probe/1"
FIELDS = {"shape": list, "identical": bool, "max_abs_diff": (int, float),
          "argmax_flips": int, "first_node": (int, type(None)), "draws": int}


def cache_dir() -> Path:
    root = os.environ.get("TREESPEC_CACHE_DIR") or Path.home() / ".cache" / "treespec"
    return Path(root) / "gate"


# The treespec package: every module of it can change a verdict (the verify,
# the caches, the drafters), not only this folder's (the digest once covered
# treespec/evidence/ alone, after the package's folders were made).
PACKAGE = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=4)
def source_digest(root: Path = PACKAGE) -> str:
    """sha256 of every treespec source file (path and bytes): a verdict
    stored by other code is not this code's verdict."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _mlx_lm_version() -> str:
    try:
        return version("mlx-lm")
    except PackageNotFoundError:  # a source checkout on the path
        return "unknown"


def stamp(key: str, keyed: dict, shapes: Sequence[Sequence[int]]) -> dict:
    """Everything a stored probe must match, as JSON reads it back."""
    return json.loads(json.dumps({
        "key": key, "keyed": keyed, "shapes": [list(s) for s in shapes],
        "treespec_source": source_digest(), "mlx_lm": _mlx_lm_version()}, sort_keys=True))


def path_for(expect: dict) -> Path:
    name = hashlib.sha256(json.dumps(expect, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"{name}.json"


def _note(text: str):
    print(f"treespec: gate memo: {text}", file=sys.stderr)


def _why_not(data, expect: dict) -> Optional[str]:
    """Why ``data`` is not a stored probe for ``expect`` (None: it is)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a {FORMAT} file"
    if data.get("expect") != expect:
        theirs = data.get("expect") if isinstance(data.get("expect"), dict) else {}
        diff = sorted(k for k in set(expect) | set(theirs) if expect.get(k) != theirs.get(k))
        return f"stored for another probe (differs in {', '.join(diff) or 'its key'})"
    results = data.get("results")
    if not isinstance(results, list) or len(results) != len(expect["shapes"]):
        return "its results do not cover the shapes"
    for r, shape in zip(results, expect["shapes"]):
        if not isinstance(r, dict) or set(r) != set(FIELDS):
            return "a result has the wrong fields"
        bad = [k for k, t in FIELDS.items()
               if not isinstance(r[k], t) or (t is int and isinstance(r[k], bool))]
        if bad:
            return f"a result's {', '.join(bad)} has the wrong type"
        if r["shape"] != shape:
            return f"a result is for shape {r['shape']}, not {shape}"
    return None


def load(expect: dict, note: Callable[[str], None] = _note) -> Optional[tuple]:
    """(results as dicts, path) stored for ``expect``, or None (nothing
    stored, or a file that is ignored with a ``note`` saying why)."""
    path = path_for(expect)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        note(f"ignored {path}: unreadable ({e})")
        return None
    try:
        data = json.loads(text)
    except ValueError as e:
        note(f"ignored {path}: corrupt ({e}); probing again")
        return None
    why = _why_not(data, expect)
    if why is not None:
        note(f"ignored {path}: {why}; probing again")
        return None
    return data["results"], path


def save(expect: dict, results: List[dict],
         note: Callable[[str], None] = _note) -> Optional[Path]:
    """Store atomically (a temporary file renamed into place, so a reader
    never sees half a file); None, with a note, where it cannot be written."""
    path = path_for(expect)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probe-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "expect": expect, "results": results}, f)
        os.replace(tmp, path)
    except OSError as e:
        note(f"could not store the probe under {path.parent}: {e}")
        return None
    return path
