"""hlo-audit: catch compiler-level regressions (entry-parameter and RNG-state bloat) in JAX models' HLO."""

from hlo_audit.targets.base import Unavailable

__version__ = "0.1.0"
__all__ = ["Unavailable", "__version__"]
