"""Compiles the shim's jiterator kernels (trainer/csrc/shim.cpp) with NVRTC, as libtorch
does at a CUDA run's first step, for every dtype the trainer runs them in, and the row
kernels (trainer/csrc/row_kernels.h) as the shim compiles them, for sm_80 and sm_90 in
each precision's dtypes; no GPU needed.

A compile error there would only show as a rejected trial on a GPU. Each functor is
called as jiterator's generated code calls it (aten/src/ATen/native/cuda/jit_utils.cpp,
generate_code): loads of the inputs' dtype, the functor instantiated in its op-math type
(float for BFloat16), outputs by value or by reference through op-math temporaries, then
stored in the inputs' dtype; under jit_pwise_function's NVRTC options, with an
at::BFloat16 of jiterator's interface (a constructor from float, a conversion to float).

The row kernels are whole kernels: each source is the prelude, a precision's typedefs
(scripts/check-row-kernels.py's MIXES), then the kernel, with its entry point's name
checked in the compiled PTX.

Usage: python scripts/check-jiterator.py   (the full torch wheel's python)
"""

import ctypes
import importlib.util
import pathlib
import re
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
BFLOAT16 = """
namespace at {
struct alignas(2) BFloat16 {
  unsigned short x;
  BFloat16() = default;
  inline __host__ __device__ BFloat16(float value) { asm("{ cvt.rn.bf16.f32 %0, %1;}\\n" : "=h"(x) : "f"(value)); }
  inline __host__ __device__ operator float() const { float v; asm("{ mov.b32 %0, {0,%1};}\\n" : "=f"(v) : "h"(x)); return v; }
};
}
"""
# (storage dtype, op-math type): what jiterator instantiates for each dtype the trainer runs.
TYPES = [("float", "float"), ("at::BFloat16", "float"), ("double", "double")]
# (name in shim.cpp, functor, inputs, outputs by reference; 0 means returned by value)
KERNELS = [("kSwigluForward", "swiglu_forward", 2, 0), ("kSwigluBackward", "swiglu_backward", 3, 2), ("kRope", "rope", 4, 0)]
# (name in row_kernels.h, its extern "C" entry point)
ROW_KERNELS = [
    ("kResidualRmsNormForward", "residual_rms_norm_forward"),
    ("kResidualRmsNormBackward", "residual_rms_norm_backward"),
    ("kCrossEntropyChunk", "cross_entropy_chunk"),
]
ROW_ARCHS = ["sm_80", "sm_90"]


def nvrtc():
    lib = pathlib.Path(torch.__file__).parent.parent / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    if not lib.exists():
        sys.exit(f"check-jiterator: {lib} is missing (the torch wheel's nvidia-cuda-nvrtc)")
    return ctypes.CDLL(str(lib))


def source(shim: pathlib.Path, name: str) -> str:
    m = re.search(rf'const char\* const {name} = R"\((.*?)\)";', shim.read_text(), re.S)
    if not m:
        sys.exit(f"check-jiterator: {shim}: no raw string constant {name}")
    return m.group(1)


def wrapper(functor: str, t: str, compute: str, inputs: int, outputs: int) -> str:
    params = [f"const {t}* in{i}" for i in range(inputs)] + [f"{t}* out{i}" for i in range(max(outputs, 1))]
    loads = "".join(f"{t} arg{i} = in{i}[k]; " for i in range(inputs))
    args = ", ".join(f"arg{i}" for i in range(inputs))
    if not outputs:
        call = f"out0[k] = {functor}<{compute}>({args});"
    elif compute != t:
        temps = [f"temp_out{i}" for i in range(outputs)]
        call = f"{compute} {', '.join(temps)}; {functor}<{compute}>({args}, {', '.join(temps)}); " + "".join(
            f"out{i}[k] = temp_out{i}; " for i in range(outputs))
    else:
        call = f"{functor}<{compute}>({args}, {', '.join(f'out{i}[k]' for i in range(outputs))});"
    return f'\nextern "C" __global__ void check({", ".join(params)}) {{ int k = threadIdx.x; {loads}{call} }}\n'


def compile_one(lib, code: str, label: str, opts=None) -> str:
    """Compiles `code`; its PTX."""
    prog = ctypes.c_void_p()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), label.encode(), 0, None, None), label)
    # jiterator's own options: unannotated functions (the functors) are device functions.
    opts = opts or [b"--std=c++17", b"--gpu-architecture=sm_90", b"-default-device", b"-DNDEBUG"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = ""
    if rc == 0:
        ptx_size = ctypes.c_size_t()
        check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx_size)), label)
        buf = ctypes.create_string_buffer(ptx_size.value)
        check(lib, lib.nvrtcGetPTX(prog, buf), label)
        ptx = buf.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if rc != 0:
        sys.exit(f"check-jiterator: {label} does not compile:\n{log.value.decode()}\n--- source ---\n{code}")
    if "warning" in log.value.decode():
        sys.exit(f"check-jiterator: {label} compiles with warnings:\n{log.value.decode()}")
    return ptx


def check(lib, rc: int, what: str) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"check-jiterator: {what}: {lib.nvrtcGetErrorString(rc).decode()}")


def row_mixes():
    """The precisions' storage types, as scripts/check-row-kernels.py runs them."""
    spec = importlib.util.spec_from_file_location("check_row_kernels", ROOT / "scripts/check-row-kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MIXES


def check_row_kernels(lib, header: pathlib.Path, mixes) -> None:
    prelude = source(header, "kRowPrelude")
    for name, entry in ROW_KERNELS:
        body = source(header, name)
        for mix in mixes:
            for arch in ROW_ARCHS:
                label = f"{entry} on {mix.name} for {arch}"
                code = f"{prelude}\n{mix.typedefs()}{body}\n"
                opts = [b"--std=c++17", f"--gpu-architecture={arch}".encode(), b"-DNDEBUG"]
                ptx = compile_one(lib, code, label, opts)
                if not re.search(rf"\.entry\s+{entry}\s*\(", ptx):
                    sys.exit(f"check-jiterator: {label}: no kernel entry {entry} in the PTX")


def main() -> None:
    shim = ROOT / "trainer/csrc/shim.cpp"
    lib = nvrtc()
    for name, functor, inputs, outputs in KERNELS:
        body = source(shim, name)
        for t, compute in TYPES:
            compile_one(lib, BFLOAT16 + body + wrapper(functor, t, compute, inputs, outputs), f"{functor} on {t}")
    print(f"check-jiterator: {len(KERNELS)} kernels compile for " + ", ".join(t for t, _ in TYPES))
    mixes = row_mixes()
    check_row_kernels(lib, ROOT / "trainer/csrc/row_kernels.h", mixes)
    print(
        f"check-jiterator: {len(ROW_KERNELS)} row kernels compile for "
        + ", ".join(m.name for m in mixes) + " on " + ", ".join(ROW_ARCHS)
    )


if __name__ == "__main__":
    main()
