"""One parsed module and what the tool knows about it, computed once and on demand.

Like jax's Lowered -> Compiled chain, each step keeps what the previous one knew: the raw text (for the
`identical` verdict), the parsed module, the entry parameters, and lazily the summary and canonical text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from hlo_audit.hlo.constants import CapturedArray, ConstantReport, add_literal_digests, constant_report
from hlo_audit.hlo.normalize import normalize_with_printed
from hlo_audit.hlo.params import ArgLeaf, EntryParam, ParamSummary, entry_params
from hlo_audit.hlo.rng_keys import KeyReport, key_report
from hlo_audit.hlo.rng_streams import RngReport, classify_streams
from hlo_audit.hlo.text import HloModule, parse_module


@dataclass
class Analysis:
    source: str
    text: str
    module: HloModule
    params: list[EntryParam]
    captured: Sequence[CapturedArray] | None = None  # what the step closes over, when the tool traced it
    # (computation, instruction, digest) of constants ``text`` elides: two equal texts with other digests differ.
    literal_digests: tuple[tuple[str, str, str], ...] = ()

    @cached_property
    def summary(self) -> ParamSummary:
        return ParamSummary.of(self.params)

    @cached_property
    def rng(self) -> RngReport:
        """Each RNG stream drawn, carried (dead state) or unknown."""
        return classify_streams(self.module, self.params)

    @cached_property
    def keys(self) -> KeyReport:
        """Literal keys drawn from and keys drawn from twice (rng_keys.py)."""
        return key_report(self.module)

    @cached_property
    def constants(self) -> ConstantReport:
        """Constants by dtype, the large ones, literal RNG keys, and the captured arrays when known."""
        return constant_report(self.module, self.captured)

    @cached_property
    def _canonical(self) -> tuple[str, frozenset[str]]:
        return normalize_with_printed(self.module, self.params)

    @property
    def normalized(self) -> str:
        return self._canonical[0]

    @property
    def printed_computations(self) -> frozenset[str]:
        """The computations the canonical text prints: identical ones (jax emits one reducer per call site)
        print once, so a golden's text holds one of each."""
        return self._canonical[1]


def analyze(text: str, source: str = "<text>", arg_keys: Sequence[Sequence[str]] | None = None,
            captured: Sequence[CapturedArray] | None = None, arg_leaves: Sequence[ArgLeaf] | None = None,
            literal_digests: Sequence[tuple[str, str, str]] = ()) -> Analysis:
    """Parse ``text`` and attribute its entry parameters (``arg_keys`` and ``arg_leaves`` from jax's args_info win:
    paths, argument names and what each leaf is); constants the text elides as ``{...}`` carry ``literal_digests``
    ((computation, instruction, digest), from the stage that printed them) into the canonical text."""
    module = parse_module(text, source)
    add_literal_digests(module, literal_digests)
    return Analysis(source=source, text=text, module=module, params=entry_params(module, arg_keys, arg_leaves),
                    captured=captured, literal_digests=tuple(tuple(d) for d in literal_digests))


def analyze_canonical(text: str, source: str = "<text>") -> Analysis:
    """A canonical text the normalizer printed just now (``Analysis.normalized`` of another analysis), parsed: it is
    its own canonical text, each of its computations printed once, so it is not normalized again (normalizing is
    idempotent: tests/test_normalize.py). `diff` saved a second normalization of each side this way (~5 s each on a
    module of 100,000 computations)."""
    analysis = analyze(text, source)
    analysis.__dict__["_canonical"] = (text, frozenset(analysis.module.computations))  # the cached_property's value
    return analysis
