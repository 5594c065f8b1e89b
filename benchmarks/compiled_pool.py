"""What a compiled kernel would take off the step: 2×2 max pooling with its arg-max, forward and backward.

The pure-PyTorch pooling (mocolab.models.pooling) makes one pass over memory per
element-wise op, on stride-2 views that do not vectorise.  This script
builds a small C++ kernel with torch's own extension loader (g++ and the
Python headers needed; nothing of mocolab depends on it), checks that it
gives mocolab's values and gradients (``torch.equal``; on finite inputs:
it orders a NaN instead of propagating it), and times both on the convnet's
three pooled shapes, one encoder's batch.  A measurement for deciding
whether compiled kernels are worth their build, not a part of mocolab.

    .venv/bin/python benchmarks/compiled_pool.py [--threads 2] [--repeats 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.cpp_extension import load_inline

from mocolab.config.hardware import keep_freed_memory
from mocolab.models.pooling import _MaxPool2x2

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cstring>
#include <type_traits>

// Floats compared as integers: the sign-magnitude bits mapped to an order-preserving unsigned key
// (finite values and infinities; a NaN is ordered, not propagated, so inputs here are finite).
template <typename U> static inline U key_of(U bits) {
  constexpr U sign = U(1) << (sizeof(U) * 8 - 1);
  return (bits & sign) ? U(~bits) : U(bits | sign);
}

// Per output element: the window's maximum, and which corner holds the first maximum in row-major
// order (code = 2·row + col), as mocolab.models.pooling decides it: bottom row only if strictly larger,
// then the right column only if strictly larger.  U: the element's bits (uint16 for bf16, uint32 for
// float); W: two of them, so that each window row is one contiguous load and the loop is branch-free
// integer work the compiler vectorises (random data made a branching loop mispredict half the time).
template <typename U, typename W>
static void pool_forward(const U* x, U* out, uint8_t* code, int64_t planes, int64_t h, int64_t w) {
  constexpr int bits = sizeof(U) * 8;
  const int64_t oh = h / 2, ow = w / 2;
  at::parallel_for(0, planes, 16, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const U* xp = x + p * h * w;
      U* op = out + p * oh * ow;
      uint8_t* cp = code + p * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        const U* r0 = xp + (2 * i) * w;
        const U* r1 = r0 + w;
        U* o = op + i * ow;
        uint8_t* c8 = cp + i * ow;
#pragma GCC ivdep
        for (int64_t j = 0; j < ow; ++j) {
          W top_pair, bottom_pair;
          std::memcpy(&top_pair, r0 + 2 * j, sizeof(W));
          std::memcpy(&bottom_pair, r1 + 2 * j, sizeof(W));
          U a = U(top_pair), b = U(top_pair >> bits), c = U(bottom_pair), d = U(bottom_pair >> bits);
          U ka = key_of(a), kb = key_of(b), kc = key_of(c), kd = key_of(d);
          U rt = kb > ka, rb = kd > kc;  // 0 or 1
          U ktop = rt ? kb : ka, kbottom = rb ? kd : kc;
          U row = kbottom > ktop;
          U top = rt ? b : a, bottom = rb ? d : c;
          o[j] = row ? bottom : top;
          c8[j] = uint8_t(row ? 2 + rb : rt);
        }
      }
    }
  });
}

// Every input position written once: the gradient at the window's arg-max, zero elsewhere (the bits
// of +0.0 are 0 in both types).
template <typename U>
static void pool_backward(const U* g, const uint8_t* code, U* gi, int64_t planes, int64_t h, int64_t w) {
  const int64_t oh = h / 2, ow = w / 2;
  at::parallel_for(0, planes, 16, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const U* gp = g + p * oh * ow;
      const uint8_t* cp = code + p * oh * ow;
      U* ip = gi + p * h * w;
      for (int64_t i = 0; i < oh; ++i) {
        U* r0 = ip + (2 * i) * w;
        U* r1 = r0 + w;
        for (int64_t j = 0; j < ow; ++j) {
          const U v = gp[i * ow + j];
          const uint8_t k = cp[i * ow + j];
          r0[2 * j] = k == 0 ? v : U(0);
          r0[2 * j + 1] = k == 1 ? v : U(0);
          r1[2 * j] = k == 2 ? v : U(0);
          r1[2 * j + 1] = k == 3 ? v : U(0);
        }
        if (w % 2) r0[w - 1] = r1[w - 1] = U(0);  // floor mode: an odd last column
      }
      if (h % 2) std::fill(ip + (h - 1) * w, ip + h * w, U(0));  // and an odd last row
    }
  });
}

template <typename F>
static void by_bits(const torch::Tensor& t, F&& fn) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat, "bf16 or float32 only");
  if (t.scalar_type() == at::kBFloat16) fn(uint16_t{});
  else fn(uint32_t{});
}

std::vector<torch::Tensor> forward(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 4 && x.is_contiguous() && x.size(2) >= 2 && x.size(3) >= 2);
  auto out = torch::empty({x.size(0), x.size(1), x.size(2) / 2, x.size(3) / 2}, x.options());
  auto code = torch::empty(out.sizes(), x.options().dtype(torch::kUInt8));
  by_bits(x, [&](auto zero) {
    using U = decltype(zero);
    using W = std::conditional_t<sizeof(U) == 2, uint32_t, uint64_t>;
    pool_forward<U, W>(static_cast<const U*>(x.data_ptr()), static_cast<U*>(out.data_ptr()), code.data_ptr<uint8_t>(),
                    x.size(0) * x.size(1), x.size(2), x.size(3));
  });
  return {out, code};
}

torch::Tensor backward(torch::Tensor g, torch::Tensor code, int64_t h, int64_t w) {
  g = g.contiguous();
  auto gi = torch::empty({g.size(0), g.size(1), h, w}, g.options());
  by_bits(g, [&](auto zero) {
    using U = decltype(zero);
    pool_backward<U>(static_cast<const U*>(g.data_ptr()), code.data_ptr<uint8_t>(), static_cast<U*>(gi.data_ptr()),
                     g.size(0) * g.size(1), h, w);
  });
  return gi;
}
"""

# OpenMP for at::parallel_for's threads (without it, one thread); AVX-512 with masked tails, since a
# window row here is 3-14 outputs long, shorter than one vector
FLAGS = ["-O3", "-march=native", "-fopenmp", "-mprefer-vector-width=512", "--param=vect-partial-vector-usage=1"]
SHAPES = [(256, 32, 28, 28), (256, 64, 14, 14), (256, 128, 7, 7)]  # the convnet's pooled maps (28→14→7→3)


def median_ms(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    if args.threads < 1 or args.repeats < 1:
        ap.error(f"--threads and --repeats must be >= 1 (got {args.threads} and {args.repeats})")
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as training processes run (without it, fresh pages dominate these figures)
    start = time.perf_counter()
    ext = load_inline("mocolab_bench_pool", cpp_sources=SOURCE, functions=["forward", "backward"],
                      extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], verbose=False)
    print(f"compiled in {time.perf_counter() - start:.1f} s (cached builds load in well under a second)")
    print(f"{'dtype':9s} {'shape':18s} {'mocolab fwd':>11s} {'compiled':>9s} {'mocolab bwd':>11s} {'compiled':>9s}")
    for dtype in (torch.bfloat16, torch.float32):
        for shape in SHAPES:
            x = torch.randn(shape).to(dtype).requires_grad_()
            xd = x.detach()
            ref = _MaxPool2x2.apply(x)
            g = torch.randn_like(ref)
            (ref_grad,) = torch.autograd.grad(ref, x, g, retain_graph=True)
            out, code = ext.forward(xd)
            grad = ext.backward(g, code, shape[2], shape[3])
            assert torch.equal(out, ref.detach()) and torch.equal(grad, ref_grad), "compiled kernel differs"
            fwd_ref = median_ms(lambda: _MaxPool2x2.apply(x), args.repeats)
            bwd_ref = median_ms(lambda: torch.autograd.grad(ref, x, g, retain_graph=True), args.repeats)
            fwd_c = median_ms(lambda: ext.forward(xd), args.repeats)
            bwd_c = median_ms(lambda: ext.backward(g, code, shape[2], shape[3]), args.repeats)
            print(f"{str(dtype)[6:]:9s} {'×'.join(map(str, shape)):18s} {fwd_ref:9.2f}ms {fwd_c:7.2f}ms "
                  f"{bwd_ref:9.2f}ms {bwd_c:7.2f}ms")


if __name__ == "__main__":
    main()
