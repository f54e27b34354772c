"""Lower MaxText's own NNX train step to HLO, from shapes alone.

Why it is done this way:

* The audit is only meaningful for the step MaxText actually runs, so nothing
  here rebuilds the model: the configuration goes through MaxText's config
  system (base.yml, the model's yml, then our settings), and the step is
  MaxText's ``train.train_step`` wrapped by
  ``maxtext_utils.get_functional_train_with_signature``, exactly the path of
  ``maxtext/trainers/pre_train/train_compile.py`` (its AOT compile), stopping
  at ``Lowered``.
* ``train_compile.get_shaped_inputs`` builds the state with ``nnx.eval_shape``,
  so only ShapeDtypeStructs exist and llama3-8b at full depth lowers on a
  small CPU box.
* NNX is the only train step in MaxText 0.2.5 (``maxtext_config`` selects it where an older MaxText has a
  choice), and the lowered state is checked to be an ``nnx.State``.
* Accelerators: the mesh is built over the devices ``hlo_audit.platforms`` gives
  the cell and the step is lowered for the requested platform with
  ``jitted.trace(...).lower(lowering_platforms=(platform,))``; no GPU/TPU is
  needed. For most cells those are the host's own devices, and MaxText, which
  picks kernels from the devices it sees, resolves "autoselected" attention to
  the dot-product path. A TPU cell with a topology (v6e-4) gets that topology's
  compile-only devices from libtpu and MaxText's ``compile_topology`` settings,
  exactly as ``train_compile`` builds its mesh: MaxText then picks the TPU
  kernels (splash attention) and the step AOT-compiles on a CPU host. A named
  GPU (h100, 8xh100) gets compile-only CUDA devices from jax's CUDA plugin,
  and, for more than one, MaxText's GPU system ``a3`` as its compile_topology
  (MaxText sizes the global batch by it). The stage compiles inside the mesh,
  as ``train_compile`` does: Transformer Engine's partitioning callbacks, which
  XLA calls during the compile, read the mesh from jax's context.
  Transformer Engine cells lower inside ``te.cross_lowering`` (targets/te.py):
  TE loaded and answering the cell's GPU architecture; the recipe is MaxText's
  own table's. The lowered step is then taken to the cell's stage
  (``hlo_audit.stages``).
* The PRNG implementation is left at JAX's default (threefry, keys lower as
  ``u32[2]``). MaxText's train/train_compile switch it to ``unsafe_rbg``
  process-wide (keys ``u32[4]``); a library must not change global state.
* MaxText's config system, its errors and its import noise are handled in
  ``maxtext_config``, which MaxEngine's inference steps (``maxengine``) share.
"""

from __future__ import annotations

import contextlib

import jax

from hlo_audit import host, platforms
from hlo_audit.capture import captured_arrays
from hlo_audit.hlo.constants import CapturedArray
from hlo_audit.lowering import Unavailable
from hlo_audit.stages import to_stage
from hlo_audit.targets import te
from hlo_audit.targets.maxengine import lower_inference_step
from hlo_audit.targets.maxtext_config import (
    MaxTextConfigError,
    captured_stdout,
    hyperparameters,
    load_maxtext,
    maxtext_version,
    model_num_layers,
    platform_settings,
    target_mesh_sizes,
    train_settings,
    trainer_jax_flags,
)
from hlo_audit.targets.vocab import is_transformer_engine

__all__ = [
    "MaxTextConfigError",
    "TRAIN_STEP_ARG_NAMES",
    "MaxTextTarget",
    "lower_cell",
    "lower_train_step",
]

# Names of the positional arguments of the lowered step, i.e. of MaxText's
# train.train_step(model, config, state_mesh_shardings, params_shardings,
# state, data) after the first four are bound. JAX names entry parameters
# after them (state__model____decoder..., data__inputs__).
TRAIN_STEP_ARG_NAMES = ("state", "data")


def lower_train_step(
    model: str,
    *,
    scan_layers: bool,
    quantization: str = "",
    num_layers: int | None = None,
    per_device_batch_size: int = 1,
    max_target_length: int = 128,
    platform: str = "cpu",
    overrides: dict[str, str] | None = None,
    devices: list | None = None,
) -> jax.stages.Lowered:
    """Lower MaxText's NNX train step for one configuration, for `platform`.

    `quantization` "" or "none" means unquantized; `num_layers` None means the
    model's full depth; `overrides` are further MaxText config keys (strings,
    as on MaxText's command line) and win over everything else; `devices` the
    mesh's devices (default: the host's). Raises MaxTextConfigError when
    MaxText rejects the configuration.
    """
    cell_settings = train_settings(
        model,
        scan_layers=scan_layers,
        quantization=quantization,
        num_layers=num_layers,
        per_device_batch_size=per_device_batch_size,
        max_target_length=max_target_length,
        overrides=overrides,
    )
    return _lower_train_step(cell_settings, platform, devices)[0]


def _lower_train_step(cell_settings: dict[str, str], platform: str, devices: list | None = None,
                      ) -> tuple[jax.stages.Lowered, tuple[CapturedArray, ...], object, dict[str, int | None]]:
    """The lowered train step, the arrays it closes over (none that are state, in MaxText 0.2.5), its mesh and the
    sizes the config gives the target mesh (``target_mesh_sizes``)."""
    config = hyperparameters(cell_settings)
    with trainer_jax_flags(config):
        mesh = load_maxtext().maxtext_utils.get_mesh_from_config(config, devices or jax.devices())
        step, args, jit_kwargs = _train_step_and_args(config, mesh)
        _check_nnx_state(args[0])
        return (*_lower(step, args, jit_kwargs, config, mesh, platform), mesh, target_mesh_sizes(config))


def lower_cell(cell) -> tuple[jax.stages.Lowered, tuple[CapturedArray, ...], object, dict[str, int | None] | None]:
    """A matrix cell's step (train, or MaxEngine's prefill / generate / insert), lowered for the devices of its
    platform, the arrays it closes over, the train step's mesh and the sizes its config gives the target mesh (None
    for an inference step)."""
    overrides = {**platform_settings(cell), **dict(cell.overrides)}
    if cell.is_inference:
        return (*lower_inference_step(
            cell.model, cell.step, scan_layers=cell.scan, quantization=cell.quant, quant_mode=cell.quant_mode,
            num_layers=cell.layers, per_device_batch_size=cell.batch, max_target_length=cell.seq,
            max_prefill_length=cell.prefill, platform=cell.platform, overrides=overrides), None, None)
    cell_settings = train_settings(cell.model, scan_layers=cell.scan, quantization=cell.quant,
                                   num_layers=cell.layers, per_device_batch_size=cell.batch,
                                   max_target_length=cell.seq, overrides=overrides)
    return _lower_train_step(cell_settings, cell.platform, platforms.devices(cell))


def _train_step_and_args(config, mesh):
    """The functional train step, its abstract (state, batch) and its jit arguments."""
    mt = load_maxtext()
    args, _kwargs, state_shardings, _annotations, graphdef = mt.train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = mt.sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    input_state_shardings = mt.sharding.build_zero1_input_state_mesh_shardings(
        config, state_shardings, params_shardings
    )
    data_sharding = mt.sharding.get_input_data_sharding(config, mesh)
    step, in_shardings, out_shardings, static_argnums, donate_argnums = (
        mt.maxtext_utils.get_functional_train_with_signature(
            mt.train.train_step, data_sharding, input_state_shardings, graphdef, config, params_shardings
        )
    )
    jit_kwargs = {
        "in_shardings": in_shardings,
        "out_shardings": out_shardings,
        "static_argnums": static_argnums,
        "donate_argnums": donate_argnums,
    }
    return step, args, jit_kwargs


def _check_nnx_state(state) -> None:
    """Fail loudly if MaxText handed us anything but an NNX train state."""
    from flax import nnx  # noqa: PLC0415

    if not isinstance(state, nnx.State):
        raise TypeError(f"expected MaxText's NNX train state, got {type(state).__name__}")


def _lower(step, args, jit_kwargs, config, mesh, platform: str) -> tuple[jax.stages.Lowered, tuple[CapturedArray, ...]]:
    """jit + lower under MaxText's mesh and logical axis rules, as train_compile does."""
    from flax.core.spmd import logical_axis_rules  # noqa: PLC0415

    with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
        traced = jax.jit(step, **jit_kwargs).trace(*args)
        return traced.lower(lowering_platforms=(platform,)), captured_arrays(traced)


# --------------------------------------------------------------------------------------------------------------
# The matrix target
# --------------------------------------------------------------------------------------------------------------

class MaxTextTarget:
    """Cells lowered through MaxText's own config system and train step."""

    name = "maxtext"
    code_under_test = ("maxtext",)  # its files keyed by content even when installed from a wheel (hlo_audit.cache)

    def check_available(self, cell) -> None:
        platform = platforms.of(cell)
        if cell.is_inference and platform.has_own_devices(cell):
            raise Unavailable(f"MaxEngine steps lower for the host's own devices only so far, not a "
                              f"{platform.device_word}'s")
        te.check_available(cell)
        platform.check_available(cell)

    def lower(self, cell):
        self.check_available(cell)
        with te.cross_lowering(cell, te_recipe) as notes:
            lowered, captured, mesh, mesh_sizes = lower_cell(cell)
            # Inside the mesh, as train_compile compiles (TE's partitioning callbacks read it during the compile).
            with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
                return to_stage(lowered, cell, captured, note="; ".join(notes), mesh_sizes=mesh_sizes)

    def full_depth(self, model: str) -> int:
        return model_num_layers(model)

    def preload(self) -> None:
        """MaxText's modules, imported once in the target process before its cells' processes fork from it (every
        cell's lowering imports the same ones: what their import reads is every cell's)."""
        load_maxtext()

    def versions(self, cell) -> dict[str, str]:
        versions = {"maxtext": maxtext_version()}
        if is_transformer_engine(cell.quant):
            versions["transformer-engine-jax"] = host.installed_version("transformer-engine-jax")
        return versions


def te_recipe(quant: str):
    """The Transformer Engine recipe MaxText builds for ``quant`` (None for te_no_quant): MaxText's own table."""
    with captured_stdout():
        from maxtext.layers.quantizations import TransformerEngineQuantization  # noqa: PLC0415

    return TransformerEngineQuantization._get_recipe(quant)  # noqa: SLF001
