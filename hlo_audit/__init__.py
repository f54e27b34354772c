"""hlo-audit: catch compiler-level regressions (entry-parameter and RNG-state bloat) in JAX models' HLO."""

from hlo_audit.lowering import Unavailable

__version__ = "0.1.0"
__all__ = ["Unavailable", "__version__", "devices", "params_frame"]


def __getattr__(name: str):
    # Lazy: `import hlo_audit` stays light; pandas and the pipeline load when a notebook asks for a frame.
    if name == "params_frame":
        from hlo_audit.audit import params_frame  # noqa: PLC0415

        return params_frame
    if name == "devices":  # a callable target's mesh devices for a cell (a TPU topology's, from libtpu)
        from hlo_audit.platforms import devices  # noqa: PLC0415

        return devices
    raise AttributeError(f"module 'hlo_audit' has no attribute {name!r}")
