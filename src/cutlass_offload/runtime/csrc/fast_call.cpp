// Host fast path of an offloaded-region call (issue 17: under 5 us per call).
//
// The Python path (runtime/region.py) maps a call onto the launcher's args struct
// and, once a call signature (sizes, strides, dtype, device of each operand) has
// mapped with every operand read in place, keeps those args. This object holds
// the same cached args per signature and replays them in C++: check the operands'
// metadata, patch their data pointers and a freshly allocated output into a copy of
// the args, and call the library's launcher on the current stream. Anything else
// (a new signature, a misaligned pointer, a status other than ok) returns None and
// the Python path handles the call, so this file never decides what a call means.
// A signature may hold more than the operands: "guard" inputs whose metadata must
// match but whose pointers the kernel never reads (an attention mask folded into
// the causal argument, checked once per shape in Python), and the values of the
// region's int inputs (sizes a region reads under dynamic shapes).
//
// Built against the running PyTorch (runtime/fast_call.py); uses only libc10 /
// libtorch / libtorch_python, no CUDA headers: the current stream comes from the
// device guard PyTorch's CUDA library registers (c10::impl::VirtualGuardImpl).
//
// It also holds the CUDA kernel of the region ops (runtime/ops.py,
// ``cutlass_offload::region_<T>t_<I>i(Tensor t0, ..., SymInt i0, ..., int key)``)
// once ``install_region_op`` is called for one: a call whose key is bound to a
// FastCall replays it without entering Python; anything it declines goes to the
// Python implementation given at install (with the GIL). So Inductor's compiled
// glue calls an offloaded region as it calls an aten op: the dispatcher, then C++.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// int co_<region>(const Args*, cudaStream_t): emit/templates/prelude.h
using RunFn = int (*)(const void* args, void* stream);

constexpr int64_t kMaxArgsBytes = 1024;   // the largest args struct is ~200 bytes
constexpr int kMaxOperands = 8;
constexpr int kMaxInputs = 32;             // a call with more inputs is declined
constexpr int kOk = 0;

struct Operand {
  int64_t input;    // position in the call's inputs
  int64_t offset;   // byte offset of its pointer field in the args struct
  int64_t align;    // its data pointer must be a multiple of this (bytes)
};

struct Meta {
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
  c10::Device device;
};

struct Entry {
  std::vector<Meta> operands;                 // parallel to FastCall::operands_
  std::vector<Meta> guards;                   // parallel to FastCall::guards_
  std::vector<int64_t> ints;                  // parallel to FastCall::int_inputs_
  std::string args;                           // the cached args, pointers to be patched
  std::vector<int64_t> out_sizes, out_strides;
  c10::ScalarType out_dtype;
  int64_t workspace_need;
};

// One input of a call: a tensor, or an int (a region's SymInt input at run time).
struct Input {
  const at::Tensor* tensor = nullptr;
  int64_t value = 0;
  bool is_int = false;
};
using Inputs = std::array<Input, kMaxInputs>;

// The inputs of a Python call ``xs`` (a tuple); false when one is neither a tensor
// nor an int, or there are too many.
bool inputs_of(PyObject* xs, Inputs& in) {
  const Py_ssize_t n = PyTuple_GET_SIZE(xs);
  if (n > kMaxInputs) {
    return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PyTuple_GET_ITEM(xs, i);
    if (THPVariable_Check(o)) {
      in[i] = {&THPVariable_Unpack(o), 0, false};
    } else if (PyLong_CheckExact(o)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      in[i] = {nullptr, static_cast<int64_t>(v), true};
    } else {
      return false;
    }
  }
  return true;
}

Meta meta_of(const at::Tensor& t) {
  return {t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device()};
}

bool matches(const Meta& m, const at::Tensor& t) {
  return t.scalar_type() == m.dtype && t.device() == m.device &&
         t.sizes() == c10::IntArrayRef(m.sizes) && t.strides() == c10::IntArrayRef(m.strides);
}

void put(char* args, int64_t offset, const void* value, size_t bytes) {
  std::memcpy(args + offset, value, bytes);
}

class FastCall {
 public:
  FastCall(uintptr_t run, int64_t args_bytes, int64_t n_inputs,
           const std::vector<std::tuple<int64_t, int64_t, int64_t>>& operands,
           int64_t out_offset, int64_t out_align, int64_t workspace_offset,
           int64_t workspace_bytes_offset, int64_t max_entries,
           const std::vector<int64_t>& guards, const std::vector<int64_t>& int_inputs)
      : run_(reinterpret_cast<RunFn>(run)), args_bytes_(args_bytes), n_inputs_(n_inputs),
        guards_(guards), int_inputs_(int_inputs),
        out_offset_(out_offset), out_align_(out_align), ws_offset_(workspace_offset),
        ws_bytes_offset_(workspace_bytes_offset), max_entries_(max_entries) {
    if (run == 0) {
      throw std::invalid_argument("FastCall: null launcher");
    }
    if (args_bytes <= 0 || args_bytes > kMaxArgsBytes) {
      throw std::invalid_argument("FastCall: args struct of " + std::to_string(args_bytes) +
                                  " bytes (at most " + std::to_string(kMaxArgsBytes) + ")");
    }
    if (operands.empty() || operands.size() > kMaxOperands) {
      throw std::invalid_argument("FastCall: 1 to 8 operands");
    }
    if (n_inputs > kMaxInputs) {
      throw std::invalid_argument("FastCall: at most " + std::to_string(kMaxInputs) + " inputs");
    }
    for (int64_t i : guards) {
      if (i < 0 || i >= n_inputs) {
        throw std::invalid_argument("FastCall: bad guard input");
      }
    }
    for (int64_t i : int_inputs) {
      if (i < 0 || i >= n_inputs) {
        throw std::invalid_argument("FastCall: bad int input");
      }
    }
    for (const auto& [input, offset, align] : operands) {
      check_field(offset, "operand");
      if (input < 0 || input >= n_inputs || align <= 0) {
        throw std::invalid_argument("FastCall: bad operand");
      }
      operands_.push_back({input, offset, align});
    }
    check_field(out_offset, "output");
    check_field(workspace_offset, "workspace");
    check_field(workspace_bytes_offset, "workspace_bytes");
    if (out_align <= 0) {
      throw std::invalid_argument("FastCall: bad output alignment");
    }
  }

  // Cache one signature: the call's inputs ``xs`` (their operands' metadata is the
  // key), the args struct as the Python path launched it, the output tensor it
  // returned (a fresh dense allocation: its sizes and strides are reproduced with
  // empty_strided) and the workspace bytes the launcher needs. False when full or
  // when the output is not such an allocation (a view into a larger buffer).
  bool add(py::tuple xs, py::bytes args, py::handle out, int64_t workspace_need) {
    if (static_cast<int64_t>(entries_.size()) >= max_entries_) {
      return false;
    }
    if (static_cast<int64_t>(xs.size()) != n_inputs_) {
      throw std::invalid_argument("FastCall.add: wrong number of inputs");
    }
    Inputs in;
    if (!inputs_of(xs.ptr(), in)) {
      throw std::invalid_argument("FastCall.add: an input is neither a tensor nor an int");
    }
    Entry e;
    for (const Operand& op : operands_) {
      if (in[op.input].tensor == nullptr) {
        throw std::invalid_argument("FastCall.add: an operand is not a tensor");
      }
      e.operands.push_back(meta_of(*in[op.input].tensor));
    }
    for (int64_t g : guards_) {
      if (in[g].tensor == nullptr) {
        throw std::invalid_argument("FastCall.add: a guard input is not a tensor");
      }
      e.guards.push_back(meta_of(*in[g].tensor));
    }
    for (int64_t i : int_inputs_) {
      if (!in[i].is_int) {
        throw std::invalid_argument("FastCall.add: an int input is not an int");
      }
      e.ints.push_back(in[i].value);
    }
    e.args = std::string(args);
    if (static_cast<int64_t>(e.args.size()) != args_bytes_) {
      throw std::invalid_argument("FastCall.add: args of another size");
    }
    if (!THPVariable_Check(out.ptr())) {
      throw std::invalid_argument("FastCall.add: the output is not a tensor");
    }
    const at::Tensor& o = THPVariable_Unpack(out.ptr());
    if (o.storage_offset() != 0 || !o.is_non_overlapping_and_dense()) {
      return false;       // not a layout empty_strided reproduces: keep the Python path
    }
    e.out_dtype = o.scalar_type();
    e.out_sizes = o.sizes().vec();
    e.out_strides = o.strides().vec();
    e.workspace_need = workspace_need;
    for (const Entry& old : entries_) {
      if (same_key(old, e)) {
        return true;      // already cached
      }
    }
    entries_.push_back(std::move(e));
    return true;
  }

  // The region's reused workspace buffer (a CUDA uint8 tensor), or None.
  void set_workspace(py::handle ws) {
    if (ws.is_none()) {
      workspace_ = at::Tensor();
      return;
    }
    if (!THPVariable_Check(ws.ptr())) {
      throw std::invalid_argument("FastCall.set_workspace: not a tensor");
    }
    workspace_ = THPVariable_Unpack(ws.ptr());
  }

  void clear() { entries_.clear(); }

  // The region's output for ``xs`` launched on the current stream, or None when the
  // call is not a cached signature, a pointer is not aligned, the workspace is too
  // small, or the launcher did not return ok (the Python path then takes the call).
  py::object call(py::tuple xs_obj) {
    PyObject* xs = xs_obj.ptr();
    Inputs in;
    if (PyTuple_GET_SIZE(xs) != n_inputs_ || !inputs_of(xs, in)) {
      return py::none();
    }
    at::Tensor out = launch(in);
    if (!out.defined()) {
      return py::none();
    }
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(out)));
  }

  // The same for a region op call: its ``n_tensors`` tensors and ``n_ints`` ints
  // (concrete values), which ``order`` maps onto the region's inputs (per input:
  // (is_tensor, index); empty: the inputs are exactly the tensors). An undefined
  // tensor when declined. Needs no GIL.
  at::Tensor call_op(const at::Tensor* const* tensors, size_t n_tensors, const int64_t* ints,
                     size_t n_ints, const std::vector<std::pair<bool, int64_t>>& order) {
    if (!enabled_) {
      return at::Tensor();
    }
    Inputs in;
    if (order.empty()) {
      if (static_cast<int64_t>(n_tensors) != n_inputs_ || n_ints != 0) {
        return at::Tensor();
      }
      for (size_t i = 0; i < n_tensors; ++i) {
        in[i] = {tensors[i], 0, false};
      }
      return launch(in);
    }
    if (static_cast<int64_t>(order.size()) != n_inputs_) {
      return at::Tensor();
    }
    size_t want_tensors = 0;
    for (const auto& o : order) {
      want_tensors += o.first ? 1 : 0;
    }
    if (want_tensors != n_tensors || order.size() - want_tensors != n_ints) {
      return at::Tensor();          // not the call this order was made for
    }
    for (size_t i = 0; i < order.size(); ++i) {
      const auto [is_tensor, j] = order[i];
      if (is_tensor) {
        if (j < 0 || j >= static_cast<int64_t>(n_tensors)) {
          return at::Tensor();
        }
        in[i] = {tensors[j], 0, false};
      } else {
        if (j < 0 || j >= static_cast<int64_t>(n_ints)) {
          return at::Tensor();
        }
        in[i] = {nullptr, ints[j], true};
      }
    }
    return launch(in);
  }

  int64_t calls() const { return calls_; }
  int64_t entries() const { return static_cast<int64_t>(entries_.size()); }
  int last_status() const { return last_status_; }
  // False while the region verifies its first call or is disabled: the op's C++
  // kernel then declines every call (the Python path decides).
  bool enabled() const { return enabled_; }
  void set_enabled(bool on) { enabled_ = on; }

 private:
  at::Tensor launch(const Inputs& in) {
    const size_t n_ops = operands_.size();
    std::array<const at::Tensor*, kMaxOperands> ts{};
    for (size_t i = 0; i < n_ops; ++i) {
      ts[i] = in[operands_[i].input].tensor;
      if (ts[i] == nullptr || !ts[i]->defined()) {
        return at::Tensor();
      }
    }
    for (int64_t g : guards_) {
      if (in[g].tensor == nullptr || !in[g].tensor->defined()) {
        return at::Tensor();
      }
    }
    for (int64_t i : int_inputs_) {
      if (!in[i].is_int) {
        return at::Tensor();
      }
    }
    const Entry* hit = nullptr;
    for (const Entry& e : entries_) {
      bool ok = true;
      for (size_t i = 0; i < n_ops && ok; ++i) {
        ok = matches(e.operands[i], *ts[i]);
      }
      for (size_t i = 0; i < guards_.size() && ok; ++i) {
        ok = matches(e.guards[i], *in[guards_[i]].tensor);
      }
      for (size_t i = 0; i < int_inputs_.size() && ok; ++i) {
        ok = e.ints[i] == in[int_inputs_[i]].value;
      }
      if (ok) {
        hit = &e;
        break;
      }
    }
    if (hit == nullptr) {
      return at::Tensor();
    }
    alignas(16) char args[kMaxArgsBytes];
    std::memcpy(args, hit->args.data(), args_bytes_);
    for (size_t i = 0; i < n_ops; ++i) {
      const void* p = ts[i]->data_ptr();
      if (reinterpret_cast<uintptr_t>(p) % operands_[i].align != 0) {
        return at::Tensor();
      }
      put(args, operands_[i].offset, &p, sizeof(p));
    }
    void* ws = nullptr;
    int64_t ws_bytes = 0;
    if (hit->workspace_need > 0) {
      if (!workspace_.defined() || workspace_.nbytes() < static_cast<size_t>(hit->workspace_need)) {
        return at::Tensor();
      }
      ws = workspace_.data_ptr();
      ws_bytes = static_cast<int64_t>(workspace_.nbytes());
    }
    put(args, ws_offset_, &ws, sizeof(ws));
    put(args, ws_bytes_offset_, &ws_bytes, sizeof(ws_bytes));
    const c10::Device device = hit->operands[0].device;
    at::Tensor out = at::empty_strided(hit->out_sizes, hit->out_strides,
                                       at::TensorOptions().dtype(hit->out_dtype).device(device));
    void* d = out.data_ptr();
    if (reinterpret_cast<uintptr_t>(d) % out_align_ != 0) {
      return at::Tensor();
    }
    put(args, out_offset_, &d, sizeof(d));
    void* stream = nullptr;
    if (device.is_cuda()) {
      const c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
      stream = guard.getStreamNativeHandle(guard.getStream(device));
    }
    last_status_ = run_(args, stream);
    if (last_status_ != kOk) {
      return at::Tensor();
    }
    ++calls_;
    return out;
  }

  void check_field(int64_t offset, const char* what) const {
    if (offset < 0 || offset + 8 > args_bytes_) {
      throw std::invalid_argument(std::string("FastCall: ") + what + " field outside the args");
    }
  }

  static bool same_meta(const std::vector<Meta>& a, const std::vector<Meta>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      const Meta &x = a[i], &y = b[i];
      if (x.sizes != y.sizes || x.strides != y.strides || x.dtype != y.dtype || x.device != y.device) {
        return false;
      }
    }
    return true;
  }

  static bool same_key(const Entry& a, const Entry& b) {
    return same_meta(a.operands, b.operands) && same_meta(a.guards, b.guards) && a.ints == b.ints;
  }

  RunFn run_;
  int64_t args_bytes_, n_inputs_;
  std::vector<Operand> operands_;
  std::vector<int64_t> guards_, int_inputs_;
  int64_t out_offset_, out_align_, ws_offset_, ws_bytes_offset_;
  int64_t max_entries_;
  std::vector<Entry> entries_;
  at::Tensor workspace_;
  int64_t calls_ = 0;
  int last_status_ = kOk;
  bool enabled_ = true;
};

// -- the region op's CUDA kernel -----------------------------------------------------

// An op key's replay: the FastCall and how the op's tensors and ints map onto the
// region's inputs (empty: the inputs are exactly the tensors)
struct Bound {
  std::shared_ptr<FastCall> fc;
  std::vector<std::pair<bool, int64_t>> order;
};

std::mutex g_bound_mutex;
std::unordered_map<int64_t, std::shared_ptr<const Bound>> g_bound;   // op key -> replay
// per installed "<namespace>::<op>": the Python implementation, and per op and
// dispatch key the registration (process lifetime: never freed, as the dispatcher
// may call them until exit)
std::unordered_map<std::string, py::object*> g_python_run;
std::unordered_map<std::string, torch::Library*> g_libraries;

void bind(int64_t key, std::shared_ptr<FastCall> fc, std::vector<std::pair<bool, int64_t>> order) {
  if (!fc) {
    throw std::invalid_argument("bind: no FastCall");
  }
  auto b = std::make_shared<const Bound>(Bound{std::move(fc), std::move(order)});
  const std::lock_guard<std::mutex> lock(g_bound_mutex);
  g_bound[key] = std::move(b);
}

void unbind(int64_t key) {
  const std::lock_guard<std::mutex> lock(g_bound_mutex);
  g_bound.erase(key);
}

bool is_bound(int64_t key) {
  const std::lock_guard<std::mutex> lock(g_bound_mutex);
  return g_bound.count(key) != 0;
}

std::shared_ptr<const Bound> bound(int64_t key) {
  const std::lock_guard<std::mutex> lock(g_bound_mutex);
  auto it = g_bound.find(key);
  return it == g_bound.end() ? nullptr : it->second;
}

// One region op call: the bound FastCall's output when it takes the call, else the
// Python implementation's (with the GIL), called as run([tensors], [ints], key).
// ``name``: the op's name (region_<T>t_<I>i).
at::Tensor region_call(const std::string& name, const at::Tensor* const* tensors, size_t n_tensors,
                       const int64_t* ints, size_t n_ints, int64_t key) {
  if (auto b = bound(key)) {
    at::Tensor out = b->fc->call_op(tensors, n_tensors, ints, n_ints, b->order);
    if (out.defined()) {
      return out;
    }
  }
  py::object* run = nullptr;
  {
    const std::lock_guard<std::mutex> lock(g_bound_mutex);
    auto it = g_python_run.find(name);
    if (it == g_python_run.end()) {
      throw std::runtime_error("cutlass_offload: no Python implementation for " + name);
    }
    run = it->second;
  }
  py::gil_scoped_acquire gil;
  py::list py_tensors, py_ints;
  for (size_t i = 0; i < n_tensors; ++i) {
    py_tensors.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(*tensors[i])));
  }
  for (size_t i = 0; i < n_ints; ++i) {
    py_ints.append(ints[i]);
  }
  py::object r = (*run)(py_tensors, py_ints, key);
  if (!THPVariable_Check(r.ptr())) {
    throw std::runtime_error("cutlass_offload region op: the Python implementation returned no tensor");
  }
  return THPVariable_Unpack(r.ptr());
}

// region_<T>t_<I>i(Tensor t0, ..., SymInt i0, ..., int key) -> Tensor, boxed (the
// dispatcher's kernel). A SymInt is guarded to its value, as the Python path does.
void region_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::Stack& s = *stack;
  const size_t n_args = op.schema().arguments().size();      // tensors, ints, key
  const c10::IValue* args = s.data() + (s.size() - n_args);
  const int64_t key = args[n_args - 1].toInt();
  size_t n_tensors = 0;
  while (n_tensors + 1 < n_args && args[n_tensors].isTensor()) {
    ++n_tensors;
  }
  const size_t n_ints = n_args - 1 - n_tensors;
  if (n_tensors > static_cast<size_t>(kMaxInputs) || n_ints > static_cast<size_t>(kMaxInputs)) {
    throw std::runtime_error("cutlass_offload region op: too many inputs");
  }
  std::array<const at::Tensor*, kMaxInputs> ts{};
  std::array<int64_t, kMaxInputs> is{};
  for (size_t i = 0; i < n_tensors; ++i) {
    ts[i] = &args[i].toTensor();
  }
  for (size_t i = 0; i < n_ints; ++i) {
    const c10::IValue& v = args[n_tensors + i];
    is[i] = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
  }
  at::Tensor out = region_call(op.operator_name().name, ts.data(), n_tensors, is.data(), n_ints, key);
  torch::jit::drop(s, n_args);
  torch::jit::push(s, std::move(out));
}

// Register region_boxed as the kernel of "<ns>::<name>" for ``dispatch_key`` (once
// per pair; the op must be defined already). ``run``: the Python implementation,
// (tensors, ints, key) -> Tensor. False when that pair was installed before.
bool install_region_op(py::function run, const std::string& ns, const std::string& dispatch_key,
                       const std::string& name) {
  const std::string full = ns + "::" + name;
  const std::lock_guard<std::mutex> lock(g_bound_mutex);
  if (g_libraries.count(full + "/" + dispatch_key)) {
    return false;
  }
  const c10::DispatchKey k = c10::parseDispatchKey(dispatch_key);
  auto* lib = new torch::Library(torch::Library::IMPL, ns, k, __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&region_boxed>());
  g_libraries[full + "/" + dispatch_key] = lib;
  py::object*& slot = g_python_run[full];
  if (slot == nullptr) {
    slot = new py::object(std::move(run));
  } else {
    *slot = std::move(run);
  }
  return true;
}

}  // namespace

// -- the region ops' C shims -----------------------------------------------------
//
// Inductor's C++ wrapper calls a custom op through the dispatcher
// (aoti_torch_call_dispatcher: a name lookup, StableIValue boxing, the dispatch) unless
// the op is in ``aot_inductor.custom_ops_to_c_shims``; then it calls
// ``aoti_torch_<device>_<op name>(inputs..., AtenTensorHandle* ret0)`` directly
// (torch/_inductor/codegen/cpp_wrapper_cpu.py, get_c_shim_func_name). These are those
// functions for region_<T>t_<I>i, T = 1..8, I = 0..4 (the module's ``shim_arities``),
// the ops' schema in order (tensors, ints, key); runtime/ops.py ``c_shims`` names them
// in that option for the arities a glue graph calls, after making this library's
// symbols global (fast_call.export_symbols: the wrapper resolves them when it is
// loaded; fast_call.map exports nothing else). The cpu ones serve the ops' CPU tensors
// (the Python path) and tests.
//
// A shim cannot throw: the wrapper sees only its error code and raises "API call failed
// at <its file, line>". So a failed call's exception is kept for the calling thread (the
// Python exception itself when the region's Python implementation raised one) and
// ``take_shim_error`` hands it to the glue (runtime/glue.py), which raises it.
namespace {

// A raw reference, not a py::object: a thread's thread_local objects are destroyed at its
// exit, the main thread's after the interpreter is gone, where a decref would crash; an
// exception never taken is leaked instead.
struct ShimError {
  PyObject* exception = nullptr;   // the Python exception raised (a new reference), or null
  std::string message;             // what() of a C++ one
};
thread_local ShimError* t_shim_error = nullptr;

void keep_shim_error(PyObject* exception, std::string message) {
  if (t_shim_error != nullptr) {     // an earlier one nobody took: its reference is dropped
    Py_XDECREF(t_shim_error->exception);
    delete t_shim_error;
  }
  t_shim_error = new ShimError{exception, std::move(message)};
}

AOTITorchError region_shim(const char* name, const AtenTensorHandle* handles, size_t n_tensors,
                           const int64_t* ints, size_t n_ints, int64_t key, AtenTensorHandle* ret0) {
  try {
    std::array<const at::Tensor*, kMaxInputs> ts{};
    for (size_t i = 0; i < n_tensors; ++i) {
      ts[i] = torch::aot_inductor::tensor_handle_to_tensor_pointer(handles[i]);
    }
    at::Tensor out = region_call(name, ts.data(), n_tensors, ints, n_ints, key);
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(out));
    return AOTI_TORCH_SUCCESS;
  } catch (py::error_already_set& e) {
    py::gil_scoped_acquire gil;
    keep_shim_error(e.value().inc_ref().ptr(), e.what());
  } catch (const std::exception& e) {
    py::gil_scoped_acquire gil;
    keep_shim_error(nullptr, e.what());
  } catch (...) {
    py::gil_scoped_acquire gil;
    keep_shim_error(nullptr, "unknown C++ exception");
  }
  return AOTI_TORCH_FAILURE;
}

// (exception or None, message) of this thread's last failed shim call, then forgotten;
// None when there is none.
py::object take_shim_error() {
  ShimError* kept = t_shim_error;
  if (kept == nullptr) {
    return py::none();
  }
  t_shim_error = nullptr;
  py::object exception = kept->exception != nullptr
      ? py::reinterpret_steal<py::object>(kept->exception) : py::none();
  py::object out = py::make_tuple(exception, kept->message);
  delete kept;
  return out;
}

}  // namespace

#define CO_TP_1 AtenTensorHandle t0
#define CO_TP_2 CO_TP_1, AtenTensorHandle t1
#define CO_TP_3 CO_TP_2, AtenTensorHandle t2
#define CO_TP_4 CO_TP_3, AtenTensorHandle t3
#define CO_TP_5 CO_TP_4, AtenTensorHandle t4
#define CO_TP_6 CO_TP_5, AtenTensorHandle t5
#define CO_TP_7 CO_TP_6, AtenTensorHandle t6
#define CO_TP_8 CO_TP_7, AtenTensorHandle t7
#define CO_TA_1 t0
#define CO_TA_2 CO_TA_1, t1
#define CO_TA_3 CO_TA_2, t2
#define CO_TA_4 CO_TA_3, t3
#define CO_TA_5 CO_TA_4, t4
#define CO_TA_6 CO_TA_5, t5
#define CO_TA_7 CO_TA_6, t6
#define CO_TA_8 CO_TA_7, t7
#define CO_IP_0
#define CO_IP_1 , int64_t i0
#define CO_IP_2 CO_IP_1, int64_t i1
#define CO_IP_3 CO_IP_2, int64_t i2
#define CO_IP_4 CO_IP_3, int64_t i3
#define CO_IA_0 0
#define CO_IA_1 i0
#define CO_IA_2 CO_IA_1, i1
#define CO_IA_3 CO_IA_2, i2
#define CO_IA_4 CO_IA_3, i3
#define CO_SHIM(DEV, T, I)                                                                   \
  extern "C" __attribute__((visibility("default"))) AOTITorchError                          \
      aoti_torch_##DEV##_region_##T##t_##I##i(CO_TP_##T CO_IP_##I, int64_t key,             \
                                              AtenTensorHandle* ret0) {                     \
    const AtenTensorHandle ts[] = {CO_TA_##T};                                              \
    const int64_t is[] = {CO_IA_##I};                                                       \
    return region_shim("cutlass_offload::region_" #T "t_" #I "i", ts, T, is, I, key, ret0); \
  }
#define CO_SHIMS_T(DEV, T) \
  CO_SHIM(DEV, T, 0) CO_SHIM(DEV, T, 1) CO_SHIM(DEV, T, 2) CO_SHIM(DEV, T, 3) CO_SHIM(DEV, T, 4)
#define CO_SHIMS(DEV)                                                                  \
  CO_SHIMS_T(DEV, 1) CO_SHIMS_T(DEV, 2) CO_SHIMS_T(DEV, 3) CO_SHIMS_T(DEV, 4)          \
  CO_SHIMS_T(DEV, 5) CO_SHIMS_T(DEV, 6) CO_SHIMS_T(DEV, 7) CO_SHIMS_T(DEV, 8)
CO_SHIMS(cuda)
CO_SHIMS(cpu)

PYBIND11_MODULE(_co_fast_call, m) {
  m.doc() = "cutlass_offload: C++ replay of cached region calls (see runtime/fast_call.py)";
  py::class_<FastCall, std::shared_ptr<FastCall>>(m, "FastCall")
      .def(py::init<uintptr_t, int64_t, int64_t, const std::vector<std::tuple<int64_t, int64_t, int64_t>>&,
                    int64_t, int64_t, int64_t, int64_t, int64_t, const std::vector<int64_t>&,
                    const std::vector<int64_t>&>(),
           py::arg("run"), py::arg("args_bytes"), py::arg("n_inputs"), py::arg("operands"),
           py::arg("out_offset"), py::arg("out_align"), py::arg("workspace_offset"),
           py::arg("workspace_bytes_offset"), py::arg("max_entries") = 64,
           py::arg("guards") = std::vector<int64_t>{}, py::arg("int_inputs") = std::vector<int64_t>{})
      .def("add", &FastCall::add)
      .def("set_workspace", &FastCall::set_workspace)
      .def("clear", &FastCall::clear)
      .def("__call__", &FastCall::call)
      .def_property_readonly("calls", &FastCall::calls)
      .def_property_readonly("entries", &FastCall::entries)
      .def_property_readonly("last_status", &FastCall::last_status)
      .def_property("enabled", &FastCall::enabled, &FastCall::set_enabled);
  m.def("install_region_op", &install_region_op, py::arg("run"), py::arg("namespace") = "cutlass_offload",
        py::arg("dispatch_key") = "CUDA", py::arg("name") = "region_1t_0i",
        "register the C++ kernel of <namespace>::<name> for a dispatch key (once per pair)");
  m.def("bind", &bind, py::arg("key"), py::arg("fast_call"),
        py::arg("order") = std::vector<std::pair<bool, int64_t>>{},
        "replay calls of the region op's ``key`` (an int) with ``fast_call``; ``order``: per "
        "region input (is_tensor, index into the op's tensors / ints), empty when the inputs "
        "are exactly the op's tensors");
  m.def("unbind", &unbind, py::arg("key"));
  m.def("is_bound", &is_bound, py::arg("key"));
  m.def("take_shim_error", &take_shim_error,
        "(exception or None, message) of this thread's last failed C shim call, then "
        "forgotten; None when there is none");
  m.attr("shim_arities") = py::make_tuple(8, 4);    // the C shims above: T <= 8, I <= 4
}
