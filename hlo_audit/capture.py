"""Arrays a traced step closes over: the state jax bakes into the program as constants.

A jitted function that reads an array it was not given as an argument captures it: jax stages the array into
the jaxpr as a constant, and the lowering prints it into the HLO as a literal (a broadcast of one scalar when
every element is equal). Nothing marshals it per call, so it costs no entry parameter, but it is frozen: an
RNG key captured this way never advances, and captured weights make the program as large as the model.
MaxEngine captures its model's non-parameter state (RNG streams; AQT serve mode's quantized weights) so.

The captured arrays are the jaxpr's non-empty constants that survive jit's own dead-code elimination (the
``dce_jaxpr_consts`` that jax's lowering calls, so an array the step never reads is not counted). A state tree
the target names (``{"model": rest_state}``) gives each its path, by identity: the constant is the very array
object the tree holds. This module imports jax; only what lowers imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax

from hlo_audit.attribution import state_keys
from hlo_audit.hlo.constants import CapturedArray


def hlo_dtype(dtype) -> str:
    """numpy / ml_dtypes name -> HLO's: float32 -> f32, bfloat16 -> bf16, int8 -> s8, float8_e4m3fn -> f8e4m3fn."""
    name = jax.numpy.dtype(dtype).name
    if name == "bool":
        return "pred"
    for long, short in (("bfloat", "bf"), ("float", "f"), ("uint", "u"), ("int", "s"), ("complex", "c")):
        if name.startswith(long):
            return short + name[len(long):].replace("_", "")
    return name


def _as_hlo_array(value) -> tuple[str, tuple[int, ...]]:
    """(HLO dtype, dims) of a constant as the lowering emits it: a typed PRNG key becomes its raw ``u32`` data."""
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, value)
        return hlo_dtype(data.dtype), tuple(data.shape)
    return hlo_dtype(value.dtype), tuple(value.shape)


def tree_paths(trees: Mapping[str, object]) -> dict[int, str]:
    """id(leaf) -> ``label.key.key`` for every array leaf of the named trees, named as entry parameters are."""
    paths: dict[int, str] = {}
    for label, tree in trees.items():
        for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            paths[id(leaf)] = ".".join([label, *state_keys(keypath)])
    return paths


def captured_arrays(traced: jax.stages.Traced, trees: Mapping[str, object] | None = None) -> tuple[CapturedArray, ...]:
    """The arrays ``traced`` closes over and keeps, in the jaxpr's order, named by ``trees`` where they hold them."""
    from jax._src.interpreters import partial_eval as pe  # noqa: PLC0415 (jit's DCE has no public entry)

    jaxpr = traced.jaxpr
    consts = list(getattr(jaxpr, "consts", ()))
    if not consts:
        return ()
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    _, used, _ = pe.dce_jaxpr_consts(inner, [True] * len(inner.outvars))
    paths = tree_paths(trees or {})
    result = []
    for value, kept in zip(consts, used):
        # An empty array holds nothing (MaxText's decode step closes over two int32[0] index lists).
        if kept and hasattr(value, "dtype") and getattr(value, "size", 0):
            dtype, dims = _as_hlo_array(value)
            result.append(CapturedArray(path=paths.get(id(value)), dtype=dtype, dims=dims))
    return tuple(result)
