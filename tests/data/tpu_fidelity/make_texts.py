"""Writes the TPU texts tests/test_fidelity_tpu.py reads, compiled for a TPU v5e chip (one chip, v5e:1x1):

* ``scanned``: a small scanned NNX train step (tests/nnx_models.py, ``SCANNED``: 6 layers, each with a ToNNX bridge
  whose two forked streams advance every call and a Dropout(0.0) that never draws): its module as jax lowers it
  (``scanned.lowered.hlo.txt``) and as the TPU compiler leaves it (``scanned.compiled.hlo.txt``);
* ``captured``: a step closing over a 2 MiB array of random values (state it captured) beside an embedding lookup
  and a bf16 matmul, whose compile holds XLA's own broadcasts of 0 and 1 (``captured.compiled.hlo.txt``).

  python tests/data/tpu_fidelity/make_texts.py deviceless OUT   compile-only devices from libtpu, on any host
  python tests/data/tpu_fidelity/make_texts.py chip OUT         the chip jax finds (a TPU v5e machine)

Run from the repository root (the committed texts: ``deviceless tests/data/tpu_fidelity``, jax 0.12.0.1, libtpu
0.0.52, flax 0.12.12; ``versions.json`` says so).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import sys

MODE, OUT = sys.argv[1], pathlib.Path(sys.argv[2])
if MODE == "deviceless":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # tests/
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository (hlo_audit.examples)
import nnx_models  # noqa: E402

SCANNED = nnx_models.ModelSpec(layers=6, scan=True, bridge="nodraw", dropout_rate=0.0)
VOCAB, WIDTH, TABLE = 4096, 512, (512, 1024)


def device():
    if MODE == "chip":
        return jax.devices()[0]
    from jax.experimental.topologies import get_topology_desc
    return get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                             chips_per_host_bounds=(1, 1, 1), num_slices=1, wrap=(False, False, False)).devices[0]


def scanned(sharding):
    abstract = nnx.eval_shape(lambda: nnx_models.build(SCANNED))
    graphdef, state = nnx.split(abstract)
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)  # noqa: E731
    x = jax.ShapeDtypeStruct((nnx_models.BATCH, SCANNED.width), jnp.float32, sharding=sharding)
    step = jax.jit(nnx_models.make_step(graphdef), donate_argnums=0, in_shardings=sharding, out_shardings=sharding)
    return step.lower(jax.tree.map(spec, state), x)


def captured(sharding):
    table = jnp.asarray(np.random.default_rng(0).standard_normal(TABLE).astype(np.float32))  # closed over

    def step(emb, w, tokens):
        def loss(emb, w):
            x = emb[tokens].astype(jnp.bfloat16)
            h = jnp.tanh(x @ w.astype(jnp.bfloat16)) @ table.astype(jnp.bfloat16)
            return jnp.mean(h.astype(jnp.float32) ** 2)
        value, (ge, gw) = jax.value_and_grad(loss, argnums=(0, 1))(emb, w)
        return emb - 0.1 * ge, w - 0.1 * gw, value

    args = (jax.ShapeDtypeStruct((VOCAB, WIDTH), jnp.float32, sharding=sharding),
            jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32, sharding=sharding),
            jax.ShapeDtypeStruct((8, 256), jnp.int32, sharding=sharding))
    return jax.jit(step, in_shardings=sharding, out_shardings=sharding).lower(*args)


def main() -> None:
    jax.clear_caches()
    sharding = SingleDeviceSharding(device())
    OUT.mkdir(parents=True, exist_ok=True)
    for name, lower in (("scanned", scanned), ("captured", captured)):
        lowered = lower(sharding)
        if name == "scanned":
            (OUT / f"{name}.lowered.hlo.txt").write_text(lowered.as_text(dialect="hlo"))
        (OUT / f"{name}.compiled.hlo.txt").write_text(lowered.compile().as_text())
    versions = {n: importlib.metadata.version(n) for n in ("jax", "jaxlib", "libtpu", "flax")}
    versions.update(mode=MODE, device_kind=sharding._device.device_kind)
    (OUT / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(versions)


if __name__ == "__main__":
    main()
