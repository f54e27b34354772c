#!/bin/bash
# Issue 33 on a real TPU chip (the `device` tool's tpu-v5e machine: Python 3.11, jax 0.10.2, libtpu 0.0.42.1).
# From the repository root:   bash scripts/chip_measure.sh        (writes under $OUT; LAYERS=16 for issue 33's depth)
#
# 1. installs what the machine lacks from its own package index (flax, optax, typer, rich, pandas and what they
#    need), beside the machine's jax, never over it;
# 2. compiles the v5e-1 cells of scripts/chip/v5e.toml deviceless (a compile-only topology, JAX_PLATFORMS=cpu), the
#    project's own `hlo-audit lower`, in a process that never opens the chip;
# 3. runs `hlo-audit measure` on the chip for the seeds' table (scripts/chip/measure.toml: scan on/off x clean/leak,
#    nnx.jit and jax.jit; blocked, queued, host per call, compile, memory), JSON and table, and keeps the chip's
#    compiled modules;
# 4. diffs the chip's compile of each jax.jit cell against the deviceless one, and counts RNG increments in the
#    chip's scanned leak module.
# $OUT gets (at most 8 files): setup.log, measure.json, measure.log, texts.tar.xz (chip and deviceless modules),
# checks.txt (diff and rng outputs). Settings (environment): LAYERS (8), ROUNDS (3), CALLS (15), MEASURE_SECONDS
# (420); for a dry run elsewhere: PYTHON, SKIP_INSTALL=1, MEASURE_CONFIG, V5E_CONFIG, SIZE (b2s1024: the cells'
# batch and sequence as ids spell them).
set -o pipefail
export PYTHONUNBUFFERED=1 PIP_CONFIG_FILE=/dev/null TF_CPP_MIN_LOG_LEVEL=1
START=$(date +%s)
LAYERS=${LAYERS:-8}
PY=${PYTHON:-python3}
MEASURE_CONFIG=${MEASURE_CONFIG:-scripts/chip/measure.toml}
V5E_CONFIG=${V5E_CONFIG:-scripts/chip/v5e.toml}
SIZE=${SIZE:-b2s1024}
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
rm -rf /tmp/chip /tmp/deviceless
mkdir -p "$OUT" /tmp/site /tmp/chip /tmp/deviceless
elapsed() { echo "[$(( $(date +%s) - START )) s] $*"; }

install() {
elapsed "machine: $(nproc) cores, $($PY -c 'import sys, jax; print(sys.version.split()[0], "jax", jax.__version__)')"
# What to install: pip resolves flax, optax and hlo-audit's own needs against the machine's jax (pinned), and
# everything but what the machine brings (jax, jaxlib, libtpu, numpy, scipy...) is installed without dependencies.
JAX_VERSION=$($PY -c 'import jax; print(jax.__version__)')
INDEX="$PY -m pip install --isolated --only-binary=:all: --index-url file:///opt/pypi/simple"
$INDEX -q --dry-run --ignore-installed --report /tmp/resolved.json flax optax typer rich pandas \
    "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" > /tmp/resolve.log 2>&1 || { tail -5 /tmp/resolve.log; exit 2; }
$PY - > /tmp/pins.txt <<'PY'
import json
MACHINE = {"jax", "jaxlib", "libtpu", "libtpu-nightly", "numpy", "scipy", "ml-dtypes", "ml_dtypes", "opt-einsum",
           "opt_einsum"}
for item in json.load(open("/tmp/resolved.json"))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower() not in MACHINE:
        print(f"{name}=={version}")
PY
tr '\n' ' ' < /tmp/pins.txt; echo
$INDEX -q --no-deps --target /tmp/site -r /tmp/pins.txt 2>&1 | grep -v -i notice
elapsed "installed"
}
if [ -z "$SKIP_INSTALL" ]; then install 2>&1 | tee "$OUT/setup.log"; fi
# MaxText names TPU topologies (hlo_audit.platforms.tpu reads its table); the chip's index has no MaxText, so the
# one entry this run compiles for is written here, as MaxText 0.2.5 spells it.
mkdir -p /tmp/site/maxtext/utils
touch /tmp/site/maxtext/__init__.py /tmp/site/maxtext/utils/__init__.py
cat > /tmp/site/maxtext/utils/accelerator_to_spec_map.py <<'PY'
from dataclasses import dataclass


@dataclass(frozen=True)
class SystemCharacteristics:
    platform: str
    topology_name: str
    chip_config_name: str
    chips_per_host_bounds: tuple
    devices_per_slice: int
    wrap: tuple


UserFacingNameToSystemCharacteristics = {
    "v5e-1": SystemCharacteristics("tpu", "v5e:1x1", "default", (1, 1, 1), 1, (False, False, False)),
}
PY

export PYTHONPATH=$REPO:$PYTHONPATH:/tmp/site
HLO="$PY -m hlo_audit"

# 2. Deviceless: the v5e-1 cells, compiled for a compile-only topology in a process that never opens the chip.
{
for cell in jaxjit/scan-on/none jaxjit/scan-on/leak; do
    id="$cell/L$LAYERS/tpu-v5e-1/compiled/$SIZE"
    JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 ALLOW_MULTIPLE_LIBTPU_LOAD=1 timeout 240 \
        $HLO lower "$id" --config "$V5E_CONFIG" --no-cache -o "/tmp/deviceless/${cell//\//__}.hlo.txt"
    elapsed "deviceless $id: rc $?"
done
} 2>&1 | tee -a "$OUT/setup.log"

# 3. The chip: the seeds' table.
elapsed "measure (layers $LAYERS)" | tee "$OUT/measure.log"
timeout "${MEASURE_SECONDS:-420}" $HLO measure --config "$MEASURE_CONFIG" --layers "$LAYERS" \
    --rounds "${ROUNDS:-3}" --calls "${CALLS:-15}" --warmup 3 --host-calls 30 --save-compiled /tmp/chip \
    --format json > "$OUT/measure.json" 2>> "$OUT/measure.log"
elapsed "measure rc $?" | tee -a "$OUT/measure.log"

# 4. Checks on what came back: the chip's compile against the deviceless one, RNG increments in the scanned leak.
{
for cell in jaxjit/scan-on/none jaxjit/scan-on/leak; do
    chip="/tmp/chip/${cell//\//__}__L${LAYERS}__$SIZE.hlo.txt"
    echo "== diff $cell (chip, deviceless)"
    JAX_PLATFORMS=cpu $HLO diff "$chip" "/tmp/deviceless/${cell//\//__}.hlo.txt"
    echo "exit $?"
done
echo "== rng of the chip's scanned leak"
JAX_PLATFORMS=cpu $HLO rng "/tmp/chip/jaxjit__scan-on__leak__L${LAYERS}__$SIZE.hlo.txt"
echo "exit $?"
} > "$OUT/checks.txt" 2>&1
tar -C /tmp -cJf "$OUT/texts.tar.xz" chip deviceless
ls -la "$OUT"
elapsed "done"
