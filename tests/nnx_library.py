"""A small Flax NNX model library, written into a test's folder as a user's own package would be.

``tinylm`` is shaped like the libraries the stock NNX target is for (tunix's Qwen3 and Llama3): a dataclass
``ModelConfig`` with named presets (``ModelConfig.tiny``), ``TinyLM(config, *, rngs)`` whose call takes token ids
and returns logits, the depth in ``num_layers``, and a ``scan_layers`` switch (flax's scan over stacked layers:
``nnx.split_rngs`` + ``nnx.vmap`` to build, ``nnx.scan`` to apply). ``add_layer_dropout`` edits the installed
source as a contributor's change would: every block gains an ``nnx.Dropout(0.0)``, which holds an RNG stream it
never draws from (seed 000's leak, +2 u32 entry parameters per unrolled layer); ``add_layer_fork``: every block
keeps a fork of the Rngs instead; ``add_layer_weight``: every block gains a weight (an intended change).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

MODEL_SOURCE = textwrap.dedent('''
    """tinylm: a small decoder-only language model in Flax NNX."""

    import dataclasses

    import jax.numpy as jnp
    from flax import nnx


    @dataclasses.dataclass(frozen=True)
    class ModelConfig:
        num_layers: int
        vocab_size: int
        embed_dim: int
        hidden_dim: int
        scan_layers: bool = False
        dtype: jnp.dtype = jnp.float32

        @classmethod
        def tiny(cls):
            return cls(num_layers=6, vocab_size=256, embed_dim=32, hidden_dim=64)

        @classmethod
        def small(cls):
            return cls(num_layers=12, vocab_size=512, embed_dim=64, hidden_dim=128)


    class Block(nnx.Module):
        def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
            self.norm = nnx.RMSNorm(config.embed_dim, dtype=config.dtype, rngs=rngs)
            self.up = nnx.Linear(config.embed_dim, config.hidden_dim, dtype=config.dtype, rngs=rngs)
            self.down = nnx.Linear(config.hidden_dim, config.embed_dim, dtype=config.dtype, rngs=rngs)
            # (layer state)

        def __call__(self, x):
            h = self.down(nnx.gelu(self.up(self.norm(x))))
            # (layer output)
            return x + h


    class TinyLM(nnx.Module):
        def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
            self.config = config
            self.embed = nnx.Embed(config.vocab_size, config.embed_dim, rngs=rngs)
            if config.scan_layers:
                @nnx.split_rngs(splits=config.num_layers)
                @nnx.vmap(in_axes=(0,), out_axes=0)
                def stacked(r: nnx.Rngs):
                    return Block(config, rngs=r)

                self.layers = stacked(rngs)
            else:
                self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
            self.norm = nnx.RMSNorm(config.embed_dim, rngs=rngs)

        def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
            x = self.embed(tokens)
            if self.config.scan_layers:
                @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
                def body(h, layer):
                    return layer(h)

                x = body(x, self.layers)
            else:
                for layer in self.layers:
                    x = layer(x)
            return self.embed.attend(self.norm(x))
    ''').lstrip()


def write_library(root: Path) -> Path:
    """``root/tinylm`` (a package: ``tinylm.model``); returns the folder to put on PYTHONPATH."""
    package = root / "tinylm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""tinylm."""\n')
    (package / "model.py").write_text(MODEL_SOURCE)
    return root


def add_layer_dropout(root: Path) -> None:
    """Every block holds, and applies, an ``nnx.Dropout(0.0)``: the library's own source changes."""
    path = root / "tinylm" / "model.py"
    source = path.read_text()
    assert source.count("# (layer state)") == 1 and source.count("# (layer output)") == 1
    path.write_text(source.replace("# (layer state)", "self.dropout = nnx.Dropout(0.0, rngs=rngs)")
                    .replace("# (layer output)", "h = self.dropout(h)"))


def add_layer_fork(root: Path) -> None:
    """Every block keeps a fork of the model's Rngs (``self.rngs = rngs.fork()``) and never draws from it: a stream
    per block, +2 u32 entry parameters per unrolled layer, the seed-000 leak as a contributor writes it."""
    path = root / "tinylm" / "model.py"
    source = path.read_text()
    assert source.count("# (layer state)") == 1
    path.write_text(source.replace("# (layer state)", "self.rngs = rngs.fork()"))


def add_layer_weight(root: Path) -> None:
    """Every block gains a weight of its own (a learned output scale, an ``nnx.Param``): a change a contributor
    means, +1 f32 entry parameter per layer (and its two optimizer moments)."""
    path = root / "tinylm" / "model.py"
    source = path.read_text()
    assert source.count("# (layer state)") == 1 and source.count("# (layer output)") == 1
    # The markers stay: a Dropout may follow (the user's next change).
    path.write_text(source.replace("# (layer state)", "self.scale = nnx.Param(jnp.ones((config.embed_dim,)))\n"
                                   "        # (layer state)")
                    .replace("# (layer output)", "h = h * self.scale[...]\n        # (layer output)"))
