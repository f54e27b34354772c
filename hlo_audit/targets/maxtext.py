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
* NNX: MaxText 0.2.5 has no switch left -- ``enable_nnx`` / ``pure_nnx`` /
  ``pure_nnx_decoder`` were removed and NNX is the only train step (passing
  ``pure_nnx=True`` is now a config error). Should a MaxText that still has
  those fields be installed, they are set to True (``_nnx_settings``), and the
  lowered state is checked to be an ``nnx.State`` either way.
* Accelerators: the mesh is built over the devices ``hlo_audit.platforms`` gives
  the cell and the step is lowered for the requested platform with
  ``jitted.trace(...).lower(lowering_platforms=(platform,))``; no GPU/TPU is
  needed. For most cells those are the host's own devices, and MaxText, which
  picks kernels from the devices it sees, resolves "autoselected" attention to
  the dot-product path. A TPU cell with a topology (v6e-4) gets that topology's
  compile-only devices from libtpu and MaxText's ``compile_topology`` settings,
  exactly as ``train_compile`` builds its mesh: MaxText then picks the TPU
  kernels (splash attention) and the step AOT-compiles on a CPU host.
  Transformer Engine cells lower inside ``te.cross_lowering`` (targets/te.py):
  TE loaded and answering the cell's ``cuda_arch``; the recipe is MaxText's
  own table's.
* The PRNG implementation is left at JAX's default (threefry, keys lower as
  ``u32[2]``). MaxText's train/train_compile switch it to ``unsafe_rbg``
  process-wide (keys ``u32[4]``); a library must not change global state.
  The two JAX flags MaxText's trainer sets from the config (shardy,
  size-one mesh axes) are applied only for the duration of the lowering.
* Config errors: ``pyconfig.initialize`` logs a banner, writes
  /dev/termination-log and may ``sys.exit(2)``. Its body,
  ``pyconfig._initialize_pydantic`` + ``HyperParameters``, is called instead,
  and what it raises becomes a one-line ``MaxTextConfigError``.
* Importing MaxText prints "[NO-OP] ... using stub" lines on stdout and
  transformers warns on stderr. The import runs with stdout captured (shown
  again, as an exception note, only if the import fails) and with transformers'
  verbosity defaulted to "error" (an explicit TRANSFORMERS_VERBOSITY wins).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import logging
import os
import pathlib
import types
import warnings
from collections.abc import Iterator
from importlib import metadata

import jax
import pydantic
import yaml

from hlo_audit import platforms
from hlo_audit.capture import captured_arrays
from hlo_audit.hlo.constants import CapturedArray
from hlo_audit.targets import te
from hlo_audit.targets.base import CellConfigError, Lowering, Unavailable, one_line

__all__ = [
    "MaxTextConfigError",
    "TRAIN_STEP_ARG_NAMES",
    "load_maxtext",
    "lower_cell",
    "lower_train_step",
    "maxtext_version",
    "model_num_layers",
]

# Names of the positional arguments of the lowered step, i.e. of MaxText's
# train.train_step(model, config, state_mesh_shardings, params_shardings,
# state, data) after the first four are bound. JAX names entry parameters
# after them (state__model____decoder..., data__inputs__).
TRAIN_STEP_ARG_NAMES = ("state", "data")

# Flags that selected the NNX step in MaxText versions that had a choice.
_NNX_FLAGS = ("enable_nnx", "pure_nnx", "pure_nnx_decoder")

# Settings that keep MaxText from touching anything outside the lowering:
# no jax.distributed, no persistent compilation cache, no config dump.
_QUIET_SETTINGS = {
    "skip_jax_distributed_system": "True",
    "jax_cache_dir": "",
    "log_config": "False",
}


class MaxTextConfigError(CellConfigError):
    """MaxText rejected the configuration; the message is MaxText's, on one line."""


def maxtext_version() -> str:
    """Version of the installed maxtext distribution (without importing it)."""
    return metadata.version("maxtext")


@functools.cache
def load_maxtext() -> types.SimpleNamespace:
    """Import the MaxText modules used here, once, with their import noise contained."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # MaxText's config loading logs absl warnings (tokenizer paths...) that say nothing about the HLO.
    from absl import logging as absl_logging  # noqa: PLC0415

    absl_logging.set_verbosity(absl_logging.ERROR)
    logging.getLogger("maxtext").setLevel(logging.ERROR)  # "AQT quantization is deprecated", per cell
    warnings.filterwarnings("ignore", message="The function dot_general_with_precision", category=UserWarning)
    with _captured_stdout():
        from maxtext.configs import pyconfig  # noqa: PLC0415 (heavy, import on demand)
        from maxtext.trainers.pre_train import train, train_compile  # noqa: PLC0415
        from maxtext.utils import maxtext_utils, sharding  # noqa: PLC0415
    return types.SimpleNamespace(
        pyconfig=pyconfig,
        train=train,
        train_compile=train_compile,
        maxtext_utils=maxtext_utils,
        sharding=sharding,
    )


@contextlib.contextmanager
def _captured_stdout() -> Iterator[None]:
    """Swallow stdout; if the block raises, attach what was printed to the error."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    except BaseException as error:
        if buffer.getvalue():
            error.add_note("output while importing MaxText:\n" + buffer.getvalue().rstrip())
        raise


@functools.cache
def model_num_layers(model: str) -> int:
    """Full-depth decoder layer count of a MaxText model name (llama3-8b -> 32).

    Read from the model's own yml beside MaxText's base.yml: asking MaxText's config system would import
    all of MaxText (~8 s), which a cached re-run must not pay just to draw a projection.
    """
    spec = importlib.util.find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        raise MaxTextConfigError("maxtext is not installed (pip install '.[maxtext]')")
    configs = pathlib.Path(spec.submodule_search_locations[0]) / "configs"
    model_yml = configs / "models" / f"{model}.yml"
    if not model_yml.is_file():
        config = _config(_settings(model, scan_layers=True, quantization=""))  # MaxText's own error
        return int(config.base_num_decoder_layers)
    for source in (model_yml, configs / "base.yml"):
        value = (yaml.safe_load(source.read_text()) or {}).get("base_num_decoder_layers")
        if value is not None:
            return int(value)
    raise MaxTextConfigError(f"{model}: no base_num_decoder_layers in {model_yml.name} or base.yml")


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
    settings = _settings(
        model,
        scan_layers=scan_layers,
        quantization=quantization,
        num_layers=num_layers,
        per_device_batch_size=per_device_batch_size,
        max_target_length=max_target_length,
        overrides=overrides,
    )
    return _lower_train_step(settings, platform, devices)[0]


def _lower_train_step(settings: dict[str, str], platform: str,
                      devices: list | None = None) -> tuple[jax.stages.Lowered, tuple[CapturedArray, ...]]:
    """The lowered train step and the arrays it closes over (none that are state, in MaxText 0.2.5)."""
    config = _config(settings)
    with _trainer_jax_flags(config):
        mesh = load_maxtext().maxtext_utils.get_mesh_from_config(config, devices or jax.devices())
        step, args, jit_kwargs = _train_step_and_args(config, mesh)
        _check_nnx_state(args[0])
        return _lower(step, args, jit_kwargs, config, mesh, platform)


def lower_cell(cell) -> tuple[jax.stages.Lowered, tuple[CapturedArray, ...]]:
    """A matrix cell's step (train, or MaxEngine's prefill / generate / insert), lowered for the devices of its
    platform, and the arrays it closes over."""
    overrides = {**_platform_settings(cell), **dict(cell.overrides)}
    if cell.is_inference:
        from hlo_audit.targets.maxengine import lower_inference_step  # noqa: PLC0415 (only inference cells need it)

        return lower_inference_step(
            cell.model, cell.step, scan_layers=cell.scan, quantization=cell.quant, quant_mode=cell.quant_mode,
            num_layers=cell.layers, per_device_batch_size=cell.batch, max_target_length=cell.seq,
            max_prefill_length=cell.prefill, platform=cell.platform, overrides=overrides)
    settings = _settings(cell.model, scan_layers=cell.scan, quantization=cell.quant, num_layers=cell.layers,
                         per_device_batch_size=cell.batch, max_target_length=cell.seq, overrides=overrides)
    return _lower_train_step(settings, cell.platform, platforms.devices(cell))


def _platform_settings(cell) -> dict[str, str]:
    """MaxText's own keys for the cell's devices: a TPU topology is train_compile's compile_topology, which
    MaxText also sizes the global batch and the mesh's -1 axes by."""
    if platforms.uses_topology(cell):
        return {"compile_topology": cell.topology, "compile_topology_num_slices": "1"}
    return {}


def _settings(
    model: str,
    *,
    scan_layers: bool,
    quantization: str,
    num_layers: int | None = None,
    per_device_batch_size: int = 1,
    max_target_length: int = 128,
    overrides: dict[str, str] | None = None,
) -> dict[str, str]:
    """MaxText config keys for one cell, as key -> command-line value."""
    settings = {
        "model_name": model,
        "override_model_config": "True",
        "scan_layers": str(bool(scan_layers)),
        "per_device_batch_size": str(per_device_batch_size),
        "max_target_length": str(max_target_length),
        "dataset_type": "synthetic",
        "enable_checkpointing": "False",
        "quantization": "" if quantization.lower() in ("", "none") else quantization,
        **_QUIET_SETTINGS,
        **_nnx_settings(),
    }
    if num_layers is not None:
        settings["base_num_decoder_layers"] = str(num_layers)
    settings.update(overrides or {})
    return settings


def _nnx_settings() -> dict[str, str]:
    """Select the NNX step where this MaxText still offers a choice (0.2.5 does not)."""
    fields = load_maxtext().pyconfig.types.MaxTextConfig.model_fields
    return {flag: "True" for flag in _NNX_FLAGS if flag in fields}


def _config(settings: dict[str, str]):
    """MaxText's HyperParameters for base.yml + the model's yml + `settings`."""
    pyconfig = load_maxtext().pyconfig
    base_yml = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
    argv = [None, base_yml, *(f"{key}={value}" for key, value in settings.items())]
    try:
        # pyconfig.initialize minus its exit/termination-log handler (see module doc).
        with _xla_flags_kept():
            return pyconfig.HyperParameters(pyconfig._initialize_pydantic(argv))  # noqa: SLF001
    except Exception as error:
        raise MaxTextConfigError(_one_line(error)) from error


_XLA_DEFAULT_FLAG = "--xla_dump_hlo_as_text=false"


@contextlib.contextmanager
def _xla_flags_kept() -> Iterator[None]:
    """Keep MaxText's config validation from setting XLA_FLAGS.

    When XLA_FLAGS is unset, that validation sets it to MaxText's ``dump_hlo`` defaults:
    ``--xla_dump_to=/tmp/xla_dump/ --xla_dump_large_constants --xla_dump_hlo_module_re=jit_train_step``. It then
    starts jax's backends, so XLA reads those flags for the rest of the process (and every process started from it).
    Every train step compiled afterwards was dumped to /tmp/xla_dump, ~5 MB a TPU compile; an XLA dump asked for
    elsewhere kept only modules named jit_train_step; and the flags joined the cache key of cells keyed later.
    Undoing the variable afterwards would be too late. So it is set, for the block only, to one flag at its default
    value: MaxText leaves a set XLA_FLAGS alone, and XLA reads nothing it would not have had anyway (it takes a
    blank value for a file name).
    """
    if os.environ.get("XLA_FLAGS"):
        yield  # MaxText keeps a user's flags as they are
        return
    saved = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = _XLA_DEFAULT_FLAG
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved


def _one_line(error: Exception) -> str:
    """MaxText's (or pydantic's) message for `error`, on one line."""
    if isinstance(error, pydantic.ValidationError):  # one entry per bad field
        return "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})" for e in error.errors()
        )
    return one_line(error)


@contextlib.contextmanager
def _trainer_jax_flags(config) -> Iterator[None]:
    """Set the JAX flags MaxText's trainer sets from its config, then restore them."""
    wanted = {
        "jax_use_shardy_partitioner": bool(config.shardy),
        "jax_remove_size_one_mesh_axis_from_type": bool(config.remove_size_one_mesh_axis_from_type),
    }
    saved = {name: getattr(jax.config, name) for name in wanted}
    try:
        for name, value in wanted.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


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

    def check_available(self, cell) -> None:
        if cell.is_inference and platforms.uses_topology(cell):
            raise Unavailable("MaxEngine steps lower for the host's own devices only so far, not a TPU topology's")
        te.check_available(cell)
        platforms.check_available(cell)

    def lower(self, cell):
        self.check_available(cell)
        with te.cross_lowering(cell, te_recipe) as notes:
            lowered, captured = lower_cell(cell)
            return Lowering.of(lowered, cell, captured, note="; ".join(notes))

    def full_depth(self, model: str) -> int:
        return model_num_layers(model)

    @functools.cache
    def fingerprint(self) -> str:
        """MaxText's installed sources and configs, plus this target's files: any edit invalidates cached cells."""
        digest = hashlib.sha256(maxtext_version().encode())
        here = pathlib.Path(__file__)
        # MaxEngine's steps, what a trace closes over, and the TE cells' environment and declaration are part of lowering.
        for own in (here, here.with_name("maxengine.py"), here.parent.parent / "capture.py", pathlib.Path(te.__file__)):
            digest.update(own.read_bytes())
        spec = importlib.util.find_spec("maxtext")
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(pathlib.Path(root).rglob("*")):
                if path.suffix in (".py", ".yml", ".yaml") and path.is_file():
                    digest.update(str(path.relative_to(root)).encode())
                    digest.update(path.read_bytes())
        return digest.hexdigest()[:16]


def te_recipe(quant: str):
    """The Transformer Engine recipe MaxText builds for ``quant`` (None for te_no_quant): MaxText's own table."""
    with _captured_stdout():
        from maxtext.layers.quantizations import TransformerEngineQuantization  # noqa: PLC0415

    return TransformerEngineQuantization._get_recipe(quant)  # noqa: SLF001

