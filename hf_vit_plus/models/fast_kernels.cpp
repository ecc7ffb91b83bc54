// The C++ kernels of hf_vit_plus's fused decoding step (fast_kernels.py, `cpp_fbgemm_ops`), built once per torch
// install by torch.utils.cpp_extension:
// - FBGEMM's products (int8, float16 weights): each keeps FBGEMM's packed weights in its own table, under the tensor
//   that owns them (a weak reference: an entry whose owner was freed is dropped at the next pack), and calls FBGEMM's
//   ops through the dispatcher (boxed: no header of torch's quantized classes needed). `pack_counts` reads the counts.
// - Products of weights packed once into column blocks (tables like FBGEMM's): `int8_vnni_linear`, dynamic int8 (each
//   row of x quantized to int8 over its own range, int8 weights with one scale per output row, exact int32 sums), and
//   `fp32_packed_linear`, float32 (FMA). Both are for the batched steps, where ATen's products (oneDNN's `_int_mm`
//   repacks the weights at every call, MKL's sgemm) are slow at 4-64 rows.
// - The attention of one new token over its caches (`cache_attention`, `source_attention`) and beam search's top-k
//   (`topk_rows`).
// Each of these has an AVX-512 path (VNNI's vpdpbusd for int8), an AVX2+FMA path (vpmaddubsw / vpmaddwd for int8) and
// a portable one in plain C++ (ARM64, x86 without AVX2), compiled with function attributes (intrinsics behind
// `__x86_64__`: the file builds for any x86 CPU and for aarch64) and chosen at run time: the level `set_cpu_isa` sets
// once per process (fast_kernels.py passes `cpu_isa()`), a level the CPU lacks refused.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <tuple>
#include <utility>
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



// ------------------------------------------------------------------------------------ instruction-set dispatch
// Each kernel below has a path per level: 2 = AVX-512 (F, BW, VL, DQ; VNNI for int8 where the CPU has it), 1 = AVX2
// and FMA, 0 = portable C++ (what the compiler vectorizes: ARM64, x86 without AVX2). The level is set once per process
// by `set_cpu_isa` (fast_kernels.py passes `cpu_isa()`), the CPU's widest until then; a level the CPU lacks is refused.
enum Level : int64_t { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

#ifdef HF_VIT_PLUS_X86
bool cpu_supports_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool cpu_supports_avx512() {
  __builtin_cpu_init();
  return cpu_supports_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool cpu_supports_vnni() {
  __builtin_cpu_init();
  return cpu_supports_avx512() && __builtin_cpu_supports("avx512vnni");
}
#else
bool cpu_supports_avx2() { return false; }
bool cpu_supports_avx512() { return false; }
bool cpu_supports_vnni() { return false; }
#endif

int64_t widest_level() {
  static const int64_t widest = cpu_supports_avx512() ? kAvx512 : cpu_supports_avx2() ? kAvx2 : kGeneric;
  return widest;
}

std::atomic<int64_t> chosen_level{-1};

int64_t level() {
  const int64_t chosen = chosen_level.load(std::memory_order_relaxed);
  return chosen < 0 ? widest_level() : chosen;
}

const char* level_name(int64_t value) { return value == kAvx512 ? "avx512" : value == kAvx2 ? "avx2" : "generic"; }

int64_t set_cpu_isa(int64_t value) {
  TORCH_CHECK(value >= kGeneric && value <= kAvx512, "set_cpu_isa: level ", value,
              " is not one of 0 (generic), 1 (avx2), 2 (avx512)");
  TORCH_CHECK(value <= widest_level(), "set_cpu_isa: level ", level_name(value),
              " asks for more than this CPU has: its widest level is ", level_name(widest_level()));
  chosen_level.store(value, std::memory_order_relaxed);
  return value;
}

// int8 at level 2 runs VNNI's vpdpbusd where the CPU has it, else the AVX2 path
bool vnni_in_use() { return level() == kAvx512 && cpu_supports_vnni(); }

// -------------------------------------------------------------------------------------------- packed weights
// Weights are packed in groups of output columns, each group one stream read once per row tile, N padded to a multiple
// of the group with zero columns: 64 columns at AVX-512 (four 512-bit registers of sums), 16 at AVX2 and generic.
// - int8: [N/G][K/4][G][4], four consecutive k of a column side by side (vpdpbusd's and vpmaddubsw's operand), K
//   padded to a multiple of 4 with zeros; with each column's sum times 128 for VNNI (whose activations are shifted
//   from int8 to uint8). The portable path reads the weights as they are.
// - float32: [N/G][K][G].
constexpr int64_t kGroup = 64, kGroupAvx2 = 16;

int64_t group_width(int64_t at_level) { return at_level == kAvx512 ? kGroup : kGroupAvx2; }

struct PackedInt8 {
  at::Tensor weight;        // int8 [N/G][K/4][G][4]
  at::Tensor compensation;  // int32 [N padded]: 128 * the column's sum
  int64_t k_padded;
};

PackTable vnni_table, fp32_table;

c10::IValue pack_int8(const at::Tensor& weight, int64_t group) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t np = (n + group - 1) / group * group, kp = (k + 3) / 4 * 4;
  auto padded = at::zeros({np, kp}, at::kChar);
  padded.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
  auto packed = padded.view({np / group, group, kp / 4, 4}).permute({0, 2, 1, 3}).contiguous();
  auto compensation = (padded.to(at::kInt).sum(1) * 128).to(at::kInt).contiguous();
  auto holder = c10::make_intrusive<c10::ivalue::Tuple>(
      std::vector<c10::IValue>{packed, compensation, c10::IValue(kp)});
  return c10::IValue(holder);
}

c10::IValue pack_float(const at::Tensor& weight, int64_t group) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t np = (n + group - 1) / group * group;
  auto padded = at::zeros({np, k}, at::kFloat);
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({np / group, group, k}).permute({0, 2, 1}).contiguous();
}

// ------------------------------------------------------------------------------------------------------- top-k
// The k largest values of each row (and their indices), largest first, equal values by smaller index first, NaN
// above every number (as torch.topk ranks it). Vectorized (at every level): a threshold from the maxima of blocks of
// 16 values (`topk_row_by_threshold`), then only the values at or above it ranked. The plain loop, and a row with a
// NaN: a heap of the k best so far (with vector comparisons of 16 (AVX-512) or 8 (AVX2) values at a time against its
// worst on those levels).
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

void topk_row_generic(const float* row, int64_t n, int64_t k, std::vector<Candidate>& heap) {
  for (int64_t i = k; i < n; ++i) offer(heap, Candidate{row[i], i});
}

// The threshold pass of the vectorized top-k: the largest value of each block of kTopkBlock values. The k-th largest
// of these k or more maxima is at most the row's k-th largest value (they are k values of the row), so no value below
// it is among the k largest, and the few values at or above it are all that is ranked. A row with a NaN goes through
// the heap instead (NaN ranks above every number, which comparisons do not say).
constexpr int64_t kTopkBlock = 16;

struct TopkScratch {
  std::vector<float> maxima;
  std::vector<Candidate> picked;
};

// the maxima of the row's whole blocks into `maxima`; whether the row holds a NaN
bool block_maxima_generic(const float* row, int64_t n, float* maxima) {
  bool nan = false;
  for (int64_t b = 0; b < n / kTopkBlock; ++b) {
    float top = row[b * kTopkBlock];
    for (int64_t i = 0; i < kTopkBlock; ++i) {
      const float v = row[b * kTopkBlock + i];
      nan |= v != v;
      top = v > top ? v : top;
    }
    maxima[b] = top;
  }
  for (int64_t i = n / kTopkBlock * kTopkBlock; i < n; ++i) nan |= row[i] != row[i];
  return nan;
}

// the values >= threshold from index `from` on, with their indices, in index order
void at_least_generic(const float* row, int64_t n, float threshold, std::vector<Candidate>& picked, int64_t from = 0) {
  for (int64_t i = from; i < n; ++i)
    if (row[i] >= threshold) picked.push_back(Candidate{row[i], i});
}

// the lanes set in `hits` of the vector at row + i, in index order (the vector paths' comparisons)
inline void picked_lanes(const float* row, int64_t i, uint32_t hits, std::vector<Candidate>& picked) {
  while (hits) {
    const int lane = __builtin_ctz(hits);
    hits &= hits - 1;
    picked.push_back(Candidate{row[i + lane], i + lane});
  }
}

using BlockMaximaFn = bool (*)(const float*, int64_t, float*);
using AtLeastFn = void (*)(const float*, int64_t, float, std::vector<Candidate>&, int64_t);

// The k best of a row without NaN from its block maxima: false (nothing written) where the row has a NaN or fewer
// than k whole blocks; else the k largest values, largest first, equal values by smaller index
bool topk_row_by_threshold(const float* row, int64_t n, int64_t k, BlockMaximaFn maxima_of, AtLeastFn at_least,
                           TopkScratch& scratch, float* out_values, int64_t* out_indices) {
  const int64_t blocks = n / kTopkBlock;
  if (blocks < k) return false;
  scratch.maxima.resize(blocks);
  if (maxima_of(row, n, scratch.maxima.data())) return false;
  std::nth_element(scratch.maxima.begin(), scratch.maxima.begin() + (k - 1), scratch.maxima.end(),
                   [](float a, float b) { return a > b; });
  scratch.picked.clear();
  at_least(row, n, scratch.maxima[k - 1], scratch.picked, 0);
  std::partial_sort(scratch.picked.begin(), scratch.picked.begin() + k, scratch.picked.end(),
                    [](const Candidate& a, const Candidate& b) {
                      return a.value > b.value || (a.value == b.value && a.index < b.index);
                    });
  for (int64_t i = 0; i < k; ++i) {
    out_values[i] = scratch.picked[i].value;
    out_indices[i] = scratch.picked[i].index;
  }
  return true;
}

// ------------------------------------------------------------------------------------ portable (generic) paths
// Plain C++: what runs on ARM64 and on x86 without AVX2, and the reference the tests hold the others to.

// Each row of x quantized to int8 as `FastLinear`'s Python definition of dynamic int8 does it: s = max|x| / 127,
// q = round(x / s) (division, half to even) in [-127, 127]; `magnitudes` gets |q| (vpmaddubsw's unsigned operand).
// Rows are padded with zeros to kp values.
void quantize_rows_s8(const float* x, int64_t rows, int64_t k, int64_t kp, int8_t* out, uint8_t* magnitudes,
                      float* scales) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* row = x + m * k;
    float top = 0.0f;
    for (int64_t i = 0; i < k; ++i) top = std::max(top, std::fabs(row[i]));
    const float scale = std::max(top, 1e-12f) / 127.0f;
    scales[m] = scale;
    int8_t* dst = out + m * kp;
    for (int64_t i = 0; i < k; ++i) {
      const float q = std::min(std::max(std::nearbyint(row[i] / scale), -127.0f), 127.0f);
      dst[i] = static_cast<int8_t>(q);
    }
    for (int64_t i = k; i < kp; ++i) dst[i] = 0;
    if (magnitudes != nullptr)
      for (int64_t i = 0; i < kp; ++i) magnitudes[m * kp + i] = static_cast<uint8_t>(std::abs(int(dst[i])));
  }
}

// The columns [first, last) of the int8 product from int8 weights as they are (N, K): int32 sums, then
// float(sum) * (s_x * s_w) + bias, as the Python definition computes it
void int8_generic_columns(int64_t first, int64_t last, const int8_t* xq, const float* xs, int64_t rows, int64_t k,
                          const int8_t* w, const float* scale, const float* bias, int64_t n, float* out) {
  for (int64_t c = first; c < last; ++c) {
    const int8_t* wc = w + c * k;
    for (int64_t m = 0; m < rows; ++m) {
      const int8_t* xm = xq + m * k;
      int32_t sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += int32_t(xm[i]) * int32_t(wc[i]);
      float y = float(sum) * (xs[m] * scale[c]);
      if (bias != nullptr) y = y + bias[c];
      out[m * n + c] = y;
    }
  }
}

// Column groups [first, last) of x @ w^T + bias from weights packed [N/16][K][16]: the inner loop over a group's 16
// columns is what the compiler vectorizes (no reordering of a sum)
void fp32_generic_groups(int64_t first, int64_t last, const float* x, int64_t rows, int64_t k, const float* w,
                         const float* bias, int64_t n, float* out) {
  constexpr int64_t G = kGroupAvx2;
  for (int64_t g = first; g < last; ++g) {
    const float* base = w + g * k * G;
    const int64_t valid = std::min<int64_t>(G, n - g * G);
    for (int64_t m = 0; m < rows; ++m) {
      float acc[G];
      for (int64_t j = 0; j < G; ++j) acc[j] = (bias != nullptr && j < valid) ? bias[g * G + j] : 0.0f;
      const float* xm = x + m * k;
      for (int64_t q = 0; q < k; ++q) {
        const float a = xm[q];
        const float* step = base + q * G;
        for (int64_t j = 0; j < G; ++j) acc[j] += a * step[j];
      }
      for (int64_t j = 0; j < valid; ++j) out[m * n + g * G + j] = acc[j];
    }
  }
}

// out[0:d] = softmax over j < count of (q . k_j * scaling + bias_j) applied to v_j; k_j = keys + offsets[j], v_j likewise
void attend_generic(const float* q, const float* keys, const float* values, const int64_t* offsets, int64_t count,
                    const float* bias, int64_t d, float scaling, float* scores, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    const float* k = keys + offsets[j];
    float acc = 0.0f;
    for (int64_t i = 0; i < d; ++i) acc += q[i] * k[i];
    float score = acc * scaling;
    if (bias != nullptr) score += bias[j];
    scores[j] = score;
    top = std::max(top, score);
  }
  float total = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = top == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(scores[j] - top);
    total += scores[j];
  }
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    const float p = scores[j] / total;
    const float* v = values + offsets[j];
    for (int64_t i = 0; i < d; ++i) out[i] += p * v[i];
  }
}

#ifdef HF_VIT_PLUS_X86
#define HF_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define HF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define HF_AVX2 __attribute__((target("avx2,fma")))

// exp's argument reduction and polynomial (Cephes' expf): x = n ln2 + r, |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r);
// below kExpFloor (the smallest normal float's log) the attention kernels' exp is 0
constexpr float kExpFloor = -87.33654f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// ------------------------------------------------------------------------------------------------ AVX-512 paths
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

// The four sums of the lanes of a0..a3, as the lanes 0..3 of one vector
HF_AVX512 inline __m128 sums4_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // per 128-bit lane: [a0 0+2, a1 0+2, a0 1+3, a1 1+3], then [a0, a1, a2, a3] (that lane's part of each sum)
  const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// exp(x) for x <= 0 (scores less their maximum): 0 below kExpFloor, NaN kept (Cephes' expf polynomial, 2^n by scalef)
HF_AVX512 inline __m512 exp_avx512(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFloor), _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_set1_ps(kExpFloor), x);  // (a NaN x is the operand returned)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

// Attention of one new token (see `attend_generic`), 16 dimensions at a time: heads of a multiple of 16. The scores
// four keys at a time (one reduction for four), their exponentials 16 at a time, and the output in registers for
// heads of up to 16 * kRegisterBlocks dimensions (M: d / 16; 0: any multiple of 16, the output in memory).
template <int M>
HF_AVX512 void attend_avx512_blocks(const float* q, const float* keys, const float* values, const int64_t* offsets,
                                    int64_t count, const float* bias, int64_t d, float scaling, float* scores,
                                    float* out) {
  const int64_t blocks = M > 0 ? M : d / 16;
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    const float *k0 = keys + offsets[j], *k1 = keys + offsets[j + 1], *k2 = keys + offsets[j + 2],
                *k3 = keys + offsets[j + 3];
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < blocks * 16; i += 16) {
      const __m512 qi = _mm512_loadu_ps(q + i);
      a0 = _mm512_fmadd_ps(qi, _mm512_loadu_ps(k0 + i), a0);
      a1 = _mm512_fmadd_ps(qi, _mm512_loadu_ps(k1 + i), a1);
      a2 = _mm512_fmadd_ps(qi, _mm512_loadu_ps(k2 + i), a2);
      a3 = _mm512_fmadd_ps(qi, _mm512_loadu_ps(k3 + i), a3);
    }
    __m128 s = _mm_mul_ps(sums4_avx512(a0, a1, a2, a3), _mm_set1_ps(scaling));
    if (bias != nullptr) s = _mm_add_ps(s, _mm_loadu_ps(bias + j));
    _mm_storeu_ps(scores + j, s);
  }
  for (; j < count; ++j) {
    const float* k = keys + offsets[j];
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < blocks * 16; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
    float score = _mm512_reduce_add_ps(acc) * scaling;
    if (bias != nullptr) score += bias[j];
    scores[j] = score;
  }
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 most = minus_inf;
  for (j = 0; j < count; j += 16) {
    const __mmask16 lanes = count - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - j)) - 1);
    most = _mm512_max_ps(_mm512_mask_loadu_ps(minus_inf, lanes, scores + j), most);  // a NaN score left out
  }
  const float top = _mm512_reduce_max_ps(most);
  __m512 sums = _mm512_setzero_ps();
  for (j = 0; j < count; j += 16) {
    const __mmask16 lanes = count - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - j)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(lanes, scores + j);
    const __m512 e = top == -std::numeric_limits<float>::infinity()
                         ? _mm512_setzero_ps()
                         : exp_avx512(_mm512_sub_ps(x, _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + j, lanes, e);
    sums = _mm512_mask_add_ps(sums, lanes, sums, e);
  }
  const __m512 scale = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sums));
  if constexpr (M > 0) {
    __m512 acc[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
    for (j = 0; j < count; ++j) {
      const __m512 p = _mm512_set1_ps(scores[j]);
      const float* v = values + offsets[j];
      for (int i = 0; i < M; ++i) acc[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * i), acc[i]);
    }
    for (int i = 0; i < M; ++i) _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(acc[i], scale));
  } else {
    for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(out + i, _mm512_setzero_ps());
    for (j = 0; j < count; ++j) {
      const __m512 p = _mm512_set1_ps(scores[j]);
      const float* v = values + offsets[j];
      for (int64_t i = 0; i < d; i += 16)
        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(p, _mm512_loadu_ps(v + i), _mm512_loadu_ps(out + i)));
    }
    for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(out + i), scale));
  }
}

HF_AVX512 void attend_avx512(const float* q, const float* keys, const float* values, const int64_t* offsets,
                             int64_t count, const float* bias, int64_t d, float scaling, float* scores, float* out) {
  switch (d / 16) {
    case 1: return attend_avx512_blocks<1>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 2: return attend_avx512_blocks<2>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 3: return attend_avx512_blocks<3>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 4: return attend_avx512_blocks<4>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 6: return attend_avx512_blocks<6>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 8: return attend_avx512_blocks<8>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    default: return attend_avx512_blocks<0>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
  }
}

HF_AVX512 bool block_maxima_avx512(const float* row, int64_t n, float* maxima) {
  __mmask16 nan = 0;
  int64_t b = 0;
  for (; b < n / kTopkBlock; ++b) {
    const __m512 v = _mm512_loadu_ps(row + b * kTopkBlock);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    maxima[b] = _mm512_reduce_max_ps(v);
  }
  bool tail_nan = false;
  for (int64_t i = b * kTopkBlock; i < n; ++i) tail_nan |= row[i] != row[i];
  return nan != 0 || tail_nan;
}

HF_AVX512 void at_least_avx512(const float* row, int64_t n, float threshold, std::vector<Candidate>& picked,
                               int64_t from) {
  const __m512 bound = _mm512_set1_ps(threshold);
  int64_t i = from;
  for (; i + 16 <= n; i += 16)
    picked_lanes(row, i, _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), bound, _CMP_GE_OQ), picked);
  at_least_generic(row, n, threshold, picked, i);
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

// --------------------------------------------------------------------------------------------------- AVX2 paths
// int8 without VNNI: vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16 with saturation, so the
// activations enter as |q| (0..127) and the weights with q's sign (vpsignb): a pair sums to at most 2 * 127 * 127 =
// 32258 < 32767, never saturated, and vpmaddwd by ones adds the pairs into int32: the exact sums, bit for bit those of
// `torch._int_mm` (the weights are in [-127, 127]: `quantize_rows`).

// ROWS x 16 int32 sums (two registers of 8 columns) of the group `group` of weights packed [N/16][K/4][16][4]
template <int ROWS>
HF_AVX2 void int8_tile_avx2(const int8_t* xq, const uint8_t* xa, int64_t kp, const int8_t* w, int64_t group,
                            int32_t* out) {
  const int64_t kq = kp / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[ROWS][2];
#pragma GCC unroll 4
  for (int m = 0; m < ROWS; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  const int8_t* base = w + group * kq * 64;
  for (int64_t q = 0; q < kq; ++q) {
    const int8_t* step = base + q * 64;
    _mm_prefetch(reinterpret_cast<const char*>(step + 512), _MM_HINT_T0);
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(step));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(step + 32));
#pragma GCC unroll 4
    for (int m = 0; m < ROWS; ++m) {
      int32_t signed_four, magnitude_four;
      std::memcpy(&signed_four, xq + m * kp + q * 4, 4);
      std::memcpy(&magnitude_four, xa + m * kp + q * 4, 4);
      const __m256i s = _mm256_set1_epi32(signed_four), a = _mm256_set1_epi32(magnitude_four);
      acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(b0, s)), ones));
      acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(b1, s)), ones));
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < ROWS; ++m) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * 16), acc[m][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * 16 + 8), acc[m][1]);
  }
}

// The column groups [first, last) of the int8 product: sums, then float(sum) * (s_x * s_w) + bias, as the Python
// definition computes it (no fused multiply-add)
HF_AVX2 void int8_avx2_groups(int64_t first, int64_t last, const int8_t* xq, const uint8_t* xa, const float* xs,
                              int64_t rows, int64_t kp, const int8_t* w, const float* scale, const float* bias,
                              int64_t n, float* out) {
  constexpr int64_t G = kGroupAvx2;
  alignas(32) int32_t sums[4 * G];
  for (int64_t g = first; g < last; ++g) {
    for (int64_t m = 0; m < rows; m += 4) {
      const int64_t r = std::min<int64_t>(4, rows - m);
      switch (r) {
        case 4: int8_tile_avx2<4>(xq + m * kp, xa + m * kp, kp, w, g, sums); break;
        case 3: int8_tile_avx2<3>(xq + m * kp, xa + m * kp, kp, w, g, sums); break;
        case 2: int8_tile_avx2<2>(xq + m * kp, xa + m * kp, kp, w, g, sums); break;
        default: int8_tile_avx2<1>(xq + m * kp, xa + m * kp, kp, w, g, sums); break;
      }
      for (int64_t i = 0; i < r; ++i) {
        const float sx = xs[m + i];
        float* row = out + (m + i) * n;
        for (int64_t j = 0; j < G; j += 8) {
          const int64_t col = g * G + j;
          if (col + 8 <= n) {
            const __m256 sxw = _mm256_mul_ps(_mm256_set1_ps(sx), _mm256_loadu_ps(scale + col));
            const __m256i acc = _mm256_load_si256(reinterpret_cast<const __m256i*>(sums + i * G + j));
            __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), sxw);
            if (bias != nullptr) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + col));
            _mm256_storeu_ps(row + col, y);
          } else {
            for (int64_t c = col; c < n && c < col + 8; ++c) {
              float y = float(sums[i * G + (c - g * G)]) * (sx * scale[c]);
              if (bias != nullptr) y = y + bias[c];
              row[c] = y;
            }
          }
        }
      }
    }
  }
}

// ROWS x (16 GROUPS) columns of x @ w^T + bias from weights packed [N/16][K][16], the groups `group` ..
// `group + GROUPS - 1`: 2 GROUPS registers of 8 sums per row (6 x 16 and 3 x 32: 12 accumulators), stored for the
// columns below n
template <int ROWS, int GROUPS>
HF_AVX2 void fp32_tile_avx2(const float* x, int64_t k, const float* w, int64_t group, const float* bias, int64_t n,
                            float* out) {
  constexpr int64_t G = kGroupAvx2;
  constexpr int V = 2 * GROUPS;
  __m256 acc[ROWS][V];
#pragma GCC unroll 4
  for (int j = 0; j < V; ++j) {
    const int64_t col = group * G + j * 8;
    __m256 b = _mm256_setzero_ps();
    if (bias != nullptr) {
      if (col + 8 <= n) {
        b = _mm256_loadu_ps(bias + col);
      } else {
        alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t c = col; c < n; ++c) tail[c - col] = bias[c];
        b = _mm256_load_ps(tail);
      }
    }
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) acc[m][j] = b;
  }
  const float* base = w + group * k * G;
  for (int64_t q = 0; q < k; ++q) {
    __m256 b[V];
#pragma GCC unroll 2
    for (int g = 0; g < GROUPS; ++g) {
      const float* step = base + g * k * G + q * G;
      _mm_prefetch(reinterpret_cast<const char*>(step + 8 * G), _MM_HINT_T0);
      b[2 * g] = _mm256_loadu_ps(step);
      b[2 * g + 1] = _mm256_loadu_ps(step + 8);
    }
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) {
      const __m256 a = _mm256_broadcast_ss(x + m * k + q);
#pragma GCC unroll 4
      for (int j = 0; j < V; ++j) acc[m][j] = _mm256_fmadd_ps(a, b[j], acc[m][j]);
    }
  }
  // (every index of acc a constant once unrolled, so that the accumulators stay in registers)
#pragma GCC unroll 4
  for (int j = 0; j < V; ++j) {
    const int64_t col = group * G + j * 8;
#pragma GCC unroll 6
    for (int m = 0; m < ROWS; ++m) {
      if (col + 8 <= n) {
        _mm256_storeu_ps(out + m * n + col, acc[m][j]);
      } else if (col < n) {
        alignas(32) float tail[8];
        _mm256_store_ps(tail, acc[m][j]);
        for (int64_t c = col; c < n; ++c) out[m * n + c] = tail[c - col];
      }
    }
  }
}

template <int GROUPS>
HF_AVX2 void fp32_rows_avx2(int64_t g, const float* x, int64_t rows, int64_t k, const float* w, const float* bias,
                            int64_t n, float* out) {
  constexpr int64_t R = GROUPS == 2 ? 3 : 6;  // 12 accumulators
  int64_t m = 0;
  for (; m + R <= rows; m += R) fp32_tile_avx2<R, GROUPS>(x + m * k, k, w, g, bias, n, out + m * n);
  switch (rows - m) {
    case 5: fp32_tile_avx2<5, 1>(x + m * k, k, w, g, bias, n, out + m * n); break;  // (GROUPS 1 only: R = 6)
    case 4: fp32_tile_avx2<4, 1>(x + m * k, k, w, g, bias, n, out + m * n); break;
    case 3: fp32_tile_avx2<3, 1>(x + m * k, k, w, g, bias, n, out + m * n); break;
    case 2: fp32_tile_avx2<2, GROUPS>(x + m * k, k, w, g, bias, n, out + m * n); break;
    case 1: fp32_tile_avx2<1, GROUPS>(x + m * k, k, w, g, bias, n, out + m * n); break;
    default: break;
  }
}

// Column groups [first, last): few rows (at most 3) two groups at a time (3 x 32), more rows one group (6 x 16)
HF_AVX2 void fp32_avx2_groups(int64_t first, int64_t last, const float* x, int64_t rows, int64_t k, const float* w,
                              const float* bias, int64_t n, float* out) {
  int64_t g = first;
  if (rows <= 3)
    for (; g + 2 <= last; g += 2) fp32_rows_avx2<2>(g, x, rows, k, w, bias, n, out);
  for (; g < last; ++g) fp32_rows_avx2<1>(g, x, rows, k, w, bias, n, out);
}

HF_AVX2 inline float sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The four sums of the lanes of a0..a3, as the lanes 0..3 of one vector
HF_AVX2 inline __m128 sums4_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  // per 128-bit lane: a0..a3
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// exp(x) for x <= 0 (see `exp_avx512`): 2^n built in the exponent bits
HF_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kExpFloor), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(kExpFloor), x);  // (a NaN x is the operand returned)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, two_n));
}

// Attention of one new token (see `attend_generic`), 8 dimensions at a time: heads of a multiple of 8, as
// `attend_avx512_blocks` (M: d / 8, the output in registers; 0: in memory)
template <int M>
HF_AVX2 void attend_avx2_blocks(const float* q, const float* keys, const float* values, const int64_t* offsets,
                                int64_t count, const float* bias, int64_t d, float scaling, float* scores, float* out) {
  const int64_t blocks = M > 0 ? M : d / 8;
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) {
    const float *k0 = keys + offsets[j], *k1 = keys + offsets[j + 1], *k2 = keys + offsets[j + 2],
                *k3 = keys + offsets[j + 3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < blocks * 8; i += 8) {
      const __m256 qi = _mm256_loadu_ps(q + i);
      a0 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k0 + i), a0);
      a1 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k1 + i), a1);
      a2 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k2 + i), a2);
      a3 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k3 + i), a3);
    }
    __m128 s = _mm_mul_ps(sums4_avx2(a0, a1, a2, a3), _mm_set1_ps(scaling));
    if (bias != nullptr) s = _mm_add_ps(s, _mm_loadu_ps(bias + j));
    _mm_storeu_ps(scores + j, s);
  }
  for (; j < count; ++j) {
    const float* k = keys + offsets[j];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < blocks * 8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
    float score = sum_avx2(acc) * scaling;
    if (bias != nullptr) score += bias[j];
    scores[j] = score;
  }
  float top = -std::numeric_limits<float>::infinity();
  for (j = 0; j < count; ++j) top = std::max(top, scores[j]);
  float total = 0.0f;
  if (top == -std::numeric_limits<float>::infinity()) {
    for (j = 0; j < count; ++j) scores[j] = 0.0f;
  } else {
    const __m256 most = _mm256_set1_ps(top);
    __m256 sums = _mm256_setzero_ps();
    for (j = 0; j + 8 <= count; j += 8) {
      const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j), most));
      _mm256_storeu_ps(scores + j, e);
      sums = _mm256_add_ps(sums, e);
    }
    if (j < count) {  // the tail through a full vector, its unused lanes -inf (exp: 0)
      alignas(32) float tail[8];
      for (int i = 0; i < 8; ++i) tail[i] = j + i < count ? scores[j + i] : -std::numeric_limits<float>::infinity();
      const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_load_ps(tail), most));
      _mm256_store_ps(tail, e);
      for (int64_t i = 0; j + i < count; ++i) scores[j + i] = tail[i];
      sums = _mm256_add_ps(sums, e);
    }
    total = sum_avx2(sums);
  }
  const __m256 scale = _mm256_set1_ps(1.0f / total);
  if constexpr (M > 0) {
    __m256 acc[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
    for (j = 0; j < count; ++j) {
      const __m256 p = _mm256_set1_ps(scores[j]);
      const float* v = values + offsets[j];
      for (int i = 0; i < M; ++i) acc[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * i), acc[i]);
    }
    for (int i = 0; i < M; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(acc[i], scale));
  } else {
    for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(out + i, _mm256_setzero_ps());
    for (j = 0; j < count; ++j) {
      const __m256 p = _mm256_set1_ps(scores[j]);
      const float* v = values + offsets[j];
      for (int64_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
    }
    for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), scale));
  }
}

HF_AVX2 void attend_avx2(const float* q, const float* keys, const float* values, const int64_t* offsets,
                         int64_t count, const float* bias, int64_t d, float scaling, float* scores, float* out) {
  switch (d / 8) {
    case 1: return attend_avx2_blocks<1>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 2: return attend_avx2_blocks<2>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 4: return attend_avx2_blocks<4>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    case 8: return attend_avx2_blocks<8>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
    default: return attend_avx2_blocks<0>(q, keys, values, offsets, count, bias, d, scaling, scores, out);
  }
}

HF_AVX2 bool block_maxima_avx2(const float* row, int64_t n, float* maxima) {
  __m256 nan = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b < n / kTopkBlock; ++b) {
    const __m256 lo = _mm256_loadu_ps(row + b * kTopkBlock), hi = _mm256_loadu_ps(row + b * kTopkBlock + 8);
    nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(lo, lo, _CMP_UNORD_Q), _mm256_cmp_ps(hi, hi, _CMP_UNORD_Q)));
    __m256 top = _mm256_max_ps(lo, hi);
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
    maxima[b] = _mm_cvtss_f32(half);
  }
  bool tail_nan = false;
  for (int64_t i = b * kTopkBlock; i < n; ++i) tail_nan |= row[i] != row[i];
  return _mm256_movemask_ps(nan) != 0 || tail_nan;
}

HF_AVX2 void at_least_avx2(const float* row, int64_t n, float threshold, std::vector<Candidate>& picked,
                           int64_t from) {
  const __m256 bound = _mm256_set1_ps(threshold);
  int64_t i = from;
  for (; i + 8 <= n; i += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), bound, _CMP_GE_OQ));
    picked_lanes(row, i, uint32_t(hits), picked);
  }
  at_least_generic(row, n, threshold, picked, i);
}

HF_AVX2 void topk_row_avx2(const float* row, int64_t n, int64_t k, std::vector<Candidate>& heap) {
  int64_t i = k;
  for (; i + 8 <= n; i += 8) {
    const __m256 worst = _mm256_set1_ps(heap.front().value);
    unsigned above = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), worst, _CMP_NLE_UQ)));
    while (above) {
      const int lane = __builtin_ctz(above);
      above &= above - 1;
      offer(heap, Candidate{row[i + lane], i + lane});
    }
  }
  for (; i < n; ++i) offer(heap, Candidate{row[i], i});
}
#endif  // HF_VIT_PLUS_X86

using AttendFn = void (*)(const float*, const float*, const float*, const int64_t*, int64_t, const float*, int64_t,
                          float, float*, float*);

// the attention kernel of the level in use and the multiple of dimensions its heads need
std::pair<AttendFn, int64_t> attention_kernel() {
#ifdef HF_VIT_PLUS_X86
  if (level() == kAvx512) return {attend_avx512, 16};
  if (level() == kAvx2) return {attend_avx2, 8};
#endif
  return {attend_generic, 1};
}

// ------------------------------------------------------------------------------------------------- the operators
const float* bias_pointer(const c10::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
              "bias must be a contiguous float tensor of the output size");
  return bias->data_ptr<float>();
}

// x @ (weight * scale[:, None])^T + bias with x's rows quantized to int8 at run time (per row, symmetric), int32 sums:
// VNNI at AVX-512 where the CPU has it, else vpmaddubsw (AVX2), else plain loops
at::Tensor int8_vnni_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                            const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, "int8_vnni_linear: weight must be 2-D int8");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == weight.size(1), "x must be (M, K) float");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == weight.size(0), "scale: one float per row");
  const int64_t n = weight.size(0), rows = x.size(0), k = x.size(1);
  auto input = x.contiguous();
  auto scales = scale.contiguous();
  auto out = at::empty({rows, n}, x.options());
  const float* xp = input.data_ptr<float>();
  const float* sp = scales.data_ptr<float>();
  const float* bp = bias_pointer(bias, n);
  float* op = out.data_ptr<float>();
  const int64_t at_level = level();
  const bool vnni = vnni_in_use();
  if (at_level == kGeneric) {
    auto w = weight.contiguous();
    std::vector<int8_t> xq(rows * k);
    std::vector<float> xs(rows);
    quantize_rows_s8(xp, rows, k, k, xq.data(), nullptr, xs.data());
    const int8_t* wp = w.data_ptr<int8_t>();
    at::parallel_for(0, n, 16, [&](int64_t first, int64_t last) {
      int8_generic_columns(first, last, xq.data(), xs.data(), rows, k, wp, sp, bp, n, op);
    });
    return out;
  }
  const int64_t group = vnni ? kGroup : kGroupAvx2;
  c10::IValue entry = vnni_table.get(weight, {weight._version(), group}, [&] { return pack_int8(weight, group); });
  auto parts = entry.toTuple()->elements();
  PackedInt8 packed{parts[0].toTensor(), parts[1].toTensor(), parts[2].toInt()};
  const int64_t kp = packed.k_padded, groups = (n + group - 1) / group;
  const int8_t* wp = packed.weight.data_ptr<int8_t>();
  std::vector<float> xs(rows);
#ifdef HF_VIT_PLUS_X86
  if (vnni) {
    std::vector<uint8_t> xq(rows * kp);
    quantize_rows_u8(xp, rows, k, kp, xq.data(), xs.data());
    const int32_t* comp = packed.compensation.data_ptr<int32_t>();
    at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
      int8_vnni_groups(first, last, xq.data(), xs.data(), rows, kp, wp, comp, sp, bp, n, op);
    });
  } else {
    std::vector<int8_t> xq(rows * kp);
    std::vector<uint8_t> xa(rows * kp);
    quantize_rows_s8(xp, rows, k, kp, xq.data(), xa.data(), xs.data());
    at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
      int8_avx2_groups(first, last, xq.data(), xa.data(), xs.data(), rows, kp, wp, sp, bp, n, op);
    });
  }
#endif
  (void)kp, (void)groups, (void)wp;
  return out;
}

// x @ weight^T + bias in float32, the weights packed once into column blocks (FMA at AVX-512 and AVX2)
at::Tensor fp32_packed_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "fp32_packed_linear: weight must be 2-D float");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == weight.size(1), "x must be (M, K) float");
  const int64_t n = weight.size(0), at_level = level(), group = group_width(at_level);
  std::vector<int64_t> source{reinterpret_cast<int64_t>(weight.data_ptr()), weight._version(), group};
  for (auto size : weight.sizes()) source.push_back(size);
  for (auto stride : weight.strides()) source.push_back(stride);
  at::Tensor packed = fp32_table.get(weight, source, [&] { return pack_float(weight, group); }).toTensor();
  auto input = x.contiguous();
  auto out = at::empty({x.size(0), n}, x.options());
  const float *xp = input.data_ptr<float>(), *wp = packed.data_ptr<float>(), *bp = bias_pointer(bias, n);
  float* op = out.data_ptr<float>();
  const int64_t rows = input.size(0), k = input.size(1), groups = (n + group - 1) / group;
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
#ifdef HF_VIT_PLUS_X86
    if (at_level == kAvx512) return fp32_groups(first, last, xp, rows, k, wp, bp, n, op);
    if (at_level == kAvx2) return fp32_avx2_groups(first, last, xp, rows, k, wp, bp, n, op);
#endif
    fp32_generic_groups(first, last, xp, rows, k, wp, bp, n, op);
  });
  return out;
}

void cache_attention_rows(int64_t first, int64_t last, AttendFn attend, const float* query, const float* keys,
                          const float* values, const int64_t* history, int64_t length, int64_t count, int64_t heads,
                          int64_t dim, float scaling, float* out) {
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

void source_attention_rows(int64_t first, int64_t last, AttendFn attend, const float* query, const float* keys,
                           const float* values, const float* bias, int64_t group, int64_t length, int64_t heads,
                           int64_t dim, float scaling, float* out) {
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

// Masked self-attention of one new token per row over the positions 0..position of its cache (R, L, D); history:
// empty (row r's positions are in slot r) or (R, L) int64, the slot holding each position of row r (beam search).
// One query per row against keys and values read in place: no score over a masked or padded position is computed, and
// beam search's cache history is followed inside the loop (no gathered copy of the cache). Rows x heads are shared
// among the threads.
at::Tensor cache_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& position, const c10::optional<at::Tensor>& history, int64_t heads,
                           double scaling) {
  const auto kernel = attention_kernel();
  const AttendFn attend = kernel.first;
  const int64_t multiple = kernel.second;
  const int64_t rows = keys.size(0), length = keys.size(1), dim = keys.size(2);
  TORCH_CHECK(dim % heads == 0 && (dim / heads) % multiple == 0, "cache_attention: heads of a multiple of ", multiple,
              " dimensions at ", level_name(level()));
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes(), "contiguous caches");
  TORCH_CHECK(query.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat, "float tensors");
  // (read in place where it is a CPU int64 scalar: `item()` is a dispatched op, paid at every step)
  const int64_t newest = position.numel() == 1 && position.scalar_type() == at::kLong && position.device().is_cpu()
                         ? *position.data_ptr<int64_t>()
                         : position.item<int64_t>();
  const int64_t count = std::min<int64_t>(newest + 1, length);
  auto q = query.contiguous();
  const bool follow = history.has_value() && history->defined();
  at::Tensor slots;  // (no dispatched conversion where the history is an int64 tensor already)
  if (follow) slots = history->scalar_type() == at::kLong ? history->contiguous() : history->to(at::kLong).contiguous();
  auto out = at::empty({rows, dim}, query.options());
  const int64_t* h = follow ? slots.data_ptr<int64_t>() : nullptr;
  const float *qp = q.data_ptr<float>(), *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, count * dim / heads));
  at::parallel_for(0, rows * heads, grain, [&](int64_t first, int64_t last) {
    cache_attention_rows(first, last, attend, qp, kp, vp, h, length, count, heads, dim, static_cast<float>(scaling),
                         op);
  });
  return out;
}

// Attention of each row over its source: keys, values (B, S, D), the R rows being B sources x R/B beams; bias (B, S):
// 0 for real tokens, -inf for padding.
at::Tensor source_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& bias, int64_t heads, double scaling) {
  const auto kernel = attention_kernel();
  const AttendFn attend = kernel.first;
  const int64_t multiple = kernel.second;
  const int64_t rows = query.size(0), batch = keys.size(0), length = keys.size(1), dim = keys.size(2);
  TORCH_CHECK(dim % heads == 0 && (dim / heads) % multiple == 0, "source_attention: heads of a multiple of ",
              multiple, " dimensions at ", level_name(level()));
  TORCH_CHECK(rows % batch == 0, "source_attention: rows must be a multiple of the sources");
  auto q = query.contiguous();
  auto k = keys.contiguous();
  auto v = values.contiguous();
  auto b = bias.scalar_type() == at::kFloat ? bias.contiguous() : bias.to(at::kFloat).contiguous();
  auto out = at::empty({rows, dim}, query.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, length * dim / heads));
  at::parallel_for(0, rows * heads, grain, [&](int64_t first, int64_t last) {
    source_attention_rows(first, last, attend, qp, kp, vp, bp, rows / batch, length, heads, dim,
                          static_cast<float>(scaling), op);
  });
  return out;
}

// torch.topk(x, k, dim=1) of a 2-D float tensor, ties by smaller index; `vectorized`: the vector comparisons of the
// level in use (false: the plain loop, the portable path)
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
  auto scan = topk_row_generic;
  BlockMaximaFn maxima_of = block_maxima_generic;
  AtLeastFn at_least = at_least_generic;
#ifdef HF_VIT_PLUS_X86
  if (vectorized && level() == kAvx512) scan = topk_row_avx512, maxima_of = block_maxima_avx512,
                                         at_least = at_least_avx512;
  if (vectorized && level() == kAvx2) scan = topk_row_avx2, maxima_of = block_maxima_avx2, at_least = at_least_avx2;
#endif
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / n), [&](int64_t first, int64_t last) {
    std::vector<Candidate> heap(k);
    TopkScratch scratch;
    for (int64_t r = first; r < last; ++r) {
      const float* row = data + r * n;
      if (vectorized && topk_row_by_threshold(row, n, k, maxima_of, at_least, scratch, out_values + r * k,
                                              out_indices + r * k))
        continue;
      for (int64_t i = 0; i < k; ++i) heap[i] = Candidate{row[i], i};
      std::make_heap(heap.begin(), heap.end(), WorstFirst());
      scan(row, n, k, heap);
      std::sort_heap(heap.begin(), heap.end(), WorstFirst());  // best first
      for (int64_t i = 0; i < k; ++i) {
        out_values[r * k + i] = heap[i].value;
        out_indices[r * k + i] = heap[i].index;
      }
    }
  });
  return {values, indices};
}

// [the level in use, its widest on this CPU, whether int8 runs VNNI]
std::vector<int64_t> cpu_kernels() { return {level(), widest_level(), vnni_in_use()}; }

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
  m.def("set_cpu_isa(int level) -> int", set_cpu_isa);
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
