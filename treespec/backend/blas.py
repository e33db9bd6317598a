"""Which BLAS does this MLX process actually multiply with, and how to choose it.

On the MLX CPU backend every float32 matmul goes through ``cblas_sgemm``. The Linux wheel
(``mlx-cpu``) bundles Ubuntu's *reference* netlib BLAS (``mlx_cpu.libs/libblas-<hash>.so.3.10.0``,
grafted in by auditwheel and found through libmlx.so's RPATH). It is slow (~3-4 GFLOPS) but one
T-token forward is bit-identical to T single-token steps. Preloading Debian's OpenBLAS
(``LD_PRELOAD=.../openblas-pthread/libblas.so.3``) interposes ``cblas_sgemm``: ~30x faster, but
float32 forwards over T>=4 tokens are no longer bit-identical to single steps. Exactness verdicts
must therefore be keyed by the BLAS in use (:meth:`BlasInfo.key`).

Detection does not trust the list of mapped libraries: under an LD_PRELOAD the bundled reference
BLAS is *still mapped* (libmlx.so needs it), and numpy's own OpenBLAS may be mapped too (with
prefixed symbols MLX never calls). Instead it resolves ``cblas_sgemm`` the way the dynamic linker
resolves it for libmlx.so (global scope first: executable + LD_PRELOAD + RTLD_GLOBAL objects; then
libmlx.so's own dependency tree), asks ``dladdr`` which file defines that address, and classifies
that file by the symbols its handle exports (``openblas_get_num_threads``, ``mkl_get_max_threads``,
``bli_info_get_version_str``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from .cuda import cudnn_attention_on

__all__ = [
    "BlasInfo",
    "BlasUnavailable",
    "CHOICES",
    "DEBIAN_PACKAGE",
    "APT_COMMAND",
    "OPENBLAS_ENV",
    "REEXEC_ENV",
    "detect",
    "describe",
    "ensure_blas",
    "openblas_candidates",
    "openblas_path",
    "regime",
    "reexec_with_openblas",
    "reexec_without_preload",
    "missing_openblas_message",
]

CHOICES = ("auto", "reference", "openblas")
DEBIAN_PACKAGE = "libopenblas0-pthread"
APT_COMMAND = f"apt-get update && apt-get install -y {DEBIAN_PACKAGE}"
# Override of the OpenBLAS library to preload (a path). A path that does not exist means
# "not installed" (the suite uses this to exercise the missing-library message).
OPENBLAS_ENV = "TREESPEC_OPENBLAS"
# Loop guard: set to the requested choice just before re-exec'ing for it.
REEXEC_ENV = "TREESPEC_BLAS_REEXEC"

_BLAS_SYMBOL = "cblas_sgemm"
_BLASLIKE = re.compile(r"(blas|blis|mkl|lapack|accelerate|veclib)", re.IGNORECASE)


class BlasUnavailable(RuntimeError):
    """The requested BLAS cannot be used in this process (not installed, or not switchable)."""


@dataclass(frozen=True)
class BlasInfo:
    """The BLAS this process's MLX uses.

    name:    effective matmul engine: "reference" | "openblas" | "mkl" | "blis" | "accelerate"
             | "gpu" (default device is a GPU: float32 matmuls don't touch the CPU BLAS)
             | "unknown" (a cblas_sgemm from an unrecognised library) | "none" (not found).
    cpu_name: the same classification of the CPU BLAS, even when the default device is a GPU.
    library: real path of the file that defines the cblas_sgemm MLX calls (None if not found).
    threads: OpenBLAS/MKL thread count, 1 for the single-threaded reference BLAS, else None.
    device:  str(mx.default_device()).
    version: short version/config string where the library tells (OpenBLAS: "0.3.21 Haswell").
    mapped:  every BLAS-like library mapped into the process (diagnostic only, not in the key).
    """

    name: str
    library: str | None
    threads: int | None
    device: str
    cpu_name: str = ""
    version: str | None = None
    mapped: tuple[str, ...] = field(default=(), compare=False)

    @property
    def device_type(self) -> str:
        m = re.match(r"Device\((\w+)", self.device)
        return m.group(1) if m else self.device

    def key(self) -> str:
        """Stable string naming the numerics regime, for keying exactness verdicts.

        The library's version/kernel is in it (OpenBLAS picks its kernel by CPU, and the kernel
        decides the summation order), and so is a multi-threaded BLAS's thread count: the same
        float32 forward gives different logits with one and two OpenBLAS threads, each
        bit-reproducible on its own.
        """
        parts = [self.device_type, self.name]
        if self.name == "gpu":
            parts.append(_gpu_backend())
            return "/".join(parts)
        if self.version:
            parts.append(self.version.replace(" ", "-"))
        elif self.library:
            # An unidentified library is told apart by where it lives, not by a
            # file name every BLAS shares (libblas.so.3).
            parts.append(_where(self.library))
        if self.threads is not None and self.cpu_name != "reference":
            parts.append(f"t{self.threads}")
        return "/".join(parts)


# ----------------------------------------------------------------------------- detection


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr_fname(addr: int) -> str | None:
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except AttributeError:  # glibc < 2.34 keeps it in libdl
        libdl = ctypes.util.find_library("dl")
        if not libdl:
            return None
        dladdr = ctypes.CDLL(libdl).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def _sym(handle: ctypes.CDLL, name: str):
    try:
        return getattr(handle, name)
    except AttributeError:
        return None


def _mlx_library() -> str | None:
    """Path of MLX's shared library (libmlx.so / libmlx.dylib) next to mlx.core."""
    lib_dir = Path(mx.__file__).parent / "lib"
    for cand in ("libmlx.so", "libmlx.dylib"):
        if (lib_dir / cand).exists():
            return str(lib_dir / cand)
    for path in _mapped_files():  # e.g. a source build with a different layout
        if Path(path).name.startswith("libmlx"):
            return path
    return None


def _mapped_files() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    seen: dict[str, None] = {}
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            seen.setdefault(parts[5], None)
    return list(seen)


def _resolve_sgemm() -> int | None:
    """Address of the cblas_sgemm that libmlx.so's calls bind to."""
    # 1. Global scope (executable, LD_PRELOAD, RTLD_GLOBAL objects): searched first by ld.so.
    fn = _sym(ctypes.CDLL(None), _BLAS_SYMBOL)
    if fn is None:
        # 2. libmlx's own dependency tree (the wheel's RPATH'd bundled BLAS).
        path = _mlx_library()
        if path is None:
            return None
        mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LOCAL", 0)
        try:
            handle = ctypes.CDLL(path, mode=mode)
        except OSError:
            return None
        fn = _sym(handle, _BLAS_SYMBOL)
        if fn is None:
            return None
    return ctypes.cast(fn, ctypes.c_void_p).value


_CLASSIFIED: dict = {}  # library path -> _classify(library)


def _classified(library: str) -> tuple[str, int | None, str | None]:
    """(name, threads, version) of the library that defines cblas_sgemm,
    classified once per path: a loaded library's name and version do not
    change while it stays mapped (MLX holds it); its thread count can
    (``openblas_set_num_threads``), so that is read on every call."""
    if library not in _CLASSIFIED:
        _CLASSIFIED[library] = _classify(library)
    name, threads, version = _CLASSIFIED[library]
    return name, threads(), version


def _fixed(n: int | None):
    return lambda: n


def _classify(library: str):
    """(name, a reader of its thread count, version) of ``library``."""
    try:
        # Already loaded: this only takes a reference. dlsym on the handle searches the object
        # and its dependencies (Debian's openblas libblas.so.3 is a shim over libopenblas.so.0).
        h = ctypes.CDLL(library, mode=getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LOCAL", 0))
    except OSError:
        h = None
    base = Path(library).name.lower()
    if h is not None:
        nthreads = _sym(h, "openblas_get_num_threads")
        if nthreads is not None:
            nthreads.restype = ctypes.c_int
            version = None
            cfg = _sym(h, "openblas_get_config")
            if cfg is not None:
                cfg.restype = ctypes.c_char_p
                text = (cfg() or b"").decode(errors="replace")
                m = re.search(r"OpenBLAS\s+(\S+)", text)
                version = m.group(1) if m else None
            core = _sym(h, "openblas_get_corename")
            if core is not None:
                core.restype = ctypes.c_char_p
                corename = (core() or b"").decode(errors="replace")
                version = f"{version or '?'} {corename}" if corename else version
            return "openblas", lambda: int(nthreads()), version
        mkl = _sym(h, "mkl_get_max_threads") or _sym(h, "MKL_Get_Max_Threads")
        if mkl is not None:
            mkl.restype = ctypes.c_int
            return "mkl", lambda: int(mkl()), None
        blis = _sym(h, "bli_info_get_version_str")
        if blis is not None:
            blis.restype = ctypes.c_char_p
            return "blis", _fixed(None), (blis() or b"").decode(errors="replace") or None
    if sys.platform == "darwin" and ("accelerate" in library.lower() or "veclib" in library.lower()):
        return "accelerate", _fixed(None), None
    if "openblas" in base:
        return "openblas", _fixed(None), None
    if "mlx_cpu.libs" in library or "/blas/" in library:
        # netlib reference BLAS: the wheel's bundled copy, or Debian's libblas3 (its
        # alternatives folder). Single-threaded. Only these two: every BLAS ships a
        # libblas.so.3 (Debian's BLIS and ATLAS do, exporting nothing of their own), and
        # one taken for the reference BLAS would be held to its bit-exactness.
        m = re.search(r"\.so\.(\d+(?:\.\d+)*)$", base)
        return "reference", _fixed(1), (f"netlib-{m.group(1)}" if m else None)
    return "unknown", _fixed(None), None


def _gpu_backend() -> str:
    for name in ("metal", "cuda"):
        mod = getattr(mx, name, None)
        try:
            if mod is not None and mod.is_available():
                return name
        except Exception:  # pragma: no cover - backend probe must never break detection
            pass
    return "gpu"


_DEFINED_IN: dict = {}  # cblas_sgemm's address -> the real path of the file defining it


def detect(mapped: bool = True) -> BlasInfo:
    """Report the BLAS that the running MLX process actually uses for float32 matmuls.
    ``mapped=False`` leaves ``mapped`` (diagnostic only, not in the key) empty:
    listing the process's mappings costs more than the rest."""
    device = str(mx.default_device())
    mapped = tuple(p for p in _mapped_files() if _BLASLIKE.search(Path(p).name)) if mapped else ()
    addr = _resolve_sgemm()
    if addr and addr not in _DEFINED_IN:  # a mapped address stays in its file
        library = _dladdr_fname(addr)
        if library is not None:
            library = os.path.realpath(library) if os.path.exists(library) else library
        _DEFINED_IN[addr] = library
    library = _DEFINED_IN[addr] if addr else None
    if library is not None:
        cpu_name, threads, version = _classified(library)
    elif sys.platform == "darwin":
        cpu_name, threads, version = "accelerate", None, None
    else:
        cpu_name, threads, version = "none", None, None
    gpu = mx.default_device().type == mx.DeviceType.gpu
    return BlasInfo(
        name="gpu" if gpu else cpu_name,
        library=library,
        threads=threads,
        device=device,
        cpu_name=cpu_name,
        version=version,
        mapped=mapped,
    )


def _where(library: str) -> str:
    """A library's folder and file name, e.g. ``blis-pthread/libblas.so.3``."""
    path = Path(library)
    return f"{path.parent.name}/{path.name}"


def regime(info: BlasInfo | None = None) -> str:
    """The name a numerics regime's goldens are kept under: the CPU BLAS
    ("reference", "openblas", ...) or, on a GPU, its backend ("cuda",
    "metal"). A library nobody identified is named by where it lives
    ("unknown-blis-pthread-libblas-so-3"), never after a known one: its
    records are its own. The name keys records; what the regime computes
    exactly is measured, never read off the name."""
    info = info or detect()
    if info.name == "gpu":
        return gpu_regime(_gpu_backend(), str(mx.device_info().get("device_name", "")),
                          cudnn_attention_on(os.environ))
    if info.name == "unknown" and info.library:
        return "unknown-" + re.sub(r"[^a-z0-9]+", "-", _where(info.library).lower()).strip("-")
    return info.name


def gpu_regime(backend: str, device_name: str, cudnn_attention: bool = False) -> str:
    """A GPU's regime: ``cuda`` for every NVIDIA GPU (the H100 and H200 goldens
    agree: golden/e2e/cuda/), and on Metal the chip's own name, because MLX
    picks Metal kernels by the chip's architecture and GitHub's macOS runners
    give it an "Apple Paravirtual device" whose kernel choices differ again:
    ``metal-apple-m2-max``, ``metal-apple-paravirtual-device``. Goldens
    recorded on a laptop never stand for the runner, nor one chip's for
    another's. On CUDA with cuDNN attention on (``cudnn_attention``: treespec
    and the suite turn it off unless the caller set it) ``cuda-cudnn-attention``:
    its multi-token attention rounds otherwise, which changed 12 of the CUDA
    goldens' texts on the H100 (mlx_lm.generate's own prefill included)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    if backend == "cuda" and cudnn_attention:
        return "cuda-cudnn-attention"
    return f"metal-{slug}" if backend == "metal" and slug else backend


def describe(info: BlasInfo | None = None) -> str:
    """One line, e.g. 'BLAS: openblas 0.3.21 Haswell (/usr/lib/.../libblas.so.3, 2 threads),
    device cpu, MLX_ENABLE_TF32=0': every report that names the backend also names the float32
    precision it multiplied at (``unset``: MLX's default, TF32 where the hardware has it)."""
    return f"{_describe(info or detect())}, MLX_ENABLE_TF32={os.environ.get('MLX_ENABLE_TF32', 'unset')}"


def _describe(info: BlasInfo) -> str:
    bits = []
    if info.library:
        bits.append(info.library)
    if info.threads is not None:
        bits.append(f"{info.threads} thread{'s' if info.threads != 1 else ''}")
    detail = f" ({', '.join(bits)})" if bits else ""
    version = f" {info.version}" if info.version else ""
    if info.name == "gpu":
        return (
            f"BLAS: gpu ({_gpu_backend()}; CPU BLAS {info.cpu_name}{version}{detail}),"
            f" device {info.device_type}"
        )
    return f"BLAS: {info.name}{version}{detail}, device {info.device_type}"


# ----------------------------------------------------------------------------- choosing


def openblas_candidates() -> list[str]:
    """Where Debian/Ubuntu put OpenBLAS's BLAS; TREESPEC_OPENBLAS (a path) overrides them all."""
    override = os.environ.get(OPENBLAS_ENV)
    if override:
        return [override]
    triplet = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    out = []
    for variant in ("openblas-pthread", "openblas-openmp", "openblas-serial"):
        out.append(f"/usr/lib/{triplet}/{variant}/libblas.so.3")
    return out


def openblas_path(candidates: list[str] | None = None) -> str | None:
    """The OpenBLAS library to preload if installed, else None."""
    for cand in candidates if candidates is not None else openblas_candidates():
        if os.path.isfile(cand):
            return cand
    return None


def missing_openblas_message(candidates: list[str] | None = None) -> str:
    tried = candidates if candidates is not None else openblas_candidates()
    return (
        "OpenBLAS is not installed (looked for " + ", ".join(tried) + "). "
        f"Install Debian's package {DEBIAN_PACKAGE}:  {APT_COMMAND}  "
        f"(or point {OPENBLAS_ENV} at an OpenBLAS libblas.so.3)."
    )


def _command_line(argv: list[str] | None) -> list[str]:
    if argv is not None:
        return list(argv)
    # sys.orig_argv keeps '-m module' / '-c code', which sys.argv has already rewritten.
    orig = getattr(sys, "orig_argv", None)
    if orig:
        return [sys.executable, *orig[1:]]
    return [sys.executable, *sys.argv]


def _exec(argv: list[str] | None, env: dict[str, str], choice: str) -> None:
    if "_pytest" in sys.modules and argv is None:
        # exec would restart the whole test session under another BLAS: never what a test means.
        raise BlasUnavailable(
            f"--blas {choice} needs a re-exec, refused inside pytest; run the command in a "
            f"subprocess (this process: {describe()})"
        )
    env = dict(env)
    env[REEXEC_ENV] = choice
    cmd = _command_line(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)


def _split_preload(value: str) -> list[str]:
    return [p for p in re.split(r"[:\s]+", value) if p]


def reexec_with_openblas(argv: list[str] | None = None, *, candidates: list[str] | None = None) -> None:
    """Replace this process by the same command with OpenBLAS preloaded. Does not return.

    Raises BlasUnavailable (naming the Debian package and the apt-get command) when OpenBLAS is not
    installed, and when this process is already the result of such a re-exec (loop guard).
    """
    path = openblas_path(candidates)
    if path is None:
        raise BlasUnavailable(missing_openblas_message(candidates))
    if os.environ.get(REEXEC_ENV) == "openblas":
        raise BlasUnavailable(
            f"re-executed with LD_PRELOAD={os.environ.get('LD_PRELOAD', '')} but MLX still uses "
            f"{describe()}; refusing to loop"
        )
    env = dict(os.environ)
    kept = [p for p in _split_preload(env.get("LD_PRELOAD", "")) if not _BLASLIKE.search(Path(p).name)]
    env["LD_PRELOAD"] = ":".join([path, *kept])
    _exec(argv, env, "openblas")


def reexec_without_preload(argv: list[str] | None = None) -> None:
    """Replace this process by the same command with BLAS libraries removed from LD_PRELOAD."""
    if os.environ.get(REEXEC_ENV) == "reference":
        raise BlasUnavailable(
            f"re-executed without a preloaded BLAS but MLX still uses {describe()}; "
            "the reference BLAS is not reachable by removing LD_PRELOAD entries; refusing to loop"
        )
    env = dict(os.environ)
    kept = [p for p in _split_preload(env.get("LD_PRELOAD", "")) if not _BLASLIKE.search(Path(p).name)]
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    _exec(argv, env, "reference")


def ensure_blas(
    choice: str = "auto", argv: list[str] | None = None, *, candidates: list[str] | None = None
) -> BlasInfo:
    """Make this process use the chosen CPU BLAS, re-exec'ing the command if needed.

    "auto" keeps whatever is loaded. "openblas" re-execs with OpenBLAS preloaded (raises
    BlasUnavailable naming the Debian package if it is not installed). "reference" re-execs with
    any preloaded BLAS removed. Returns the BlasInfo of the (possibly new) process.
    """
    if choice not in CHOICES:
        raise ValueError(f"unknown BLAS choice {choice!r}; expected one of {', '.join(CHOICES)}")
    info = detect()
    if choice == "auto" or info.cpu_name == choice:
        os.environ.pop(REEXEC_ENV, None)  # satisfied: children start with a clean guard
        return info
    if sys.platform == "darwin":
        raise BlasUnavailable(f"--blas {choice} is a Linux CPU-backend option; this is {describe(info)}")
    if choice == "openblas":
        reexec_with_openblas(argv, candidates=candidates)
    else:
        reexec_without_preload(argv)
    raise AssertionError("unreachable: exec returned")  # pragma: no cover
