"""google-deepmind/nanodo's linen trainer in small (issue 47 item 4), its attention's output projection named
``attn_out_proj`` or, renamed, ``out_proj``, with or without a real change beside the rename. Plain module (no pytest
import): ``lowered_text`` gives pre-optimization HLO text for the CPU, ``target(cell)`` the same step as a callable
target (``cell.quant`` names a ``VARIANTS`` entry).

Copied from nanodo at commit 10aefde (nanodo itself imports grain and tensorflow_datasets, not installed here), only
what one train step runs:

* nanodo/model.py: ``TransformerDo`` (token and position ``Embed``, ``TBlock`` x N, a final LayerNorm, logits by the
  embedding's ``attend``), ``TBlock`` (pre-LayerNorm, ``CausalAttn``, residual, LayerNorm, ``Mlp``), ``CausalAttn``
  (query/key/value ``DenseGeneral`` to heads, a causal mask, softmax in f32, the output projection ``attn_out_proj``
  over heads), ``Mlp``; nanodo/fsdp.py: ``init``'s ``nn.with_partitioning`` of each kernel (the params are boxed);
* nanodo/optimizer.py: ``get_optimizer`` (``clip_by_global_norm`` chained before adamw with its weight-decay mask
  from ``_params_mask``, all inside ``optax.MultiSteps``) and ``get_learning_rate_schedule`` (linear warmup, then
  cosine decay), with configs/default.py's settings and train_test.py's rates; the clip at 1.0 (the default config
  has none and says 1.0 is common: it is a sum over the leaves, what a rename reorders);
* nanodo/loss.py: ``get_default_loss_fn`` (``mutable=("intermediate_acts",)``, as ``log_internal_metrics`` asks);
  nanodo/data.py: ``get_in_out``;
* nanodo/metrics.py: ``get_metrics`` with ``log_internal_metrics`` (the default config's): the accumulated gradients,
  the learning rate, and rms, std and mean of the gradients, parameters and updates, over all leaves and per leaf,
  each a running (Welford) mean over the leaves in tree order;
* nanodo/train.py: ``_train_step`` (the batch constrained to the ``data`` axis, ``state.tx.update``, the step taken
  from ``opt_state.gradient_step``) and ``Trainer``'s jit (in and out shardings from ``nn.get_sharding`` over a mesh
  of the devices, state and batch donated).

The rename moves the projection's leaves after ``key``'s in every pytree of the state (params, adamw's mu and nu,
MultiSteps' acc_grads), so the global norm sums them in another order and the metrics' running means over the leaves
are other chains of other literals (``m * (S / S') + sum(x) / S'``, ``S`` the sizes so far).

Changes beside the rename (``VARIANTS``): ``norm_without_leaf`` leaves the final LayerNorm's scale out of the clip's
global norm; ``multiply`` doubles the attention's output; ``mean_weight`` counts the first leaf one element larger in
the metrics' running means.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import struct
from flax.training.train_state import TrainState
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from optax import losses

PyTree = Any
PAD_ID = 0
BATCH = 2
CHANGES = ("", "norm_without_leaf", "multiply", "mean_weight")
VARIANTS: dict[str, dict[str, str]] = {
    "base": {},
    "renamed": {"out_proj": "out_proj"},
    **{f"renamed_{change}": {"out_proj": "out_proj", "change": change} for change in CHANGES if change},
}


@dataclasses.dataclass
class DoConfig:
    """nanodo's model config (model.py), with the output projection's name and the change made."""

    D: int  # model/embed dim = qkv dim
    H: int  # heads
    L: int  # context length
    N: int  # blocks
    V: int  # vocab size
    F: int  # FF inner dim
    kernel_init: Callable = nn.initializers.xavier_uniform()
    embed_init: Callable = nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
    dtype: Any = jnp.bfloat16  # configs/default.py's computation dtype
    fsdp_enabled: bool = True
    out_proj: str = "attn_out_proj"
    change: str = ""


@dataclasses.dataclass(frozen=True)
class OptConfig:
    """configs/default.py's ``opt`` (adamw, cosine decay), the rates and steps tests/train_test.py sets."""

    num_train_steps: int = 100
    peak_learning_rate: float = 0.01
    init_learning_rate: float = 0.001
    final_learning_rate: float = 0.0001
    warmup_steps: int = 10
    decay_steps: int = 90
    weight_decay: float = 0.1
    weight_decay_exclusion_names: tuple[str, ...] = ()
    clip_by_global_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-9
    grad_accumulation_steps: int = 1


def fsdp_init(layer_type: str, docfg: DoConfig) -> Callable:
    """fsdp.py's ``init``: each kernel's initializer, partitioned over the ``data`` axis."""
    partition_fn = nn.with_partitioning if docfg.fsdp_enabled else lambda x, y: x
    axes = {"embedding": (None, "data"), "attn_in_proj": ("data", None, None), "attn_out_proj": (None, None, "data"),
            "mlp_kernel": ("data", None)}[layer_type]
    return partition_fn(docfg.embed_init if layer_type == "embedding" else docfg.kernel_init, axes)


class TransformerDo(nn.Module):
    docfg: DoConfig

    def setup(self):
        cfg = self.docfg
        self.embed = nn.Embed(num_embeddings=cfg.V, features=cfg.D, embedding_init=fsdp_init("embedding", cfg))
        self.pos_embed = nn.Embed(num_embeddings=cfg.L, features=cfg.D, embedding_init=fsdp_init("embedding", cfg))
        self.blocks = [TBlock(cfg) for _ in range(cfg.N)]
        self.out_ln = nn.LayerNorm(dtype=cfg.dtype, use_bias=False)

    def __call__(self, y_BxL: jax.Array):
        y_BxLxD = self.embed(y_BxL)
        y_BxLxD += self.pos_embed(jnp.arange(0, y_BxL.shape[1])[None, ...])
        for block in self.blocks:
            y_BxLxD = block(y_BxLxD)
        y_BxLxD = self.out_ln(y_BxLxD)
        return self.embed.attend(y_BxLxD.astype(jnp.float32))


class Mlp(nn.Module):
    cfg: DoConfig

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array):
        cfg = self.cfg
        linear = functools.partial(nn.Dense, kernel_init=fsdp_init("mlp_kernel", cfg), use_bias=False, dtype=cfg.dtype)
        return linear(cfg.D)(jax.nn.gelu(linear(cfg.F)(x_BxLxD)))


class TBlock(nn.Module):
    docfg: DoConfig

    @nn.compact
    def __call__(self, in_BxLxD: jax.Array):
        cfg = self.docfg
        x_BxLxD = nn.LayerNorm(dtype=cfg.dtype, use_bias=False)(in_BxLxD)
        x_BxLxD = CausalAttn(cfg)(x_BxLxD)
        x_BxLxD += in_BxLxD
        z_BxLxD = nn.LayerNorm(dtype=cfg.dtype, use_bias=False)(x_BxLxD)
        return x_BxLxD + Mlp(cfg)(z_BxLxD)


class CausalAttn(nn.Module):
    cfg: DoConfig

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array):
        cfg = self.cfg
        Dh = cfg.D // cfg.H
        multilinear = functools.partial(nn.DenseGeneral, axis=-1, features=(cfg.H, Dh),
                                        kernel_init=fsdp_init("attn_in_proj", cfg), use_bias=False, dtype=cfg.dtype)
        q_BxLxHxDh, k_BxLxHxDh, v_BxLxHxDh = (multilinear(name=n)(x_BxLxD) for n in ("query", "key", "value"))
        q_BxLxHxDh /= Dh**0.5
        att_BxHxLxL = jnp.einsum("...qhd,...khd->...hqk", q_BxLxHxDh, k_BxLxHxDh).astype(jnp.float32)
        L = x_BxLxD.shape[1]
        mask_1x1xLxL = jnp.tril(jnp.ones((1, 1, L, L), dtype=jnp.bool_))
        att_BxHxLxL = jnp.where(mask_1x1xLxL, att_BxHxLxL, jnp.finfo(cfg.dtype).min)
        att_BxHxLxL = jax.nn.softmax(att_BxHxLxL, axis=-1).astype(cfg.dtype)
        out_BxLxHxDh = jnp.einsum("...hqk,...khd->...qhd", att_BxHxLxL, v_BxLxHxDh)
        out_BxLxD = nn.DenseGeneral(features=cfg.D, name=cfg.out_proj, axis=(-2, -1),
                                    kernel_init=fsdp_init("attn_out_proj", cfg), use_bias=False,
                                    dtype=cfg.dtype)(out_BxLxHxDh)
        return out_BxLxD * 2.0 if cfg.change == "multiply" else out_BxLxD


# -- optimizer.py ------------------------------------------------------------------------------------------------


def get_learning_rate_schedule(c: OptConfig) -> optax.Schedule:
    """Linear warmup, then cosine decay (decay_type "cosine", the default)."""
    return optax.join_schedules([
        optax.linear_schedule(init_value=c.init_learning_rate, end_value=c.peak_learning_rate,
                              transition_steps=c.warmup_steps),
        optax.cosine_decay_schedule(init_value=c.peak_learning_rate, decay_steps=c.decay_steps,
                                    alpha=c.final_learning_rate / c.peak_learning_rate, exponent=1.0),
    ], boundaries=[c.warmup_steps])


def _params_mask(params: PyTree, exclude_names: tuple[str, ...] = ("bias", "scale")) -> PyTree:
    def _check_key_contain_exclude_names(key_path):
        return any([x in "/".join([k.key for k in key_path if hasattr(k, "key")]) for x in exclude_names])

    return jax.tree_util.tree_map_with_path(lambda key_path, _: not _check_key_contain_exclude_names(key_path), params)


def _clip_by_global_norm_without(max_norm: float, left_out: str) -> optax.GradientTransformation:
    """optax.clip_by_global_norm, its norm over every leaf but those whose path names ``left_out`` (the change)."""

    def update_fn(updates, state, params=None):
        del params
        kept = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(updates)
                if left_out not in jax.tree_util.keystr(path)]
        g_norm = optax.tree.norm(kept)
        trigger = jnp.squeeze(g_norm < max_norm)
        return jax.tree.map(lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm),
                            updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def get_optimizer(c: OptConfig, change: str = "") -> optax.MultiSteps:
    optimizer = optax.adamw(get_learning_rate_schedule(c), b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay,
                            mask=functools.partial(_params_mask, exclude_names=c.weight_decay_exclusion_names))
    clip = optax.clip_by_global_norm(c.clip_by_global_norm) if change != "norm_without_leaf" else \
        _clip_by_global_norm_without(c.clip_by_global_norm, "out_ln")
    return optax.MultiSteps(optax.chain(clip, optimizer), c.grad_accumulation_steps)


# -- loss.py, data.py --------------------------------------------------------------------------------------------


@struct.dataclass
class LossAuxData:
    ntokens: jax.Array
    state: PyTree
    log_perplexity: jax.Array


def get_in_out(in_BxL: jax.Array, pad_id: int = PAD_ID) -> tuple[jax.Array, jax.Array, jax.Array]:
    y_BxL = jnp.pad(in_BxL[:, 1:], ((0, 0), (0, 1)), mode="constant", constant_values=pad_id)
    return in_BxL, y_BxL, jnp.where(y_BxL != pad_id, 1, 0).astype(jnp.float32)


def get_default_loss_fn(in_BxL: jax.Array, apply_fn: Callable) -> Callable:
    def loss_fn(params: PyTree) -> tuple[jax.Array, LossAuxData]:
        x_BxL, y_BxL, weights_BxL = get_in_out(in_BxL)
        logits_BxLxV, state = apply_fn({"params": params}, x_BxL, mutable=("intermediate_acts",))
        losses_BxL = losses.softmax_cross_entropy_with_integer_labels(logits_BxLxV, y_BxL)
        ntokens = weights_BxL.sum()
        mean_loss = jnp.sum(losses_BxL * weights_BxL) / ntokens
        return mean_loss, LossAuxData(ntokens=ntokens, state=state, log_perplexity=mean_loss)

    return loss_fn


# -- metrics.py --------------------------------------------------------------------------------------------------


def _tree_to_dict(prefix: str, g: PyTree) -> dict[str, Any]:
    return {prefix + "_".join(z.key for z in k if hasattr(z, "key")): v
            for k, v in jax.tree_util.tree_leaves_with_path(g)}


def _welford_mean(g: PyTree, change: str = "") -> jax.Array:
    def step(mean_and_size, x):
        mean, size = mean_and_size
        # The change: the first leaf counted one element larger (a weight of the running mean changed).
        new_size = size + x.size + (change == "mean_weight" and size == 0.)
        return mean * (size / new_size) + jnp.sum(x) / new_size, new_size

    mean, _ = jax.tree.reduce(step, g, (0., 0.))
    return mean


def _get_stats(g: PyTree, change: str = "") -> dict[str, jax.Array]:
    mean = _welford_mean(g, change)
    ms = _welford_mean(jax.tree.map(jnp.square, g), change)
    return {"rms": jnp.sqrt(ms), "std": jnp.sqrt(jnp.maximum(ms - mean**2, 0.)), "mean": mean}


def _stats_from_tree(prefix: str, g: PyTree) -> dict[str, jax.Array]:
    return _tree_to_dict(prefix, jax.tree.map(_get_stats, g))


def _global_stats_from_tree(prefix: str, g: PyTree, change: str) -> dict[str, jax.Array]:
    return _tree_to_dict(prefix, _get_stats(g, change))


def _stats_from_state(state: dict) -> dict[str, jax.Array]:
    stats = {}
    for k, v in state.items():
        stats |= _tree_to_dict(k + "/", v)
    return stats


def get_metrics(aux_data: LossAuxData, c: OptConfig, loss: jax.Array, state: TrainState, grads: PyTree,
                updates: PyTree, change: str) -> dict[str, jax.Array]:
    step = state.opt_state.gradient_step
    acc_grads = jax.tree.map(lambda acc, g: acc + (g - acc) / (state.opt_state.mini_step + 1),
                             state.opt_state.acc_grads, grads)
    lr = get_learning_rate_schedule(c)(step)
    updates = jax.tree.map(lambda x: x / (lr + 1e-20), updates)
    return {
        "__train_loss": loss, "train_loss": loss, "log_perplexity": aux_data.log_perplexity,
        "train_ntokens": aux_data.ntokens, "learning_rate": jnp.array(lr), "train_fraction": step / c.num_train_steps,
        "train_tokens_seen": aux_data.ntokens * step,
        **_global_stats_from_tree("grads/all/", acc_grads, change),
        **_global_stats_from_tree("params/all/", state.params, change),
        **_global_stats_from_tree("updates/all/", updates, change),
        # log_internal_metrics (configs/default.py: True)
        **_stats_from_state(aux_data.state),
        **_stats_from_tree("grads/", acc_grads),
        **_stats_from_tree("params/", state.params),
        **_stats_from_tree("updates/", updates),
    }


# -- train.py ----------------------------------------------------------------------------------------------------


def traced(out_proj: str = "attn_out_proj", change: str = "") -> jax.stages.Traced:
    """One train step of a 2-block nanodo (D 8, 2 heads, context 8, vocab 16, FF 16), traced as Trainer jits it."""
    cfg = DoConfig(D=8, H=2, L=8, N=2, V=16, F=16, out_proj=out_proj, change=change)
    opt = OptConfig()
    model = TransformerDo(cfg)
    mesh = Mesh(mesh_utils.create_device_mesh((jax.device_count(),)), ("data",))

    def init(rng, inputs):
        params = model.init(rng, inputs)
        return TrainState.create(apply_fn=model.apply, params=params["params"], tx=get_optimizer(opt, change))

    state = jax.eval_shape(init, jax.random.PRNGKey(42), jax.ShapeDtypeStruct((1, cfg.L), jnp.int32))
    shardings = nn.get_sharding(state, mesh)

    def _train_step(state: TrainState, in_BxL: jax.Array):
        in_BxL = jax.lax.with_sharding_constraint(in_BxL, NamedSharding(mesh, P("data")))
        grad_fn = jax.value_and_grad(get_default_loss_fn(in_BxL, state.apply_fn), has_aux=True)
        (loss, aux_data), grads = grad_fn(state.params)
        updates, new_opt_state = state.tx.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        new_state = state.replace(step=state.opt_state.gradient_step + 1, params=new_params, opt_state=new_opt_state)
        return new_state, get_metrics(aux_data, opt, loss, state, grads, updates, change)

    step_fn = jax.jit(_train_step, in_shardings=(shardings, NamedSharding(mesh, P())),
                      out_shardings=(shardings, NamedSharding(mesh, P())), donate_argnames=("state", "in_BxL"))
    return step_fn.trace(state, jax.ShapeDtypeStruct((BATCH, cfg.L), jnp.int32))


@functools.lru_cache(maxsize=None)
def lowered_text(out_proj: str = "attn_out_proj", change: str = "") -> str:
    jax.clear_caches()
    return traced(out_proj, change).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")


def target(cell):
    """A callable target: ``cell.quant`` names a ``VARIANTS`` entry."""
    return traced(**VARIANTS[cell.quant])
