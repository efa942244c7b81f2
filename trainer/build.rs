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

/// Compiles csrc/shim.cpp (the ATen calls tch does not expose) against the same
/// libtorch that torch-sys links.
fn build_shim(lib: &Path, cuda: bool) {
    let torch = lib.parent().expect("libtorch lib dir has a parent");
    let include = torch.join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file("csrc/shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // libtorch's headers are noisy under -Wall; the shim's own code is small.
        .warnings(false)
        .flag_if_supported("-Wno-unused-parameter");
    if cuda {
        // The pip wheel keeps the CUDA runtime headers beside torch, not under it.
        let cu13 = cuda_include(torch);
        build.include(&cu13).define("USE_CUDA", None).define("SHIM_CUDA", None);
    }
    build.compile("trainer_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
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
