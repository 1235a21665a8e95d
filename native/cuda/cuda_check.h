// Every CUDA and cuBLAS call goes through these: a failure becomes a dki::Error (a JS Error in
// the binding) naming the call and where it was made, never an abort.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "buffer_pool.h"
#include "common.h"
#include "cuda/cublas_api.cuh"

namespace dki {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next call does not see it again
  throw Error(std::string("CUDA error: ") + cudaGetErrorString(e) + " in " + call + " (" + file + ":" + std::to_string(line) + ")");
}

[[noreturn]] inline void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cuBLAS error: ") + cublas_api().status_string(s) + " in " + call + " (" + file + ":" + std::to_string(line) + ")");
}

#define DKI_CUDA_CHECK(call)                                                   \
  do {                                                                         \
    cudaError_t dki_e_ = (call);                                               \
    if (dki_e_ != cudaSuccess) ::dki::cuda_fail(dki_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define DKI_CUBLAS_CHECK(call)                                                   \
  do {                                                                           \
    cublasStatus_t dki_s_ = (call);                                              \
    if (dki_s_ != CUBLAS_STATUS_SUCCESS) ::dki::cublas_fail(dki_s_, #call, __FILE__, __LINE__); \
  } while (0)

// A kernel launch reports a bad configuration only through cudaGetLastError.
#define DKI_CUDA_LAUNCHED() DKI_CUDA_CHECK(cudaGetLastError())

// Frees the K/V block buffers GPU `device` keeps for reuse (device_kv.cu); whether there were any.
bool drain_device_block_pool(int device);

// Device memory owned by one object, optionally recycled through a pool. Out of memory is an
// error that says how much was asked for, for what, and how much the device had free.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const char* what) { allocate(bytes, what); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), pool_(o.pool_) { o.p_ = nullptr, o.bytes_ = 0, o.pool_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_, bytes_ = o.bytes_, pool_ = o.pool_;
      o.p_ = nullptr, o.bytes_ = 0, o.pool_ = nullptr;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void allocate(size_t bytes, const char* what) {
    release();
    if (bytes == 0) return;
    p_ = device_malloc(bytes, what);
    bytes_ = bytes;
  }
  // Memory of pool_size_class(bytes) from `pool` when it keeps one, else newly allocated; given
  // back to it on release.
  void allocate_pooled(size_t bytes, const char* what, BufferPool& pool) {
    release();
    if (bytes == 0) return;
    const size_t size = pool_size_class(bytes);
    p_ = pool.take(size);
    if (!p_) p_ = device_malloc(size, what);
    bytes_ = bytes;
    pool_ = &pool;
  }
  void release() {
    if (p_ && pool_) pool_->give(p_, pool_size_class(bytes_));
    else if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
    pool_ = nullptr;
  }
  template <class T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  BufferPool* pool_ = nullptr;

  // cudaMalloc on the current device. Out of memory, the freed K/V blocks the device keeps for
  // reuse are given back first and the allocation tried again: nobody needs that memory.
  static void* device_malloc(size_t bytes, const char* what) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    int device = 0;
    if (e == cudaErrorMemoryAllocation && cudaGetDevice(&device) == cudaSuccess && drain_device_block_pool(device)) {
      cudaGetLastError();
      e = cudaMalloc(&p, bytes);
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("CUDA out of memory: " + std::to_string(bytes >> 20) + " MiB for " + what + " (device has " +
                  std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) + " MiB)");
    }
    if (e != cudaSuccess) cuda_fail(e, "cudaMalloc", __FILE__, __LINE__);
    return p;
  }
};

// Page-locked host memory: copies from it are true DMA, asynchronous to the host thread.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void allocate(size_t bytes, const char* what) {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    cudaError_t e = cudaMallocHost(&p_, bytes);
    if (e != cudaSuccess) {
      p_ = nullptr;
      cudaGetLastError();
      throw Error("cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory for " + what + ": " + cudaGetErrorString(e));
    }
  }
  template <class T = void>
  T* get() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

}  // namespace dki
