#!/usr/bin/env python3
"""MaxText's own AOT path, as its HLO gate runs it, and XLA's own count of what it compiled.

    python scripts/train_compile_dump.py --model llama3-8b --layers 4 --topology v6e-4 --dump /tmp/dump \\
        [--scan on|off] [--inject prefix] [--json out.json]

Calls ``maxtext.trainers.pre_train.train_compile.main`` with the arguments MaxText's
``tests/integration/hlo_diff_test.py`` gives it (base.yml + model_name, synthetic data, batch 1, seq 128,
``compile_topology``, one slice, ``compile_xla_flags`` dumping ``jit_train_step`` as text), then reads the
``*.after_optimizations.txt`` module with XLA's own parser (``jax._src.lib.hlo.hlo_module_from_text``) and
counts its entry parameters by element type from XLA's program shape. Prints one JSON record: the dump file,
``entry_params``, ``by_dtype`` (HLO names: f32, u32...), the seconds train_compile took and this process's peak
RSS. ``--inject`` reverts seed 000's fixes first (tests/injected_maxtext.py). train_compile sets jax's PRNG to
``unsafe_rbg`` for the whole process, as MaxText's trainer does: run one configuration per process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import resource
import sys
import time
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from hlo_audit import host

    host.setup_own_process()  # libtpu compile-only, as hlo-audit's own processes
    started = time.perf_counter()
    module = train_compile(args)
    seconds = time.perf_counter() - started
    record = {"module": str(module), **xla_entry_params(module.read_text()), "seconds": round(seconds, 3),
              "peak_rss_bytes": peak_rss_bytes()}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    if args.json:
        args.json.write_text(text)
    sys.stdout.write(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="MaxText model name, e.g. llama3-8b")
    parser.add_argument("--layers", type=int, required=True, help="base_num_decoder_layers")
    parser.add_argument("--topology", required=True, help="compile_topology, e.g. v6e-4")
    parser.add_argument("--scan", choices=("on", "off"), help="scan_layers (default: MaxText's, on)")
    parser.add_argument("--dump", type=pathlib.Path, required=True, help="--xla_dump_to folder")
    parser.add_argument("--inject", help="seed 000 fixes to revert first, as HLO_AUDIT_INJECT names them "
                                         "(comma-separated; prefix: all)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the record here")
    return parser


def train_compile(args: argparse.Namespace) -> pathlib.Path:
    """Run MaxText's train_compile for the configuration; the dumped after-optimizations module."""
    from hlo_audit.targets.maxtext_config import load_maxtext

    maxtext = load_maxtext()
    from absl import flags

    if not flags.FLAGS.is_parsed():  # as hlo_diff_test does, so train_compile's absl flags parse
        flags.FLAGS(["train_compile", "--grain_train_files=dummy"], known_only=True)
    base_yml = pathlib.Path(maxtext.pyconfig.__file__).parent / "base.yml"
    argv = [None, str(base_yml), f"model_name={args.model}", "dataset_type=synthetic", "override_model_config=true",
            "compile_topology_num_slices=1", f"compile_topology={args.topology}",
            f"base_num_decoder_layers={args.layers}", "per_device_batch_size=1", "max_target_length=128",
            f'compile_xla_flags="--xla_dump_to={args.dump} --xla_dump_hlo_as_text=True '
            f'--xla_dump_hlo_module_re=jit_train_step"']
    if args.scan:
        argv.append(f"scan_layers={args.scan == 'on'}")
    sys.path.insert(0, str(ROOT / "tests"))
    import injected_maxtext

    reverts = [n for n in (args.inject or "").split(",") if n]
    # train_compile prints its progress and analyses: onto stderr, so stdout is the record alone.
    with injected_maxtext.reverted(*reverts), contextlib.redirect_stdout(sys.stderr):
        maxtext.train_compile.main(tuple(argv))
    dumped = sorted(args.dump.glob("*.after_optimizations.txt"))
    if not dumped:
        raise SystemExit(f"train_compile dumped no after-optimizations module into {args.dump}")
    return dumped[0]


def peak_rss_bytes() -> int:
    """This process's peak resident memory (VmHWM: ru_maxrss would carry a larger parent's over the exec)."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def xla_entry_params(text: str) -> dict:
    """Entry parameters by HLO element type, as XLA's own parser reads the module."""
    from jax._src.lib import hlo

    module = hlo.hlo_module_from_text(text)
    shapes = hlo.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape().parameter_shapes()
    by_dtype = Counter(str(shape).split("[", 1)[0] for shape in shapes)  # XLA prints f32[4096]{0:T(1024)}
    return {"entry_params": len(shapes), "by_dtype": dict(sorted(by_dtype.items()))}


if __name__ == "__main__":
    sys.exit(main())
