// torch-sys passes an rpath only to its own C++ step; give the binary one too so
// it finds libtorch without LD_LIBRARY_PATH.
fn main() {
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        // libtorch_cuda registers the CUDA backend from static initializers; nothing
        // references it by symbol, so it must be linked with --no-as-needed.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-lc10_cuda,--as-needed");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
