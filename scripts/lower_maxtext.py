#!/usr/bin/env python3
"""Lower MaxText's NNX train step for one configuration and write its HLO text.

    python scripts/lower_maxtext.py --model llama3-8b --scan off --quant int8 --layers 2 \\
        --out /tmp/hlo/llama3-8b_scan-off_int8_L2.hlo.txt --args-info-json /tmp/hlo/args.json

--args-info-json writes one record per flattened argument of the lowered step,
in order: {"path", "dtype", "shape", "parameter"}. dtype/shape are what the
HLO entry parameter holds (a PRNG key key<fry>[] is uint32[2]; its JAX dtype
is kept as "jax_dtype"). "parameter" is the entry parameter number, or null
where jit dropped the argument as unused (jit's default keep_unused=False), so
the list can be longer than the ENTRY parameter list; the script says by how much.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

from hlo_audit.attribution import key_name, parameter_numbers
from hlo_audit.hlo.text import parse_module
from hlo_audit.targets import maxtext, maxtext_config


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    maxtext_config.load_maxtext()
    imported = time.perf_counter()
    try:
        lowered = _lower(args)
    except maxtext.MaxTextConfigError as error:
        print(f"error: MaxText rejected the configuration: {error}", file=sys.stderr)
        return 2
    lowered_at = time.perf_counter()
    text = lowered.as_text(dialect="hlo")
    args.out.write_text(text)
    print(
        f"lowered {args.model} scan={args.scan} quant={args.quant} layers={args.layers or 'full'} "
        f"platform={args.platform} in {lowered_at - imported:.1f} s "
        f"(MaxText import {imported - started:.1f} s); {len(text.encode())} bytes -> {args.out}"
    )
    if args.args_info_json:
        records = arg_records(lowered)
        args.args_info_json.write_text(json.dumps(records, indent=1) + "\n")
        print(_check(records, text))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="MaxText model name, e.g. llama3-8b")
    parser.add_argument("--scan", required=True, choices=("on", "off"), help="scan_layers")
    parser.add_argument("--quant", default="none", help="MaxText quantization: none, int8, fp8, ...")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: full depth)")
    parser.add_argument("--batch", type=int, default=1, help="per_device_batch_size")
    parser.add_argument("--seq", type=int, default=128, help="max_target_length")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "cuda", "rocm", "tpu"))
    parser.add_argument(
        "--set", action="append", default=[], type=_key_value, metavar="KEY=VALUE", help="other MaxText config keys"
    )
    parser.add_argument("--out", type=pathlib.Path, required=True, help="HLO text file to write")
    parser.add_argument("--args-info-json", type=pathlib.Path, help="also write args_info as JSON")
    return parser


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not (key and sep):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
    return key, value


def _lower(args: argparse.Namespace) -> jax.stages.Lowered:
    overrides = dict(args.set)
    return maxtext.lower_train_step(
        args.model,
        scan_layers=args.scan == "on",
        quantization=args.quant,
        num_layers=args.layers,
        per_device_batch_size=args.batch,
        max_target_length=args.seq,
        platform=args.platform,
        overrides=overrides,
    )


def arg_records(lowered: jax.stages.Lowered) -> list[dict]:
    """One JSON-able record per flattened argument of `lowered`, in argument order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(lowered.args_info)
    numbers = parameter_numbers(lowered, len(leaves)) or [None] * len(leaves)
    return [_record(path, info, number) for (path, info), number in zip(leaves, numbers, strict=True)]


def _record(path, info, number: int | None) -> dict:
    physical = _physical(info)
    record = {
        "path": _dotted(path),
        "dtype": str(physical.dtype),
        "shape": list(physical.shape),
        "parameter": number,
    }
    if physical.dtype != info.dtype:
        record["jax_dtype"] = str(info.dtype)
    return record


def _physical(info) -> jax.ShapeDtypeStruct:
    """Shape and dtype as the HLO parameter has them (typed PRNG keys become their uint32 data)."""
    abstract = jax.ShapeDtypeStruct(info.shape, info.dtype)
    if jax.dtypes.issubdtype(info.dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, abstract)
    return abstract


def _dotted(path) -> str:
    """(args|kwargs, name, ...keys) -> "state.model.decoder...", without NNX Variable's trailing .value."""
    kind, top, *rest = path
    if rest and isinstance(rest[-1], jax.tree_util.GetAttrKey) and rest[-1].name == "value":
        rest.pop()
    first = maxtext.TRAIN_STEP_ARG_NAMES[top.idx] if kind.idx == 0 else key_name(top)
    return ".".join([first, *map(key_name, rest)])


def _entry_parameters(hlo_text: str) -> dict[int, tuple[str, list[int]]]:
    """ENTRY parameter number -> (HLO element type, dims)."""
    return {p.parameter_number: (p.shape.dtype, list(p.shape.dims)) for p in parse_module(hlo_text).entry.parameters}


def _hlo_element_type(dtype: str) -> str:
    """numpy dtype name -> HLO element type (float32 -> f32, bfloat16 -> bf16, bool -> pred)."""
    for prefix, hlo in (("bfloat", "bf"), ("uint", "u"), ("int", "s"), ("float", "f")):
        if dtype.startswith(prefix):
            return (hlo + dtype[len(prefix) :]).replace("_", "")
    return {"bool": "pred"}.get(dtype, dtype)


def _check(records: list[dict], hlo_text: str) -> str:
    """Compare the records with the ENTRY parameters; one summary line."""
    params = _entry_parameters(hlo_text)
    mapped = [r for r in records if r["parameter"] is not None]
    pruned = [r["path"] for r in records if r["parameter"] is None]
    disagree = [
        r["path"]
        for r in mapped
        if params.get(r["parameter"]) != (_hlo_element_type(r["dtype"]), r["shape"])
    ]
    unclaimed = len(params) - len({r["parameter"] for r in mapped})
    return (
        f"args_info: {len(records)} arguments, {len(params)} entry parameters; "
        f"pruned {len(pruned)} {pruned}; type/shape mismatches {len(disagree)} {disagree[:3]}; "
        f"entry parameters with no argument {unclaimed}"
    )


if __name__ == "__main__":
    sys.exit(main())
