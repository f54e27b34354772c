"""Smoke tests for tests/nnx_models.py: real NNX train steps lower; their entry parameters are what the state says."""

import collections
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # works under any pytest import mode

import nnx_models as nm
from nnx_models import ModelSpec

# Exploration-grade regex, independent of hlo_audit's parser: entry parameters of jax's printer (no '%') or of an
# XLA dump ('%name', trailing metadata).
_PARAM = re.compile(r"^\s*%?(\S+) = (\w+)\[([^\]]*)\]\S* parameter\((\d+)\)", re.M)


def entry_params(text: str) -> list[tuple[str, str, str, int]]:
    start = text.index("\nENTRY")
    entry = text[start : text.index("\n}", start)]
    return [(name, dtype, dims, int(n)) for name, dtype, dims, n in _PARAM.findall(entry)]


def by_dtype(params) -> dict[str, int]:
    return dict(collections.Counter(p[1] for p in params))


def formula(spec: ModelSpec) -> dict[str, int]:
    """Entry parameters by dtype, by hand: Linear kernel+bias per layer (bridge: + Dense kernel+bias), x; RNG
    streams are 2 leaves each (key, count): top-level Rngs 2 streams, Dropout 1 fork, ToNNX 2 forks, per layer;
    scanned, 'per layer' is once (stacked on a leading axis)."""
    per = 1 if spec.scan else spec.layers
    f32 = 2 * per + (2 * per if spec.bridge else 0) + 1
    u32 = 0
    if spec.rngs:
        u32 += 4
        if spec.dropout_rate is not None:
            u32 += 2 * per
        if spec.bridge:
            u32 += 4 * per
    return {k: v for k, v in {"f32": f32, "u32": u32}.items() if v}


SPECS = [
    ModelSpec(),
    ModelSpec(layers=3, scan=True),
    ModelSpec(dropout_rate=0.0),
    ModelSpec(layers=3, dropout_rate=0.5),
    ModelSpec(layers=3, dropout_rate=0.5, scan=True),
    ModelSpec(rngs=False),
    ModelSpec(rngs=False, dropout_rate=0.0, scan=True),
    ModelSpec(bridge="draws"),
    ModelSpec(layers=3, bridge="nodraw", scan=True),
]


@pytest.mark.parametrize("spec", SPECS, ids=nm.spec_name)
def test_entry_params_match_state_and_formula(spec):
    params = entry_params(nm.hlo_text(spec))
    expected = nm.expected_counts(spec)
    assert {k: expected[k] for k in ("f32", "u32") if k in expected} == formula(spec)
    assert by_dtype(params) == formula(spec)
    assert len(params) == expected["total"]
    assert sorted(p[3] for p in params) == list(range(len(params)))


def test_unrolled_pays_rng_state_per_layer_scanned_once():
    def u32(spec):
        return by_dtype(entry_params(nm.hlo_text(spec))).get("u32", 0)

    assert u32(ModelSpec(layers=4, dropout_rate=0.5)) - u32(ModelSpec(layers=2, dropout_rate=0.5)) == 4
    scanned = [u32(ModelSpec(layers=n, dropout_rate=0.5, scan=True)) for n in (2, 4)]
    assert scanned[0] == scanned[1] == 6
    assert u32(ModelSpec(layers=4)) == u32(ModelSpec(layers=2)) == 4  # a shared top-level Rngs is paid once


def test_rng_parameter_names_and_shapes():
    unrolled = {p[0]: (p[1], p[2]) for p in entry_params(nm.hlo_text(ModelSpec(dropout_rate=0.5)))}
    assert unrolled["state__layers_1____dropout____rngs____key___value.1"] == ("u32", "2")
    assert unrolled["state__layers_1____dropout____rngs____count___value.1"] == ("u32", "")
    assert unrolled["state__layers_0____linear____kernel___value.1"] == ("f32", "8,8")
    assert unrolled["x.1"] == ("f32", "4,8")
    scanned = {p[0]: (p[1], p[2]) for p in entry_params(nm.hlo_text(ModelSpec(layers=3, dropout_rate=0.5, scan=True)))}
    assert scanned["state__layers____dropout____rngs____key___value.1"] == ("u32", "3,2")
    assert scanned["state__layers____dropout____rngs____count___value.1"] == ("u32", "3")
    assert scanned["state__layers____linear____kernel___value.1"] == ("f32", "3,8,8")


def test_counts_advance_only_where_something_draws():
    inc = re.compile(r"= u32\[\] add\((state__\S+____count___value\.1), constant\.\d+\)")
    assert inc.findall(nm.hlo_text(ModelSpec(dropout_rate=0.0))) == []
    assert sorted(inc.findall(nm.hlo_text(ModelSpec(dropout_rate=0.5)))) == [
        "state__layers_0____dropout____rngs____count___value.1",
        "state__layers_1____dropout____rngs____count___value.1",
    ]
    # ToNNX pulls a key from every stream it holds on each call, even when the Linen module never uses it.
    nodraw = nm.hlo_text(ModelSpec(bridge="nodraw"))
    assert len(inc.findall(nodraw)) == 4
    assert "threefry2x32" not in nodraw


def test_spec_validation():
    with pytest.raises(ValueError):
        ModelSpec(bridge="sometimes")
    with pytest.raises(ValueError):
        ModelSpec(rngs=False, dropout_rate=0.5)
    with pytest.raises(ValueError):
        ModelSpec(rngs=False, bridge="nodraw")


def test_write_dump_holds_the_train_step(tmp_path):
    spec = ModelSpec(layers=1, dropout_rate=0.5)
    folder = nm.write_dump(spec, tmp_path / "dump")
    assert folder == (tmp_path / "dump").resolve()
    before = sorted(folder.glob(f"module_*.jit_{nm.STEP_NAME}.before_optimizations.txt"))
    after = sorted(folder.glob(f"module_*.jit_{nm.STEP_NAME}.cpu_after_optimizations.txt"))
    assert len(before) == 1 and len(after) == 1
    ours = entry_params(nm.hlo_text(spec))
    for dumped in (before[0], after[0]):
        got = entry_params(dumped.read_text())
        assert [(p[0], p[1], p[2], p[3]) for p in sorted(got, key=lambda p: p[3])] == sorted(ours, key=lambda p: p[3])
