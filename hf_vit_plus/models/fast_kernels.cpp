// The C++ kernels of hf_vit_plus's FBGEMM products (fast_kernels.py, `cpp_fbgemm_ops`), built once per torch install
// by torch.utils.cpp_extension. Each keeps FBGEMM's packed weights in its own table, under the tensor that owns them
// (a weak reference: an entry whose owner was freed is dropped at the next pack), and calls FBGEMM's ops through the
// dispatcher (boxed: no header of torch's quantized classes needed). `pack_counts` reads the tables' counts.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>
#include <vector>

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

std::vector<int64_t> pack_counts() {
  auto int8 = int8_table.counts();
  auto fp16 = fp16_table.counts();
  return {int8[0], int8[1], fp16[0], fp16[1]};
}

}  // namespace

TORCH_LIBRARY(hf_vit_plus_cpp, m) {
  m.def("int8_fbgemm_linear(Tensor x, Tensor weight, Tensor scale) -> Tensor");
  m.def("fp16_fbgemm_linear(Tensor x, Tensor weight, Tensor owner) -> Tensor");
  m.def("pack_counts() -> int[]", pack_counts);
}

TORCH_LIBRARY_IMPL(hf_vit_plus_cpp, CPU, m) {
  m.impl("int8_fbgemm_linear", int8_fbgemm_linear);
  m.impl("fp16_fbgemm_linear", fp16_fbgemm_linear);
}
