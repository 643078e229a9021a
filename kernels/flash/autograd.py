"""Autograd of :func:`~kernels.flash.flash_attn`: an ``autograd.Function`` in eager mode, ``torch.library`` custom
ops under ``torch.compile`` (so it traces through them). Both run the forward / backward of ``fwd.py`` /
``bwd.py`` with the :class:`~kernels.flash.FlashConfig` the forward was given (the custom ops take it as its
``key`` string): nothing is read at backward time."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .bwd import flash_attn_bwd
from .config import FlashConfig
from .fwd import flash_attn_fwd
from .launch import _bnhd_empty


def _config(config) -> FlashConfig:
    return FlashConfig.from_key(config) if isinstance(config, str) else config


@torch.library.custom_op("attn_zoo_kernels::flash_fwd", mutates_args=())
def _flash_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, win_left: int,
                  win_right: int, layout: Optional[torch.Tensor], layout_bs: int, kv_idx: Optional[torch.Tensor],
                  kv_cnt: Optional[torch.Tensor], kv_nfull: Optional[torch.Tensor], q_idx: Optional[torch.Tensor],
                  q_cnt: Optional[torch.Tensor], q_nfull: Optional[torch.Tensor], dilation: int,
                  config: str, documents: Optional[torch.Tensor] = None,
                  sink_size: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    return flash_attn_fwd(q, k, v, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull,
                          dilation=dilation, config=_config(config), documents=documents, sink_size=sink_size)


@_flash_fwd_op.register_fake
def _(q, k, v, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt,
      q_nfull, dilation, config, documents=None, sink_size=0):
    B, Hq, Nq, D = q.shape
    return _bnhd_empty(B, Hq, Nq, v.shape[3], q.dtype, q.device), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("attn_zoo_kernels::flash_bwd", mutates_args=())
def _flash_bwd_op(do: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, softmax_scale: float, win_left: int, win_right: int,
                  layout: Optional[torch.Tensor], layout_bs: int, kv_idx: Optional[torch.Tensor],
                  kv_cnt: Optional[torch.Tensor], kv_nfull: Optional[torch.Tensor], q_idx: Optional[torch.Tensor],
                  q_cnt: Optional[torch.Tensor], q_nfull: Optional[torch.Tensor], dilation: int, config: str,
                  documents: Optional[torch.Tensor] = None,
                  sink_size: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _flash_bwd_impl(do, dlse, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs,
                           kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull, dilation, config, documents, sink_size)


def _flash_bwd_impl(do, dlse, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx,
                    kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull, dilation, config, documents=None, sink_size=0,
                    grads_like_inputs=False):
    """The backward in the custom op's argument order (the eager ``_FlashFn`` calls it with
    ``grads_like_inputs=True`` and the config object instead of its key)."""
    return flash_attn_bwd(do, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs,
                          kv_idx, kv_cnt, kv_nfull, q_idx, q_cnt, q_nfull, dlse=dlse,
                          grads_like_inputs=grads_like_inputs, dilation=dilation, config=_config(config),
                          documents=documents, sink_size=sink_size)


def _flash_bwd_eager(*args):
    return _flash_bwd_impl(*args, grads_like_inputs=True)


@_flash_bwd_op.register_fake
def _(do, dlse, q, k, v, out, lse, softmax_scale, win_left, win_right, layout, layout_bs, kv_idx, kv_cnt, kv_nfull,
      q_idx, q_cnt, q_nfull, dilation, config, documents=None, sink_size=0):
    (B, Hq, Nq, D), (Hkv, Nk) = q.shape, k.shape[1:3]
    return (_bnhd_empty(B, Hq, Nq, D, q.dtype, q.device), _bnhd_empty(B, Hkv, Nk, D, k.dtype, k.device),
            _bnhd_empty(B, Hkv, Nk, v.shape[3], v.dtype, v.device))


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.cfg = tuple(inputs[3:])  # scale, wl, wr, layout, bs, 6 tables, dilation, config key, document table, sinks


def _run_backward(ctx, dout, dlse, bwd):
    """Gradients of both autograd paths: ``bwd`` is the custom op (compile) or its implementation (eager)."""
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    return bwd(dout, dlse, q, k, v, out, lse, *ctx.cfg)  # (dq, dk, dv)


def _backward(ctx, dout, dlse):
    return _run_backward(ctx, dout, dlse, _flash_bwd_op) + (None,) * len(ctx.cfg)


_flash_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _FlashFn(torch.autograd.Function):
    """Eager path of :func:`flash_attn`: the same forward / backward as the custom ops, without the dispatcher
    (the custom-op call costs ~0.1-0.2 ms of host time per call, as much as a short sparse forward on the GPU).
    ``torch.compile`` traces the custom ops instead."""

    @staticmethod
    def forward(ctx, q, k, v, cfg):  # cfg: the custom op's other arguments, one tuple (with the FlashConfig itself)
        out, lse = flash_attn_fwd(q, k, v, *cfg[:8], dilation=cfg[11], config=cfg[12], documents=cfg[13],
                                  sink_size=cfg[14])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # double backward raises (as through the custom op)
    def backward(ctx, dout, dlse):
        return _run_backward(ctx, dout, dlse, _flash_bwd_eager) + (None,)
