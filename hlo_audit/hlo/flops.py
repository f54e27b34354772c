"""FLOPs of one dot or convolution from its shapes (what precision moves, what ops add or remove)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from hlo_audit.hlo.text import Instruction

_KERNEL_LABELS = re.compile(r"_(\w+)->")  # convolution dim_labels: input_kernel->output
# The ops ``flops`` counts.
FLOP_OPS = frozenset({"dot", "ragged-dot", "convolution"})


def flops(instr: Instruction, operands: Sequence[Instruction]) -> int:
    """2 x multiply-adds of one dot or convolution, from its shapes: the result's elements times what each
    contracts (a dot: the lhs contracting dims; a convolution: the kernel's window and input features)."""
    result = instr.shape.num_elements if not instr.shape.is_tuple else 0
    if len(operands) < 2:
        return 0
    if instr.opcode in ("dot", "ragged-dot"):
        lhs = operands[0].shape.dims
        contracted = 1
        for d in (int(d) for d in re.findall(r"\d+", instr.attrs.get("lhs_contracting_dims", ""))):
            contracted *= lhs[d] if d < len(lhs) else 1
        return 2 * result * contracted
    kernel = operands[1].shape
    labels = _KERNEL_LABELS.search(instr.attrs.get("dim_labels", ""))
    output_feature = labels.group(1).find("o") if labels else -1
    if 0 <= output_feature < len(kernel.dims) and kernel.dims[output_feature]:
        # The kernel's input features are per feature group already: window x input features per output.
        return 2 * result * (kernel.num_elements // kernel.dims[output_feature])
    return 2 * result * kernel.num_elements
