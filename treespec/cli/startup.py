"""What a process sets before the command's module (or the suite's plugins)
imports mlx-lm: float32 products at float32 precision, and the device.

**TF32.** MLX multiplies float32 as TF32 where the hardware has it (CUDA,
Apple's M5) unless ``MLX_ENABLE_TF32=0``, reading the variable once, at the
first product that could use it. The gate's probe, the audit and bench's
checks compare float32 forwards bit for bit or against a measured envelope,
which TF32's rounding swamps (docs/numerics.md#tf32-and-cudnn-attention-on-cuda),
so every command turns it off, as the root conftest.py does for the suite; a
caller's own setting is kept, and reports name the setting in force.

**The device** (``--device cpu|gpu``). mlx_lm.generate makes its
``generation_stream`` on the default device when it is imported, and the
rounds run on that stream while the gate's probe runs on the default device:
switched after that import, the probe would measure one device and the
rounds run on another. So the device is set before that import, and a
process where mlx_lm.generate already made its stream on another device is
refused, never switched. ``TREESPEC_DEVICE`` is the flag's default (pytest's
``--device`` sets it, so the suite's subprocesses compute where its tests
do); without either, MLX's own default device is left as it is (the GPU
where MLX has one)."""

import os
import sys
from typing import MutableMapping, Optional, Tuple

import mlx.core as mx

from ..errors import UsageError

TF32 = "MLX_ENABLE_TF32"
DEVICES = ("cpu", "gpu")
DEVICE_ENV = "TREESPEC_DEVICE"
DEVICE_HELP = ("the device MLX computes on: cpu (MLX's CPU backend) or gpu (Metal, CUDA), set "
               f"before mlx-lm is imported; default: ${DEVICE_ENV} if set, else MLX's default "
               "device, left as it is (the GPU where MLX has one)")


def float32_products(environ: Optional[MutableMapping[str, str]] = None) -> str:
    """``MLX_ENABLE_TF32=0`` unless the caller set it; returns the setting in force."""
    environ = os.environ if environ is None else environ
    return environ.setdefault(TF32, "0")


def settings(environ: Optional[MutableMapping[str, str]] = None) -> dict:
    """The device and the TF32 switch, for a report: which device made a record,
    at which float32 precision (``unset``: MLX's default, TF32 where it can)."""
    environ = os.environ if environ is None else environ
    return {"device": str(mx.default_device()), "tf32": environ.get(TF32, "unset")}


def add_device_flag(parser) -> None:
    parser.add_argument("--device", choices=DEVICES, default=None, help=DEVICE_HELP)


def requested(flag: Optional[str], environ: Optional[MutableMapping[str, str]] = None
              ) -> Tuple[Optional[str], str]:
    """The device asked for (``flag``, else ``$TREESPEC_DEVICE``, else None)
    and how it was asked, for messages."""
    environ = os.environ if environ is None else environ
    if flag is not None:
        return flag, f"--device {flag}"
    name = environ.get(DEVICE_ENV) or None
    return name, f"{DEVICE_ENV}={name}"


def refuse_blas_on_gpu(blas: str, flag: Optional[str],
                       environ: Optional[MutableMapping[str, str]] = None) -> None:
    """A BLAS choice beside the GPU would choose nothing: a GPU's float32
    products never call the CPU's BLAS."""
    name, said = requested(flag, environ)
    if name == "gpu" and blas != "auto":
        raise UsageError(f"--blas {blas} chooses the CPU BLAS, and {said} multiplies on the GPU: "
                         "give --device cpu or drop --blas")


def apply_device(flag: Optional[str], environ: Optional[MutableMapping[str, str]] = None
                 ) -> Optional[str]:
    """Make ``flag`` (else ``$TREESPEC_DEVICE``) MLX's default device; returns the
    name set, or None (neither given: nothing changed). UsageError naming the
    flag or the variable, and why, where it cannot be that device."""
    name, said = requested(flag, environ)
    if name is None:
        return None
    if name not in DEVICES:
        raise UsageError(f"{said}: not a device; give one of {', '.join(DEVICES)}")
    device = mx.Device(getattr(mx, name))
    if not mx.is_available(device):
        raise UsageError(f"{said}: MLX has no {name.upper()} here (mx.is_available(mx.{name}) is "
                         "False: a CPU-only MLX build, or no Metal or CUDA device); give --device "
                         "cpu or leave --device out")
    made = getattr(sys.modules.get("mlx_lm.generate"), "generation_stream", None)
    if made is not None and made.device != device:
        raise UsageError(f"{said}: mlx_lm.generate is already imported, its stream on "
                         f"{made.device}: the gate would probe {device} while the rounds run "
                         "there; choose the device before mlx-lm is imported")
    mx.set_default_device(device)
    return name
