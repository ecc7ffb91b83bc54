// The C++ kernels of hf_vit_plus's fused decoding step (fast_kernels.py, `cpp_fbgemm_ops`), built once per torch
// install by torch.utils.cpp_extension:
// - FBGEMM's products (int8, float16 weights): each keeps FBGEMM's packed weights in its own table, under the tensor
//   that owns them (a weak reference: an entry whose owner was freed is dropped at the next pack), and calls FBGEMM's
//   ops through the dispatcher (boxed: no header of torch's quantized classes needed). `pack_counts` reads the counts.
// - AVX-512 products of weights packed once into column blocks (tables like FBGEMM's): `int8_vnni_linear`, dynamic
//   int8 (each row of x quantized to int8 over its own range, int8 weights with one scale per output row, int32 sums
//   by VNNI's vpdpbusd), and `fp32_packed_linear`, float32 (FMA). Both are for the batched steps, where ATen's
//   products (oneDNN's `_int_mm` repacks the weights at every call, MKL's sgemm) are slow at 4-64 rows. Compiled for
//   AVX-512 with function attributes and chosen at run time (`cpu_kernels`): the file builds for any x86 CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HF_VIT_PLUS_X86 1
#endif

namespace {

struct Packed {
  c10::weak_intrusive_ptr<c10::TensorImpl> owner;
  std::vector<int64_t> source;  // what the packed weights were made from
  c10::IValue packed;
};

struct PackTable {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Packed> entries;
  int64_t made = 0;

  template <typename Pack>
  c10::IValue get(const at::Tensor& owner, std::vector<int64_t> source, Pack pack) {
    const c10::TensorImpl* key = owner.unsafeGetTensorImpl();
    std::lock_guard<std::mutex> lock(mutex);
    auto found = entries.find(key);
    if (found != entries.end() && found->second.source == source) {
      auto alive = found->second.owner.lock();
      if (alive.get() == key) return found->second.packed;
    }
    prune();
    c10::IValue packed = pack();
    entries.erase(key);
    entries.emplace(key, Packed{c10::weak_intrusive_ptr<c10::TensorImpl>(owner.getIntrusivePtr()), source, packed});
    made += 1;
    return packed;
  }

  void prune() {
    for (auto it = entries.begin(); it != entries.end();) it = it->second.owner.expired() ? entries.erase(it) : ++it;
  }

  std::vector<int64_t> counts() {
    std::lock_guard<std::mutex> lock(mutex);
    prune();
    return {made, static_cast<int64_t>(entries.size())};
  }
};

PackTable int8_table, fp16_table;

struct Silent : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

struct FbgemmEngine {  // torch's quantized ops on FBGEMM while packing, their warnings silenced (as in Python)
  Silent silent;
  c10::WarningUtils::WarningHandlerGuard guard{&silent};
  at::QEngine previous;
  FbgemmEngine() : previous(at::globalContext().qEngine()) { at::globalContext().setQEngine(at::QEngine::FBGEMM); }
  ~FbgemmEngine() { at::globalContext().setQEngine(previous); }
};

c10::IValue call(const char* name, std::vector<c10::IValue> stack) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  op.callBoxed(stack);
  return stack[0];
}

at::Tensor int8_fbgemm_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, "int8_fbgemm_linear: weight must be 2-D int8");
  static auto linear = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "");
  c10::IValue packed = int8_table.get(weight, {weight._version(), scale._version()}, [&] {
    FbgemmEngine engine;
    auto zero_points = at::zeros({weight.size(0)}, at::kLong);
    auto quantized = at::_make_per_channel_quantized_tensor(weight, scale.to(at::kDouble), zero_points, 0);
    return call("quantized::linear_prepack", {quantized, c10::IValue()});
  });
  std::vector<c10::IValue> stack{x.contiguous(), packed, true};
  linear.callBoxed(stack);
  return stack[0].toTensor();
}

at::Tensor fp16_fbgemm_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& owner) {
  static auto linear = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic_fp16", "");
  std::vector<int64_t> source{reinterpret_cast<int64_t>(weight.data_ptr()), weight._version()};
  for (auto size : weight.sizes()) source.push_back(size);
  for (auto stride : weight.strides()) source.push_back(stride);
  c10::IValue packed = fp16_table.get(owner, source, [&] {
    FbgemmEngine engine;
    return call("quantized::linear_prepack_fp16", {weight.detach().to(at::kFloat).contiguous(), c10::IValue()});
  });
  std::vector<c10::IValue> stack{x.contiguous(), packed};
  linear.callBoxed(stack);
  return stack[0].toTensor();
}


// ------------------------------------------------------------------------------------------------ AVX-512 products
// Weights are packed in groups of 64 output columns (four 512-bit registers of float32 or int32 sums), each group one
// stream read once per row tile, N padded to a multiple of 64 with zero columns:
// - int8: [N/64][K/4][64][4], four consecutive k of a column side by side (vpdpbusd's operand), K padded to a multiple
//   of 4 with zeros; with each column's sum times 128 (the activations are shifted from int8 to uint8).
// - float32: [N/64][K][64].
constexpr int64_t kGroup = 64;

struct PackedInt8 {
  at::Tensor weight;        // int8 [N/16][K/4][16][4]
  at::Tensor compensation;  // int32 [N padded]: 128 * the column's sum
  int64_t k_padded;
};


struct PackedFloat {
  at::Tensor weight;  // float [N/16][K][16]
};

PackTable vnni_table, fp32_table;

bool cpu_has(const char* feature) {
#ifdef HF_VIT_PLUS_X86
  __builtin_cpu_init();
  if (std::strcmp(feature, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(feature, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (std::strcmp(feature, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
#endif
  (void)feature;
  return false;
}

bool avx512_vnni() {
  static const bool yes = cpu_has("avx512f") && cpu_has("avx512bw") && cpu_has("avx512vnni");
  return yes;
}

bool avx512() {
  static const bool yes = cpu_has("avx512f");
  return yes;
}

c10::IValue pack_int8(const at::Tensor& weight) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t np = (n + kGroup - 1) / kGroup * kGroup, kp = (k + 3) / 4 * 4;
  auto padded = at::zeros({np, kp}, at::kChar);
  padded.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
  auto packed = padded.view({np / kGroup, kGroup, kp / 4, 4}).permute({0, 2, 1, 3}).contiguous();
  auto compensation = (padded.to(at::kInt).sum(1) * 128).to(at::kInt).contiguous();
  auto holder = c10::make_intrusive<c10::ivalue::Tuple>(
      std::vector<c10::IValue>{packed, compensation, c10::IValue(kp)});
  return c10::IValue(holder);
}

c10::IValue pack_float(const at::Tensor& weight) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t np = (n + kGroup - 1) / kGroup * kGroup;
  auto padded = at::zeros({np, k}, at::kFloat);
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({np / kGroup, kGroup, k}).permute({0, 2, 1}).contiguous();
}

// ------------------------------------------------------------------------------------------------------- top-k
// The k largest values of each row (and their indices), largest first, equal values by smaller index first, NaN
// above every number (as torch.topk ranks it). A heap of the k best so far; 16 values at a time are compared with
// its worst and only those above it are looked at one by one, which after the first few hundred is rarely any.
struct Candidate {
  float value;
  int64_t index;
};

// a ranks below b: smaller value (NaN is the largest), or the same value at a larger index
inline bool ranks_below(const Candidate& a, const Candidate& b) {
  const bool a_nan = std::isnan(a.value), b_nan = std::isnan(b.value);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.value != b.value) return a.value < b.value;
  return a.index > b.index;
}

struct WorstFirst {  // std heap comparator: the heap's top is the candidate that ranks lowest
  bool operator()(const Candidate& a, const Candidate& b) const { return ranks_below(b, a); }
};

inline void offer(std::vector<Candidate>& heap, Candidate c) {
  if (!ranks_below(heap.front(), c)) return;
  std::pop_heap(heap.begin(), heap.end(), WorstFirst());
  heap.back() = c;
  std::push_heap(heap.begin(), heap.end(), WorstFirst());
}

#ifdef HF_VIT_PLUS_X86
#define HF_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define HF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

// Each row of x: its int8 values shifted to uint8 (q + 128, q = round(x / s) in [-127, 127]) and s = max|x| / 127,
// as `FastLinear`'s Python definition of dynamic int8 computes them (division, round half to even).
HF_AVX512_VNNI void quantize_rows_u8(const float* x, int64_t rows, int64_t k, int64_t kp, uint8_t* out,
                                     float* scales) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* row = x + m * k;
    __m512 amax = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(row + i)));
    float top = _mm512_reduce_max_ps(amax);
    for (; i < k; ++i) top = std::max(top, std::fabs(row[i]));
    const float scale = std::max(top, 1e-12f) / 127.0f;
    scales[m] = scale;
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    uint8_t* dst = out + m * kp;
    i = 0;
    for (; i + 16 <= k; i += 16) {
      __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(row + i), vscale),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
      __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(q), _mm512_set1_epi32(128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(v));
    }
    for (; i < k; ++i) {
      float q = std::nearbyint(row[i] / scale);
      q = std::min(std::max(q, -127.0f), 127.0f);
      dst[i] = static_cast<uint8_t>(static_cast<int>(q) + 128);
    }
    for (; i < kp; ++i) dst[i] = 128;  // padding: 0 after the shift, times zero weights
  }
}

// ROWS x 64 int32 sums of x_u8 (rows, kp) and the packed weights' column group `group`
template <int ROWS>
HF_AVX512_VNNI void vnni_tile(const uint8_t* x, int64_t kp, const int8_t* w, int64_t group, int32_t* out) {
  const int64_t kq = kp / 4;
  __m512i acc[ROWS][4];
#pragma GCC unroll 6
  for (int m = 0; m < ROWS; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_si512();
  const int8_t* base = w + group * kq * 256;
  for (int64_t q = 0; q < kq; ++q) {
    const int8_t* step = base + q * 256;
    _mm_prefetch(reinterpret_cast<const char*>(step + 1024), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step + 1088), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step + 1152), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step + 1216), _MM_HINT_T0);
    __m512i b[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) b[j] = _mm512_loadu_si512(step + j * 64);
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) {
      int32_t four;
      std::memcpy(&four, x + m * kp + q * 4, 4);
      const __m512i a = _mm512_set1_epi32(four);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], a, b[j]);
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < ROWS; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_storeu_si512(out + m * 64 + j * 16, acc[m][j]);
}

// The column groups [first, last) of the int8 product: sums, then float(sum - compensation) * (s_x * s_w) + bias, as
// the Python definition computes it (no fused multiply-add)
HF_AVX512_VNNI void int8_vnni_groups(int64_t first, int64_t last, const uint8_t* xq, const float* xs, int64_t rows,
                                     int64_t kp, const int8_t* w, const int32_t* comp, const float* scale,
                                     const float* bias, int64_t n, float* out) {
  alignas(64) int32_t sums[6 * 64];
  for (int64_t g = first; g < last; ++g) {
    for (int64_t m = 0; m < rows; m += 6) {
      const int64_t r = std::min<int64_t>(6, rows - m);
      const uint8_t* xm = xq + m * kp;
      switch (r) {
        case 6: vnni_tile<6>(xm, kp, w, g, sums); break;
        case 5: vnni_tile<5>(xm, kp, w, g, sums); break;
        case 4: vnni_tile<4>(xm, kp, w, g, sums); break;
        case 3: vnni_tile<3>(xm, kp, w, g, sums); break;
        case 2: vnni_tile<2>(xm, kp, w, g, sums); break;
        default: vnni_tile<1>(xm, kp, w, g, sums); break;
      }
      for (int64_t i = 0; i < r; ++i) {
        const __m512 sx = _mm512_set1_ps(xs[m + i]);
        for (int64_t j = 0; j < 4; ++j) {
          const int64_t col = g * kGroup + j * 16;
          if (col >= n) break;
          const int64_t valid = std::min<int64_t>(16, n - col);
          const __mmask16 mask = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
          __m512i acc = _mm512_loadu_si512(sums + i * 64 + j * 16);
          acc = _mm512_sub_epi32(acc, _mm512_loadu_si512(comp + col));
          const __m512 sw = _mm512_maskz_loadu_ps(mask, scale + col);
          __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sx, sw));
          if (bias != nullptr) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, bias + col));
          _mm512_mask_storeu_ps(out + (m + i) * n + col, mask, y);
        }
      }
    }
  }
}

void int8_vnni_kernel(const float* x, int64_t rows, int64_t k, const PackedInt8& packed, const float* scale,
                      const float* bias, int64_t n, float* out) {
  const int64_t kp = packed.k_padded, groups = (n + kGroup - 1) / kGroup;
  std::vector<uint8_t> xq(rows * kp);
  std::vector<float> xs(rows);
  quantize_rows_u8(x, rows, k, kp, xq.data(), xs.data());
  const int8_t* w = packed.weight.data_ptr<int8_t>();
  const int32_t* comp = packed.compensation.data_ptr<int32_t>();
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
    int8_vnni_groups(first, last, xq.data(), xs.data(), rows, kp, w, comp, scale, bias, n, out);
  });
}

// ROWS x 64 columns (group `group`) of x @ w^T + bias, stored for the columns below n
template <int ROWS>
HF_AVX512 void fp32_tile(const float* x, int64_t k, const float* w, int64_t group, const float* bias, int64_t n,
                         float* out) {
  __m512 acc[ROWS][4];
  __mmask16 masks[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int64_t col = group * kGroup + j * 16;
    const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(16, n - col));
    masks[j] = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(masks[j], bias + col) : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) acc[m][j] = b;
  }
  const float* base = w + group * k * kGroup;
  for (int64_t q = 0; q < k; ++q) {
    const float* step = base + q * kGroup;
    _mm_prefetch(reinterpret_cast<const char*>(step + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step + 272), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step + 288), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(step + 304), _MM_HINT_T0);
    __m512 b[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) b[j] = _mm512_loadu_ps(step + j * 16);
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) {
      const __m512 a = _mm512_set1_ps(x[m * k + q]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_fmadd_ps(a, b[j], acc[m][j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) _mm512_mask_storeu_ps(out + m * n + group * kGroup + j * 16, masks[j], acc[m][j]);
}

HF_AVX512 void fp32_groups(int64_t first, int64_t last, const float* x, int64_t rows, int64_t k, const float* w,
                           const float* bias, int64_t n, float* out) {
  for (int64_t g = first; g < last; ++g) {
    int64_t m = 0;
    for (; m + 6 <= rows; m += 6) fp32_tile<6>(x + m * k, k, w, g, bias, n, out + m * n);
    switch (rows - m) {
      case 5: fp32_tile<5>(x + m * k, k, w, g, bias, n, out + m * n); break;
      case 4: fp32_tile<4>(x + m * k, k, w, g, bias, n, out + m * n); break;
      case 3: fp32_tile<3>(x + m * k, k, w, g, bias, n, out + m * n); break;
      case 2: fp32_tile<2>(x + m * k, k, w, g, bias, n, out + m * n); break;
      case 1: fp32_tile<1>(x + m * k, k, w, g, bias, n, out + m * n); break;
      default: break;
    }
  }
}

void fp32_packed_kernel(const float* x, int64_t rows, int64_t k, const float* w, const float* bias, int64_t n,
                        float* out) {
  const int64_t groups = (n + kGroup - 1) / kGroup;
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) { fp32_groups(first, last, x, rows, k, w, bias, n, out); });
}

// -------------------------------------------------------------------------------------- attention of one new token
// One query per row against keys and values read in place: no score over a masked or padded position is computed, and
// beam search's cache history is followed inside the loop (no gathered copy of the cache). Rows x heads are shared
// among the threads. Heads of a multiple of 16 dimensions (AVX-512), else the caller's graph runs.

// out[0:d] = softmax over j < count of (q . k_j * scaling + bias_j) applied to v_j; k_j = keys + offsets[j], v_j likewise
HF_AVX512 void attend(const float* q, const float* keys, const float* values, const int64_t* offsets, int64_t count,
                      const float* bias, int64_t d, float scaling, float* scores, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    const float* k = keys + offsets[j];
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
    float score = _mm512_reduce_add_ps(acc) * scaling;
    if (bias != nullptr) score += bias[j];
    scores[j] = score;
    top = std::max(top, score);
  }
  float total = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = top == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(scores[j] - top);
    total += scores[j];
  }
  for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(out + i, _mm512_setzero_ps());
  for (int64_t j = 0; j < count; ++j) {
    const __m512 p = _mm512_set1_ps(scores[j] / total);
    const float* v = values + offsets[j];
    for (int64_t i = 0; i < d; i += 16)
      _mm512_storeu_ps(out + i, _mm512_fmadd_ps(p, _mm512_loadu_ps(v + i), _mm512_loadu_ps(out + i)));
  }
}

HF_AVX512 void cache_attention_rows(int64_t first, int64_t last, const float* query, const float* keys,
                                    const float* values, const int64_t* history, int64_t length, int64_t count,
                                    int64_t heads, int64_t dim, float scaling, float* out) {
  const int64_t d = dim / heads;
  std::vector<int64_t> offsets(count);
  std::vector<float> scores(count);
  for (int64_t task = first; task < last; ++task) {
    const int64_t r = task / heads, h = task % heads;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t slot = history != nullptr ? history[r * length + j] : r;
      offsets[j] = (slot * length + j) * dim + h * d;
    }
    attend(query + r * dim + h * d, keys, values, offsets.data(), count, nullptr, d, scaling, scores.data(),
           out + r * dim + h * d);
  }
}

HF_AVX512 void source_attention_rows(int64_t first, int64_t last, const float* query, const float* keys,
                                     const float* values, const float* bias, int64_t group, int64_t length,
                                     int64_t heads, int64_t dim, float scaling, float* out) {
  const int64_t d = dim / heads;
  std::vector<int64_t> offsets(length);
  std::vector<float> scores(length);
  for (int64_t task = first; task < last; ++task) {
    const int64_t r = task / heads, h = task % heads, b = r / group;
    for (int64_t j = 0; j < length; ++j) offsets[j] = (b * length + j) * dim + h * d;
    attend(query + r * dim + h * d, keys, values, offsets.data(), length, bias + b * length, d, scaling,
           scores.data(), out + r * dim + h * d);
  }
}

HF_AVX512 void topk_row_avx512(const float* row, int64_t n, int64_t k, std::vector<Candidate>& heap) {
  int64_t i = k;
  for (; i + 16 <= n; i += 16) {
    // lanes not <= the worst kept value (greater, or NaN on either side): looked at one by one
    const __m512 worst = _mm512_set1_ps(heap.front().value);
    __mmask16 above = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), worst, _CMP_NLE_UQ);
    while (above) {
      const int lane = __builtin_ctz(above);
      above &= above - 1;
      offer(heap, Candidate{row[i + lane], i + lane});
    }
  }
  for (; i < n; ++i) offer(heap, Candidate{row[i], i});
}
#endif

const float* bias_pointer(const c10::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
              "bias must be a contiguous float tensor of the output size");
  return bias->data_ptr<float>();
}

// x @ (weight * scale[:, None])^T + bias with x's rows quantized to int8 at run time (per row, symmetric), int32 sums
at::Tensor int8_vnni_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                            const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(avx512_vnni(), "int8_vnni_linear needs a CPU with AVX512-VNNI");
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, "int8_vnni_linear: weight must be 2-D int8");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == weight.size(1), "x must be (M, K) float");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == weight.size(0), "scale: one float per row");
  const int64_t n = weight.size(0);
  c10::IValue entry = vnni_table.get(weight, {weight._version()}, [&] { return pack_int8(weight); });
  auto parts = entry.toTuple()->elements();
  PackedInt8 packed{parts[0].toTensor(), parts[1].toTensor(), parts[2].toInt()};
  auto input = x.contiguous();
  auto scales = scale.contiguous();
  auto out = at::empty({x.size(0), n}, x.options());
#ifdef HF_VIT_PLUS_X86
  int8_vnni_kernel(input.data_ptr<float>(), input.size(0), input.size(1), packed, scales.data_ptr<float>(),
                   bias_pointer(bias, n), n, out.data_ptr<float>());
#endif
  return out;
}

// x @ weight^T + bias in float32, the weights packed once into column blocks (AVX-512 FMA)
at::Tensor fp32_packed_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(avx512(), "fp32_packed_linear needs a CPU with AVX-512");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "fp32_packed_linear: weight must be 2-D float");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == weight.size(1), "x must be (M, K) float");
  const int64_t n = weight.size(0);
  std::vector<int64_t> source{reinterpret_cast<int64_t>(weight.data_ptr()), weight._version()};
  for (auto size : weight.sizes()) source.push_back(size);
  for (auto stride : weight.strides()) source.push_back(stride);
  at::Tensor packed = fp32_table.get(weight, source, [&] { return pack_float(weight); }).toTensor();
  auto input = x.contiguous();
  auto out = at::empty({x.size(0), n}, x.options());
#ifdef HF_VIT_PLUS_X86
  fp32_packed_kernel(input.data_ptr<float>(), input.size(0), input.size(1), packed.data_ptr<float>(),
                     bias_pointer(bias, n), n, out.data_ptr<float>());
#endif
  return out;
}


// Masked self-attention of one new token per row over the positions 0..position of its cache (R, L, D); history:
// empty (row r's positions are in slot r) or (R, L) int64, the slot holding each position of row r (beam search).
at::Tensor cache_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& position, const c10::optional<at::Tensor>& history, int64_t heads,
                           double scaling) {
  TORCH_CHECK(avx512(), "cache_attention needs a CPU with AVX-512");
  const int64_t rows = keys.size(0), length = keys.size(1), dim = keys.size(2);
  TORCH_CHECK(dim % heads == 0 && (dim / heads) % 16 == 0, "cache_attention: heads of a multiple of 16 dimensions");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes(), "contiguous caches");
  TORCH_CHECK(query.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat, "float tensors");
  const int64_t count = std::min<int64_t>(position.item<int64_t>() + 1, length);
  auto q = query.contiguous();
  const bool follow = history.has_value() && history->defined();
  at::Tensor slots = follow ? history->to(at::kLong).contiguous() : at::Tensor();
  auto out = at::empty({rows, dim}, query.options());
#ifdef HF_VIT_PLUS_X86
  const int64_t* h = follow ? slots.data_ptr<int64_t>() : nullptr;
  const float *qp = q.data_ptr<float>(), *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, count * dim / heads));
  at::parallel_for(0, rows * heads, grain, [&](int64_t first, int64_t last) {
    cache_attention_rows(first, last, qp, kp, vp, h, length, count, heads, dim, static_cast<float>(scaling), op);
  });
#endif
  return out;
}

// Attention of each row over its source: keys, values (B, S, D), the R rows being B sources x R/B beams; bias (B, S):
// 0 for real tokens, -inf for padding.
at::Tensor source_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& bias, int64_t heads, double scaling) {
  TORCH_CHECK(avx512(), "source_attention needs a CPU with AVX-512");
  const int64_t rows = query.size(0), batch = keys.size(0), length = keys.size(1), dim = keys.size(2);
  TORCH_CHECK(dim % heads == 0 && (dim / heads) % 16 == 0, "source_attention: heads of a multiple of 16 dimensions");
  TORCH_CHECK(rows % batch == 0, "source_attention: rows must be a multiple of the sources");
  auto q = query.contiguous();
  auto k = keys.contiguous();
  auto v = values.contiguous();
  auto b = bias.to(at::kFloat).contiguous();
  auto out = at::empty({rows, dim}, query.options());
#ifdef HF_VIT_PLUS_X86
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, length * dim / heads));
  at::parallel_for(0, rows * heads, grain, [&](int64_t first, int64_t last) {
    source_attention_rows(first, last, qp, kp, vp, bp, rows / batch, length, heads, dim, static_cast<float>(scaling), op);
  });
#endif
  return out;
}

// torch.topk(x, k, dim=1) of a 2-D float tensor, ties by smaller index (see `topk_row_avx512`); `vectorized`: the
// AVX-512 comparisons where the CPU has them (false: the plain loop, as on other CPUs)
std::tuple<at::Tensor, at::Tensor> topk_rows(const at::Tensor& x, int64_t k, bool vectorized) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "topk_rows: a 2-D float tensor");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(k >= 1 && k <= n, "topk_rows: k must be in [1, ", n, "]");
  auto input = x.contiguous();
  auto values = at::empty({rows, k}, x.options());
  auto indices = at::empty({rows, k}, x.options().dtype(at::kLong));
  const float* data = input.data_ptr<float>();
  float* out_values = values.data_ptr<float>();
  int64_t* out_indices = indices.data_ptr<int64_t>();
  const bool vector = vectorized && avx512();
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / n), [&](int64_t first, int64_t last) {
    std::vector<Candidate> heap(k);
    for (int64_t r = first; r < last; ++r) {
      const float* row = data + r * n;
      for (int64_t i = 0; i < k; ++i) heap[i] = Candidate{row[i], i};
      std::make_heap(heap.begin(), heap.end(), WorstFirst());
#ifdef HF_VIT_PLUS_X86
      if (vector) {
        topk_row_avx512(row, n, k, heap);
      } else {
        for (int64_t i = k; i < n; ++i) offer(heap, Candidate{row[i], i});
      }
#else
      for (int64_t i = k; i < n; ++i) offer(heap, Candidate{row[i], i});
#endif
      std::sort_heap(heap.begin(), heap.end(), WorstFirst());  // best first
      for (int64_t i = 0; i < k; ++i) {
        out_values[r * k + i] = heap[i].value;
        out_indices[r * k + i] = heap[i].index;
      }
    }
  });
  return {values, indices};
}

std::vector<int64_t> cpu_kernels() { return {avx512_vnni(), avx512()}; }

std::vector<int64_t> pack_counts() {
  auto int8 = int8_table.counts();
  auto fp16 = fp16_table.counts();
  auto vnni = vnni_table.counts();
  auto fp32 = fp32_table.counts();
  return {int8[0], int8[1], fp16[0], fp16[1], vnni[0], vnni[1], fp32[0], fp32[1]};
}

}  // namespace

TORCH_LIBRARY(hf_vit_plus_cpp, m) {
  m.def("int8_fbgemm_linear(Tensor x, Tensor weight, Tensor scale) -> Tensor");
  m.def("fp16_fbgemm_linear(Tensor x, Tensor weight, Tensor owner) -> Tensor");
  m.def("int8_vnni_linear(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor");
  m.def("fp32_packed_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("cache_attention(Tensor query, Tensor keys, Tensor values, Tensor position, Tensor? history, int heads, float scaling) -> Tensor");
  m.def("source_attention(Tensor query, Tensor keys, Tensor values, Tensor bias, int heads, float scaling) -> Tensor");
  m.def("topk_rows(Tensor x, int k, bool vectorized=True) -> (Tensor values, Tensor indices)");
  m.def("pack_counts() -> int[]", pack_counts);
  m.def("cpu_kernels() -> int[]", cpu_kernels);
}

TORCH_LIBRARY_IMPL(hf_vit_plus_cpp, CPU, m) {
  m.impl("int8_fbgemm_linear", int8_fbgemm_linear);
  m.impl("fp16_fbgemm_linear", fp16_fbgemm_linear);
  m.impl("int8_vnni_linear", int8_vnni_linear);
  m.impl("fp32_packed_linear", fp32_packed_linear);
  m.impl("cache_attention", cache_attention);
  m.impl("source_attention", source_attention);
  m.impl("topk_rows", topk_rows);
}
