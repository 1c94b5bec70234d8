// kfoundry SYCL host shim: a C API over the oneAPI SYCL runtime, loaded by kfoundry/plugins/backends/sycl.py
// with ctypes. Built on first use with g++ against the pip wheels intel-sycl-rt / intel-opencl-rt (no icpx):
// device code is compiled at run time by the kernel-compiler extension (source_language::sycl).
//
// Conventions: functions returning a pointer return NULL on failure; functions returning int return < 0 on
// failure. After every call, kf_message() holds the error, the build log or the JSON asked for
// (thread-local; read it before the next call on the same thread).
#define SYCL_DISABLE_FSYCL_SYCLHPP_WARNING 1
#include <CL/cl.h>
#include <sycl/sycl.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

namespace {

thread_local std::string g_msg;

std::vector<sycl::device>& all_devices() {
  static std::vector<sycl::device> devices;
  return devices;
}

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

const char* type_name(sycl::info::device_type t) {
  switch (t) {
    case sycl::info::device_type::cpu: return "cpu";
    case sycl::info::device_type::gpu: return "gpu";
    case sycl::info::device_type::accelerator: return "accelerator";
    default: return "other";
  }
}

const char* backend_name(sycl::backend b) {
  switch (b) {
    case sycl::backend::opencl: return "opencl";
    case sycl::backend::ext_oneapi_level_zero: return "level_zero";
    case sycl::backend::ext_oneapi_cuda: return "cuda";
    case sycl::backend::ext_oneapi_hip: return "hip";
    default: return "other";
  }
}

struct Context {
  sycl::device device;
  sycl::context context;
  std::optional<sycl::queue> queue;
  std::mutex errors_lock;
  std::string async_errors;
};

struct Bundle {
  sycl::kernel_bundle<sycl::bundle_state::executable> exe;
};

thread_local std::vector<std::byte> g_content;

// The local memory an OpenCL-backend kernel uses on its device (clGetKernelWorkGroupInfo; the shim links the
// wheel's ICD loader where it has one: KF_HAVE_OPENCL); -1 where it cannot be read.
long long opencl_local_mem(const sycl::kernel& k, const sycl::device& d) {
#ifdef KF_HAVE_OPENCL
  if (k.get_backend() != sycl::backend::opencl) return -1;
  cl_kernel ck = sycl::get_native<sycl::backend::opencl>(k);  // retained for us: released below
  cl_device_id cd = sycl::get_native<sycl::backend::opencl>(d);
  cl_ulong bytes = 0;
  cl_int rc = clGetKernelWorkGroupInfo(ck, cd, CL_KERNEL_LOCAL_MEM_SIZE, sizeof bytes, &bytes, nullptr);
  clReleaseKernel(ck);
  return rc == CL_SUCCESS ? static_cast<long long>(bytes) : -1;
#else
  (void)k;
  (void)d;
  return -1;
#endif
}

template <int D>
sycl::nd_range<D> make_range(const size_t* global, const size_t* local) {
  sycl::range<D> g, l;
  for (int i = 0; i < D; ++i) {
    g[i] = global[i];
    l[i] = local ? local[i] : 1;
  }
  return sycl::nd_range<D>(g, l);
}

// Argument kinds, as kfoundry/plugins/backends/sycl.py numbers them.
enum ArgKind : int {
  KF_PTR = 0, KF_I8, KF_U8, KF_I16, KF_U16, KF_I32, KF_U32, KF_I64, KF_U64, KF_F16, KF_F32, KF_F64, KF_LOCAL
};

template <typename T>
T bits_as(uint64_t v) {
  T out;
  std::memcpy(static_cast<void*>(&out), &v, sizeof(T));
  return out;
}

bool set_arg(sycl::handler& h, int i, int kind, uint64_t v) {
  switch (kind) {
    case KF_PTR: h.set_arg(i, reinterpret_cast<void*>(static_cast<uintptr_t>(v))); return true;
    case KF_I8: h.set_arg(i, bits_as<int8_t>(v)); return true;
    case KF_U8: h.set_arg(i, bits_as<uint8_t>(v)); return true;
    case KF_I16: h.set_arg(i, bits_as<int16_t>(v)); return true;
    case KF_U16: h.set_arg(i, bits_as<uint16_t>(v)); return true;
    case KF_I32: h.set_arg(i, bits_as<int32_t>(v)); return true;
    case KF_U32: h.set_arg(i, bits_as<uint32_t>(v)); return true;
    case KF_I64: h.set_arg(i, bits_as<int64_t>(v)); return true;
    case KF_U64: h.set_arg(i, bits_as<uint64_t>(v)); return true;
    case KF_F16: h.set_arg(i, bits_as<sycl::half>(v)); return true;
    case KF_F32: h.set_arg(i, bits_as<float>(v)); return true;
    case KF_F64: h.set_arg(i, bits_as<double>(v)); return true;
    case KF_LOCAL:
      h.set_arg(i, sycl::local_accessor<uint8_t, 1>(sycl::range<1>(v ? v : 1), h));
      return true;
    default: return false;
  }
}

}  // namespace

extern "C" {

const char* kf_message() { return g_msg.c_str(); }

// Enumerate the devices (all platforms); returns how many, or -1 (message: why).
int kf_init() {
  try {
    auto& devices = all_devices();
    if (devices.empty()) {
      for (auto& p : sycl::platform::get_platforms())
        for (auto& d : p.get_devices()) devices.push_back(d);
    }
    g_msg.clear();
    return static_cast<int>(devices.size());
  } catch (std::exception& e) {
    g_msg = e.what();
    return -1;
  }
}

// One device as JSON in kf_message(); returns 0, or -1.
int kf_device_info(int index) {
  try {
    auto& devices = all_devices();
    if (index < 0 || index >= static_cast<int>(devices.size())) {
      g_msg = "no such device";
      return -1;
    }
    sycl::device& d = devices[index];
    namespace di = sycl::info::device;
    std::ostringstream js;
    auto platform = d.get_platform();
    js << "{\"name\":\"" << esc(d.get_info<di::name>()) << "\"";
    js << ",\"vendor\":\"" << esc(d.get_info<di::vendor>()) << "\"";
    js << ",\"device_type\":\"" << type_name(d.get_info<di::device_type>()) << "\"";
    js << ",\"backend\":\"" << backend_name(d.get_backend()) << "\"";
    js << ",\"platform\":\"" << esc(platform.get_info<sycl::info::platform::name>()) << "\"";
    js << ",\"platform_version\":\"" << esc(platform.get_info<sycl::info::platform::version>()) << "\"";
    js << ",\"version\":\"" << esc(d.get_info<di::version>()) << "\"";
    js << ",\"driver_version\":\"" << esc(d.get_info<di::driver_version>()) << "\"";
    js << ",\"compute_units\":" << d.get_info<di::max_compute_units>();
    js << ",\"max_work_group_size\":" << d.get_info<di::max_work_group_size>();
    auto wi = d.get_info<di::max_work_item_sizes<3>>();
    js << ",\"max_work_item_sizes\":[" << wi[0] << "," << wi[1] << "," << wi[2] << "]";
    js << ",\"local_mem_bytes\":" << d.get_info<di::local_mem_size>();
    js << ",\"global_mem_bytes\":" << d.get_info<di::global_mem_size>();
    js << ",\"l2_cache_bytes\":" << d.get_info<di::global_mem_cache_size>();
    js << ",\"clock_mhz\":" << d.get_info<di::max_clock_frequency>();
    js << ",\"preferred_vector_width_float\":" << d.get_info<di::preferred_vector_width_float>();
    js << ",\"sub_group_sizes\":[";
    bool first = true;
    for (auto s : d.get_info<di::sub_group_sizes>()) {
      js << (first ? "" : ",") << s;
      first = false;
    }
    js << "]";
    js << ",\"usm_system_allocations\":" << (d.has(sycl::aspect::usm_system_allocations) ? "true" : "false");
    js << ",\"usm_shared_allocations\":" << (d.has(sycl::aspect::usm_shared_allocations) ? "true" : "false");
    js << ",\"fp64\":" << (d.has(sycl::aspect::fp64) ? "true" : "false");
    js << ",\"fp16\":" << (d.has(sycl::aspect::fp16) ? "true" : "false");
    bool can_compile = false;
    try {
      can_compile = d.ext_oneapi_can_compile(syclex::source_language::sycl);
    } catch (std::exception&) {
    }
    js << ",\"can_compile_sycl\":" << (can_compile ? "true" : "false") << "}";
    g_msg = js.str();
    return 0;
  } catch (std::exception& e) {
    g_msg = e.what();
    return -1;
  }
}

// A context and an in-order queue on device `index`; NULL on failure.
void* kf_open(int index) {
  try {
    auto& devices = all_devices();
    if (index < 0 || index >= static_cast<int>(devices.size())) {
      g_msg = "no such device";
      return nullptr;
    }
    auto* ctx = new Context{devices[index], sycl::context(devices[index]), std::nullopt, {}, {}};
    auto handler = [ctx](sycl::exception_list errors) {
      std::lock_guard<std::mutex> lock(ctx->errors_lock);
      for (auto& e : errors) {
        try {
          std::rethrow_exception(e);
        } catch (std::exception& ex) {
          ctx->async_errors += std::string(ex.what()) + "\n";
        }
      }
    };
    ctx->queue.emplace(ctx->context, ctx->device, handler, sycl::property::queue::in_order());
    g_msg.clear();
    return ctx;
  } catch (std::exception& e) {
    g_msg = e.what();
    return nullptr;
  }
}

void kf_close(void* handle) { delete static_cast<Context*>(handle); }

// Compile SYCL source for the context's device; NULL on failure (message: the compiler's output).
// On success the message holds the build log (often empty).
void* kf_build(void* handle, const char* source, int n_options, const char** options) {
  auto* ctx = static_cast<Context*>(handle);
  std::string log;
  try {
    std::vector<std::string> opts(options, options + n_options);
    auto src = syclex::create_kernel_bundle_from_source(ctx->context, syclex::source_language::sycl, std::string(source));
    auto exe = syclex::build(src, std::vector<sycl::device>{ctx->device},
                             syclex::properties{syclex::build_options{opts}, syclex::save_log{&log}});
    g_msg = log;
    return new Bundle{exe};
  } catch (std::exception& e) {
    g_msg = std::string(e.what()) + (log.empty() ? "" : "\n" + log);
    return nullptr;
  }
}

void kf_release_bundle(void* bundle) { delete static_cast<Bundle*>(bundle); }

int kf_has_kernel(void* bundle, const char* name) {
  try {
    return static_cast<Bundle*>(bundle)->exe.ext_oneapi_has_kernel(name) ? 1 : 0;
  } catch (std::exception& e) {
    g_msg = e.what();
    return -1;
  }
}

// A kernel of the bundle; NULL if none has that name.
void* kf_get_kernel(void* bundle, const char* name) {
  try {
    return new sycl::kernel(static_cast<Bundle*>(bundle)->exe.ext_oneapi_get_kernel(name));
  } catch (std::exception& e) {
    g_msg = e.what();
    return nullptr;
  }
}

void kf_release_kernel(void* kernel) { delete static_cast<sycl::kernel*>(kernel); }

// A kernel's resources on the context's device, as JSON in kf_message(); returns 0, or -1.
int kf_kernel_info(void* handle, void* kernel) {
  auto* ctx = static_cast<Context*>(handle);
  auto* k = static_cast<sycl::kernel*>(kernel);
  namespace ki = sycl::info::kernel_device_specific;
  std::ostringstream js;
  js << "{";
  auto field = [&](const char* key, auto getter) {
    try {
      auto v = getter();
      js << (js.tellp() > 1 ? "," : "") << "\"" << key << "\":" << v;
    } catch (std::exception&) {
    }
  };
  field("max_work_group_size", [&] { return k->get_info<ki::work_group_size>(ctx->device); });
  field("private_mem_bytes", [&] { return k->get_info<ki::private_mem_size>(ctx->device); });
  field("preferred_multiple", [&] { return k->get_info<ki::preferred_work_group_size_multiple>(ctx->device); });
  field("max_sub_group_size", [&] { return k->get_info<ki::max_sub_group_size>(ctx->device); });
  field("compile_sub_group_size", [&] { return k->get_info<ki::compile_sub_group_size>(ctx->device); });
  field("max_num_sub_groups", [&] { return k->get_info<ki::max_num_sub_groups>(ctx->device); });
  field("num_args", [&] { return k->get_info<sycl::info::kernel::num_args>(); });
  try {
    auto r = k->get_info<ki::compile_work_group_size>(ctx->device);
    js << (js.tellp() > 1 ? "," : "") << "\"compile_work_group_size\":[" << r[0] << "," << r[1] << "," << r[2] << "]";
  } catch (std::exception&) {
  }
  try {
    long long local = opencl_local_mem(*k, ctx->device);
    if (local >= 0) js << (js.tellp() > 1 ? "," : "") << "\"local_mem_bytes\":" << local;
  } catch (std::exception&) {
  }
  js << "}";
  g_msg = js.str();
  return 0;
}

// How many device images the bundle holds; -1 on failure.
int kf_image_count(void* bundle) {
  try {
    auto& exe = static_cast<Bundle*>(bundle)->exe;
    return static_cast<int>(std::distance(exe.begin(), exe.end()));
  } catch (std::exception& e) {
    g_msg = e.what();
    return -1;
  }
}

// Device image `index`'s backend content (sycl_ext_oneapi_device_image_backend_content: SPIR-V on the
// OpenCL backend), valid until the next call on this thread; its size in *nbytes. NULL on failure.
const void* kf_image_content(void* bundle, int index, size_t* nbytes) {
  try {
    auto& exe = static_cast<Bundle*>(bundle)->exe;
    auto it = exe.begin();
    if (index < 0 || index >= std::distance(exe.begin(), exe.end())) {
      g_msg = "no such device image";
      return nullptr;
    }
    std::advance(it, index);
    g_content = it->ext_oneapi_get_backend_content();
    *nbytes = g_content.size();
    g_msg.clear();
    return g_content.data();
  } catch (std::exception& e) {
    g_msg = e.what();
    return nullptr;
  }
}

// Enqueue `kernel` over an nd_range of `ndim` dimensions (local NULL: the runtime picks); asynchronous.
// Argument i has kind kinds[i] (ArgKind) and value bits values[i]. Returns 0, or -1.
int kf_launch(void* handle, void* kernel, int ndim, const size_t* global, const size_t* local, int nargs,
              const int* kinds, const uint64_t* values) {
  auto* ctx = static_cast<Context*>(handle);
  auto* k = static_cast<sycl::kernel*>(kernel);
  try {
    ctx->queue->submit([&](sycl::handler& h) {
      for (int i = 0; i < nargs; ++i)
        if (!set_arg(h, i, kinds[i], values[i])) throw std::runtime_error("unknown argument kind");
      switch (ndim) {
        case 1: h.parallel_for(make_range<1>(global, local), *k); break;
        case 2: h.parallel_for(make_range<2>(global, local), *k); break;
        case 3: h.parallel_for(make_range<3>(global, local), *k); break;
        default: throw std::runtime_error("ndim must be 1, 2 or 3");
      }
    });
    g_msg.clear();
    return 0;
  } catch (std::exception& e) {
    g_msg = e.what();
    return -1;
  }
}

// Wait for all queued work; returns 0, or -1 (message: the errors raised by that work).
int kf_wait(void* handle) {
  auto* ctx = static_cast<Context*>(handle);
  try {
    ctx->queue->wait_and_throw();
  } catch (std::exception& e) {
    std::lock_guard<std::mutex> lock(ctx->errors_lock);
    ctx->async_errors += std::string(e.what()) + "\n";
  }
  std::lock_guard<std::mutex> lock(ctx->errors_lock);
  g_msg = ctx->async_errors;
  ctx->async_errors.clear();
  return g_msg.empty() ? 0 : -1;
}

// USM shared memory (for devices without system-allocation support); NULL on failure.
void* kf_malloc_shared(void* handle, size_t nbytes) {
  auto* ctx = static_cast<Context*>(handle);
  try {
    void* p = sycl::malloc_shared(nbytes, ctx->device, ctx->context);
    if (!p) g_msg = "sycl::malloc_shared returned NULL";
    return p;
  } catch (std::exception& e) {
    g_msg = e.what();
    return nullptr;
  }
}

void kf_free(void* handle, void* ptr) {
  auto* ctx = static_cast<Context*>(handle);
  try {
    sycl::free(ptr, ctx->context);
  } catch (std::exception&) {
  }
}

}  // extern "C"
