# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""A CPU matrix kernel for the few rows a verify or a draft computes: the linear layers of the target and the drafter
read their weights once for 2-7 rows, where torch's own product (oneMKL) reads them about once per row.

Why: decoding on a CPU is bound by reading the weights from memory. A plain step computes one row per layer and
costs one read; a verify of `n` drafts computes `n + 1` rows, and on some CPUs (measured on an AMD EPYC) oneMKL's
product costs ~1.85x its one-row time at two rows, so a two-row verify cost ~1.6 plain steps and drafting rarely
paid. This kernel streams each weight row once against all the input rows (AVX2 + FMA), so a few-row product costs
about what one row does (in SmolLM2-135M on that EPYC, quiet: a 2-row verify 1.05 plain steps instead of 1.53, 4 rows
1.32 instead of 1.84).

What stays torch's: one-row products (plain steps compute exactly what plain ``generate`` computes), more than
:data:`MOST_ROWS` rows (full blocks, the drafter's block, prompts), other dtypes than float32, other devices,
subclasses of ``nn.Linear`` and quantized weights, and layers whose ``forward`` was already replaced (accelerate's
hooks). Lossless as before: the verify's choices are the target's, computed in float32; the kernel's sums run in a
fixed order per output, the same whatever rows are computed beside it, and differ from oneMKL's only in rounding (as
oneMKL's own few-row and one-row products differ from each other).

Opt in per call with ``generate(..., assistant_model=drafter, dflash_cpu_kernels=True)``, or for the process with
``HF_DFLASH_CPU_KERNELS=1`` (a call's ``dflash_cpu_kernels=False`` still turns it off). It stays opt-in: verifies of
2-4 rows cost a quarter to a third less with it on that EPYC, but side by side the default policy gained nothing end
to end (it drafted more for no gain: BENCHMARKS.md, "A few-row matrix kernel").

The kernel is built from source on first use with torch's C++ extension builder (a C++ compiler and ninja; ~1 minute
once, then loaded from torch's extensions cache). Where it cannot be built (no compiler, no AVX2/FMA, not x86-64),
torch's product is used with one info log.

Example:
    >>> x, weight = torch.randn(3, 64), torch.randn(40, 64)
    >>> torch.allclose(few_rows_linear(x, weight), x @ weight.T, atol=1e-4)
    True
"""

import contextlib
import functools
import os
import platform
import threading
import types
import weakref

import torch
from torch import nn
from transformers.utils import logging

from .costs_dflash import FORWARD_KERNEL

logger = logging.get_logger(__name__)

# the rows the kernel takes: one row is a plain step (torch's product, as plain generate computes it); from 8 rows on
# oneMKL's blocked product is faster in the model (SmolLM2-135M on an AMD EPYC: 8 rows 2.1 plain steps either way,
# 16 rows 3.4 by the kernel, 2.8 by oneMKL), and a prompt is oneMKL's
FEWEST_ROWS, MOST_ROWS = 2, 7
NAME = "few-row kernel"  # what FORWARD_KERNEL holds inside few_row_kernels (the policy's costs key on it)
ENVIRONMENT_SWITCH = "HF_DFLASH_CPU_KERNELS"

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// the 8 lanes' sum, in a fixed order
static inline float lanes_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// WR weight rows against XR input rows: each weight load serves XR rows (12 accumulators + 4 weights: 16 registers)
template <int WR, int XR>
static void tile(const float* x, const float* w, const float* bias, float* y, int64_t K, int64_t N) {
  __m256 acc[WR][XR];
  for (int r = 0; r < WR; r++) for (int m = 0; m < XR; m++) acc[r][m] = _mm256_setzero_ps();
  const int64_t K8 = K - K % 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[WR];
    for (int r = 0; r < WR; r++) wv[r] = _mm256_loadu_ps(w + r * K + k);
    for (int m = 0; m < XR; m++) {
      __m256 xv = _mm256_loadu_ps(x + m * K + k);
      for (int r = 0; r < WR; r++) acc[r][m] = _mm256_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  for (int r = 0; r < WR; r++) for (int m = 0; m < XR; m++) {
    float s = lanes_sum(acc[r][m]);
    for (int64_t k = K8; k < K; k++) s += w[r * K + k] * x[m * K + k];
    y[m * N + r] = bias ? s + bias[r] : s;
  }
}

template <int WR>
static void weight_rows(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N) {
  int64_t m = 0;
  for (; m + 3 <= M; m += 3) tile<WR, 3>(x + m * K, w, bias, y + m * N, K, N);
  if (M - m == 2) tile<WR, 2>(x + m * K, w, bias, y + m * N, K, N);
  if (M - m == 1) tile<WR, 1>(x + m * K, w, bias, y + m * N, K, N);
}

torch::Tensor few_rows_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "few_rows_linear: x [M, K], weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "few_rows_linear: float32 only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "few_rows_linear: contiguous x and weight");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  torch::Tensor b = bias.has_value() ? bias->contiguous() : torch::Tensor();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t blocks = (N + 3) / 4, grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; b++) {
      const int64_t n = b * 4;
      if (n + 4 <= N) {
        weight_rows<4>(xp, wp + n * K, bp ? bp + n : nullptr, yp + n, M, K, N);
      } else {
        for (int64_t r = n; r < N; r++) weight_rows<1>(xp, wp + r * K, bp ? bp + r : nullptr, yp + r, M, K, N);
      }
    }
  });
  return y;
}
"""


def switched_on() -> bool:
    """Whether the process asks for the kernel where a call says nothing (``HF_DFLASH_CPU_KERNELS=1``; unset: no)."""
    return os.environ.get(ENVIRONMENT_SWITCH, "0").strip().lower() in ("1", "true", "yes", "on")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the kernel (None: it can, once built)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"a {platform.machine()} CPU (the kernel is x86-64 AVX2)"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"the CPU's vector capability is {capability} (the kernel needs AVX2 and FMA)"
    return None


@functools.cache
def extension():
    """The built kernel module, or None (logged once) where it cannot be built here."""
    reason = unavailable_reason()
    if reason is None:
        try:
            from torch.utils.cpp_extension import load_inline

            logger.info("Loading hf-dflash's few-row CPU matrix kernel (built once, ~1 minute, then cached by torch)")
            return load_inline("hf_dflash_few_rows_v1", cpp_sources=SOURCE, functions=["few_rows_linear"],
                               extra_cflags=["-O3", "-mavx2", "-mfma"], verbose=False)
        except Exception as error:  # no compiler, no ninja, a failed build: torch's product serves
            reason = f"it could not be built ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    logger.info(f"hf-dflash's few-row CPU matrix kernel is not used: {reason}; torch's matrix product serves.")
    return None


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a float32 ``x [rows, in]`` and ``weight [out, in]`` on the CPU, by the kernel
    (torch's product where it is not available)."""
    kernel = extension()
    if kernel is None:
        return nn.functional.linear(x, weight, bias)
    return kernel.few_rows_linear(x.contiguous(), weight, bias)


# whether the forwards of this thread (or asyncio task) are inside few_row_kernels is FORWARD_KERNEL's (a context
# variable): a layer routed for one thread's DFlash call computes another thread's plain generate with torch's product
# layer -> how many calls in flight routed it (calls on one model may overlap in threads): the last one restores it
_ROUTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ROUTED_LOCK = threading.Lock()


def _few_rows_forward(self: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward``, by the kernel for :data:`FEWEST_ROWS` to :data:`MOST_ROWS` float32 rows inside
    :func:`few_row_kernels`."""
    rows = hidden.numel() // max(hidden.shape[-1], 1)
    if (FORWARD_KERNEL.get() == NAME and FEWEST_ROWS <= rows <= MOST_ROWS and hidden.dtype == torch.float32
            and hidden.device.type == "cpu" and not torch.is_grad_enabled()):  # the kernel has no backward
        out = few_rows_linear(hidden.reshape(rows, hidden.shape[-1]), self.weight, self.bias)
        return out.reshape(*hidden.shape[:-1], out.shape[-1])
    return nn.Linear.forward(self, hidden)


def eligible(module: nn.Module) -> bool:
    """Whether a layer's forward may be routed to the kernel: a plain float32 ``nn.Linear`` on the CPU with a plain
    contiguous weight (not a quantized tensor subclass: torchao's int8 weights report float32), whose forward nobody
    else replaced."""
    weight = getattr(module, "weight", None)
    return (type(module) is nn.Linear and type(weight) in (nn.Parameter, torch.Tensor)  # not a quantized subclass
            and weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.layout == torch.strided
            and weight.is_contiguous() and ("forward" not in module.__dict__ or module in _ROUTED))


@contextlib.contextmanager
def few_row_kernels(*models: nn.Module, enabled: bool | None = True):
    """Within the block, the forwards of this thread (or asyncio task) compute the eligible linear layers of `models`
    with the kernel when they have 2-7 rows; other threads keep torch's product, and the layers get their own
    forwards back when the last call routing them ends, errors included. `enabled`: False routes nothing, None leaves
    it to the process (:func:`switched_on`). Yields how many layers were routed (0 where the kernel is unavailable or
    not enabled).

    Example:
        >>> layer = nn.Linear(64, 32)
        >>> with few_row_kernels(layer) as routed:
        ...     out = layer(torch.randn(4, 64))
        >>> "forward" in layer.__dict__
        False
    """
    layers = []
    if (enabled or (enabled is None and switched_on())) and extension() is not None:
        # a layer two models share (a drafter's head taken from its target) is routed once
        layers = list({id(module): module for model in models for module in model.modules() if eligible(module)}
                      .values())
    with _ROUTED_LOCK:
        for layer in layers:
            _ROUTED[layer] = _ROUTED.get(layer, 0) + 1
            layer.forward = types.MethodType(_few_rows_forward, layer)
    token = FORWARD_KERNEL.set(NAME) if layers else None  # the costs measured inside are the kernel's
    try:
        yield len(layers)
    finally:
        if token is not None:
            FORWARD_KERNEL.reset(token)
        with _ROUTED_LOCK:
            for layer in layers:
                _ROUTED[layer] -= 1
                if not _ROUTED[layer]:
                    del _ROUTED[layer], layer.forward
