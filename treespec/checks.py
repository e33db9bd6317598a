"""Argument checks shared by the library's entry points: integers (never a
bool or a float), finite numbers, and token ids of a model's vocabulary.

Nothing is coerced: a float id 9.7 is not id 9, a NaN temperature is not
greedy decoding. Each error names the argument (and the position in it) and
the reason. Ids are checked on the host before anything is fed: an id past
the embedding table is read out of bounds on MLX's CPU backend (silently,
or crashing the process), and one past int32 cannot be an mx.array id.
"""

import math
from numbers import Integral, Real
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

INT32_MAX = 2**31 - 1


def is_integer(value) -> bool:
    """An int or numpy integer, not a bool (a bool is an Integral)."""
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def integer(value, name: str, minimum: Optional[int] = None) -> int:
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def finite(value, name: str, minimum: Optional[float] = None) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def integer_array(values, name: str):
    """An mx/numpy array of token ids as a list; other sequences as they are."""
    if isinstance(values, (mx.array, np.ndarray)):
        integral = (mx.issubdtype(values.dtype, mx.integer) if isinstance(values, mx.array)
                    else np.issubdtype(values.dtype, np.integer))
        if not integral:
            raise TypeError(f"{name} must hold integer token ids, got an array of {values.dtype}")
        if values.ndim != 1:
            raise ValueError(f"{name} must be one sequence of token ids, got shape "
                             f"{tuple(values.shape)}")
        return values.tolist()
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be token ids, not text ({type(values).__name__}): "
                        "encode it with the tokenizer first")
    return values


def token_ids(values, vocab: int, name: str = "prompt") -> list:
    """``values`` as a list of ints, each in ``[0, vocab)``; else a TypeError
    (not an integer) or ValueError (outside the vocabulary) naming
    ``name[i]``."""
    ids = []
    for i, v in enumerate(integer_array(values, name)):
        if type(v) is not int:  # the common case skips the ABC checks
            if not is_integer(v):
                raise TypeError(f"{name}[{i}]: {v!r} is not an integer token id")
            v = int(v)
        if not 0 <= v < vocab:
            raise ValueError(f"{name}[{i}]: token id {v} is outside the vocabulary [0, {vocab})")
        ids.append(v)
    return ids


def checked_branching(branching: Sequence[int]) -> list:
    """A drafter's ``branching`` argument as a list of ints, each >= 1
    (TypeError / ValueError naming the factor); treespec.options.branching_parents
    turns it into the tree."""
    branching = [integer(b, f"branching[{d}]") for d, b in enumerate(branching)]
    if not branching or any(b < 1 for b in branching):
        raise ValueError(f"branching factors must be >= 1, got {branching}")
    return branching
