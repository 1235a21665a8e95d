{
  "targets": [
    {
      "target_name": "dki_native",
      "sources": [
        "native/binding.cpp",
        "native/mapped_file.cpp",
        "native/file_lock.cpp",
        "native/model.cpp",
        "native/forward.cpp",
        "native/threadpool.cpp",
        "native/kernels/dispatch.cpp",
        "native/kernels/kernels_scalar.cpp",
        "native/kernels/kernels_avx2.cpp",
        "native/kernels/kernels_avx512.cpp",
        "native/kernels/kernels_amx.cpp",
        "native/sampler.cpp",
        "native/kv_ops.cpp",
        "native/kv_buffer.cpp",
        "native/resources.cpp"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")", "native"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++1y", "-std=gnu++17"],
      "cflags_cc": ["-std=c++17", "-O3", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "cflags": ["-O3"],
      "ldflags": ["-pthread"]
    }
  ]
}
