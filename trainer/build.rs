use std::path::{Path, PathBuf};

fn main() {
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB");
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    build_shim(Path::new(&lib), cuda);

    // torch-sys passes an rpath only to its own C++ step; give the binary one too so
    // it finds libtorch without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if cuda {
        // libtorch_cuda registers the CUDA backend from static initializers; nothing
        // references it by symbol, so it must be linked with --no-as-needed.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-lc10_cuda,--as-needed");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// Compiles csrc/ (the ATen and c10d calls tch does not expose) against the same
/// libtorch that torch-sys links.
fn build_shim(lib: &Path, cuda: bool) {
    let torch = lib.parent().expect("libtorch lib dir has a parent");
    let include = torch.join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file("csrc/shim.cpp")
        .file("csrc/dist.cpp")
        .file("csrc/memory.cpp")
        .file("csrc/timing.cpp")
        .file("csrc/rows.cpp")
        .file("csrc/varlen.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(gloo_include())
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // c10d's headers expose the Gloo (and, with cuda, NCCL) process groups only
        // under these; the symbols themselves are in libtorch_cpu / libtorch_cuda.
        .define("USE_DISTRIBUTED", None)
        .define("USE_C10D_GLOO", None)
        // libtorch's headers are noisy under -Wall; the shim's own code is small.
        .warnings(false)
        .flag_if_supported("-Wno-unused-parameter");
    if cuda {
        // The pip wheel keeps the CUDA runtime headers beside torch, not under it.
        let cu13 = cuda_include(torch);
        let nccl = torch.join("../nvidia/nccl/include");
        if !nccl.join("nccl.h").exists() {
            panic!("feature `cuda` needs nccl.h at {} (scripts/setup-libtorch.sh cuda installs it)", nccl.display());
        }
        build
            .include(&cu13)
            .include(&nccl)
            .define("USE_CUDA", None)
            .define("USE_C10D_NCCL", None)
            .define("SHIM_CUDA", None)
            .define("SHIM_NCCL", None);
    }
    build.compile("trainer_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    let sources =
        ["shim.cpp", "dist.cpp", "memory.cpp", "timing.cpp", "rows.cpp", "varlen.cpp", "guarded.h", "row_kernels.h"];
    for f in sources.map(|f| format!("csrc/{f}")) {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=GLOO_INCLUDE_DIR");
}

fn cuda_include(torch: &Path) -> PathBuf {
    let dir = torch.join("../nvidia/cu13/include");
    if !dir.join("cuda_runtime_api.h").exists() {
        panic!(
            "feature `cuda` needs the CUDA runtime headers at {} (scripts/setup-libtorch.sh cuda installs them)",
            dir.display()
        );
    }
    dir
}

/// The Gloo headers c10d's ProcessGroupGloo.hpp includes. The torch wheel ships
/// none; Debian's libgloo-dev does (only headers are used: every Gloo symbol
/// resolves from libtorch_cpu). `GLOO_INCLUDE_DIR` points elsewhere.
fn gloo_include() -> PathBuf {
    let dir = std::env::var_os("GLOO_INCLUDE_DIR").map_or_else(|| PathBuf::from("/usr/include"), PathBuf::from);
    if !dir.join("gloo/config.h").exists() {
        panic!(
            "the trainer needs the Gloo headers: {}/gloo/config.h is missing. Install them with \
             `apt-get install libgloo-dev` (scripts/setup-debian.sh does), or set GLOO_INCLUDE_DIR",
            dir.display()
        );
    }
    dir
}
