"""MaxText's config system as the MaxText targets (train step: ``maxtext.py``; inference steps: ``maxengine.py``)
use it: one cell's settings, MaxText's own validation of them, and the import of MaxText with its noise contained.

* Config errors: ``pyconfig.initialize`` logs a banner, writes /dev/termination-log and may ``sys.exit(2)``. Its
  body, ``pyconfig._initialize_pydantic`` + ``HyperParameters``, is called instead, and what it raises becomes a
  one-line ``MaxTextConfigError``.
* Importing MaxText prints "[NO-OP] ... using stub" lines on stdout and transformers warns on stderr. The import
  runs with stdout captured (shown again, as an exception note, only if the import fails) and with transformers'
  verbosity defaulted to "error" (an explicit TRANSFORMERS_VERBOSITY wins).
* Optional Google Cloud packages (JetStream, GCS, goodput measurement, Cloud Monitoring, Vertex TensorBoard): a
  lowering never serves, uploads or monitors, so MaxText runs decoupled from them (``DECOUPLE_GCLOUD=TRUE``,
  MaxText's own switch in ``maxtext/common/gcloud_stub.py``; an explicit value wins). The released 0.2.5 falls back
  to its stubs when they are missing; MaxText from its GitHub tree (e591f30) raises instead unless decoupled, so this
  is the one place both are handled alike.
* NNX: MaxText 0.2.5 has no switch left -- ``enable_nnx`` / ``pure_nnx`` / ``pure_nnx_decoder`` were removed and
  NNX is the only train step (passing ``pure_nnx=True`` is now a config error). Should a MaxText that still has
  those fields be installed, they are set to True (``_nnx_settings``).
* The two JAX flags MaxText's trainer sets from the config (shardy, size-one mesh axes) are applied only for the
  duration of a lowering (``trainer_jax_flags``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import os
import pathlib
import sys
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import jax
import pydantic
import yaml

from hlo_audit import host, platforms
from hlo_audit.lowering import CellConfigError, one_line

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell

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
    return host.installed_version("maxtext")



@functools.cache
def load_maxtext() -> types.SimpleNamespace:
    """Import the MaxText modules used here, once, with their import noise contained."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")  # see the module doc: no cloud integration is ever called
    # MaxText's config loading logs absl warnings (tokenizer paths...) that say nothing about the HLO.
    from absl import logging as absl_logging  # noqa: PLC0415

    absl_logging.set_verbosity(absl_logging.ERROR)
    logging.getLogger("maxtext").setLevel(logging.ERROR)  # "AQT quantization is deprecated", per cell
    warnings.filterwarnings("ignore", message="The function dot_general_with_precision", category=UserWarning)
    with captured_stdout():
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
def captured_stdout() -> Iterator[None]:
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
        needs = "" if sys.version_info >= (3, 12) else "; MaxText needs Python >= 3.12"
        raise MaxTextConfigError(f"maxtext is not installed (pip install 'hlo-audit[maxtext]'{needs})")
    configs = pathlib.Path(spec.submodule_search_locations[0]) / "configs"
    model_yml = configs / "models" / f"{model}.yml"
    if not model_yml.is_file():
        config = hyperparameters(train_settings(model, scan_layers=True, quantization=""))  # MaxText's own error
        return int(config.base_num_decoder_layers)
    for source in (model_yml, configs / "base.yml"):
        value = (yaml.safe_load(source.read_text()) or {}).get("base_num_decoder_layers")
        if value is not None:
            return int(value)
    raise MaxTextConfigError(f"{model}: no base_num_decoder_layers in {model_yml.name} or base.yml")


def platform_settings(cell: Cell) -> dict[str, str]:
    """MaxText's own keys for the cell's devices: a TPU topology is train_compile's compile_topology, which
    MaxText also sizes the global batch and the mesh's -1 axes by."""
    topology = platforms.of(cell).mesh_topology(cell)
    if topology is None:
        return {}
    name, slices = topology
    return {"compile_topology": name, "compile_topology_num_slices": str(slices)}


def train_settings(
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


def hyperparameters(settings: dict[str, str]):
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


def target_mesh_sizes(config) -> dict[str, int | None]:
    """The size of each of MaxText's mesh axes on the target, from the config alone (``hlo.mesh``): its ICI
    parallelism, times its DCN parallelism across slices; None for ``-1`` (the rest of the devices: how many the
    target has is not the host's one). What ``create_device_mesh`` makes of the same lists on the target's devices."""
    slices = max(int(getattr(config, "num_slices", 1) or 1), 1)
    sizes: dict[str, int | None] = {}
    for axis, ici, dcn in zip(config.mesh_axes, config.ici_parallelism, config.dcn_parallelism, strict=True):
        across = dcn if slices > 1 else 1  # one slice: the DCN lists are filled to 1 (fill_unspecified_mesh_axes)
        sizes[axis] = None if -1 in (ici, across) else int(ici) * int(across)
    return sizes


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
def trainer_jax_flags(config) -> Iterator[None]:
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
