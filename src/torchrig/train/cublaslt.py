"""cuBLASLt matmuls with the GELU epilogues PyTorch does not expose: the adapter to libcublasLt.

PyTorch calls cuBLASLt with a bias or a bias+GELU epilogue (``torch._addmm_activation``) but not with the
ones a transformer MLP's training step can use (NVIDIA's cuBLAS guide, "cublasLtEpilogue_t",
https://docs.nvidia.com/cuda/cublas/#cublasltepilogue-t):

- ``GELU_AUX_BIAS`` (forward of ``fc``): ``h = gelu(x @ W1ᵀ + b1)`` and the GELU's input ``pre`` written by
  the GEMM itself, instead of a GEMM that writes ``pre`` and a kernel that reads it back for ``h``;
- ``DGELU_BGRAD`` (backward of ``out``): ``dpre = (dout @ W2) * gelu'(pre)`` and ``db1 = Σ dpre`` in the
  GEMM's epilogue, instead of a GEMM that writes ``dh`` and a kernel that reads ``dh`` and ``pre`` back;
- ``BGRADB`` (a Linear's weight gradient): ``dW = dyᵀ @ x`` and the bias gradient ``db = Σ dy`` (the sum over
  the GEMM's reduction dimension, the tokens) in one GEMM, instead of the GEMM and a kernel that reads ``dy``
  again for the sum.

The GELU is the tanh approximation (the guide's footnote), the model's. This module is the ctypes boundary:
it calls the ``libcublasLt`` that PyTorch itself loaded (one copy in the process), on PyTorch's current
stream, with a workspace it keeps per device, so its calls can be captured in CUDA graphs. Descriptors and
the heuristic's algorithm are made once per shape. Row-major PyTorch matrices are cuBLASLt's column-major
transposes: ``Y[T,N] = X[T,K] @ W[N,K]ᵀ`` is ``Yᵀ = op_T(W) · op_N(Xᵀ)`` with ``m=N, n=T, k=K``.
The enum values are cublasLt.h's and cublas_api.h's (checked against those of nvidia-cublas 13.10.0.20 from
PyPI, whose libcublasLt also took these descriptors and gave their values back on a machine without a GPU);
``header_mismatches`` compares them with the headers of the installed cuBLAS on the GPU machine
(tests/gpu/test_train_fusedmlp_gpu.py).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

# cublasLt.h / cublas_api.h / library_types.h
CUBLAS_COMPUTE_32F = 68
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
DESC_EPILOGUE_AUX_POINTER, DESC_EPILOGUE_AUX_LD = 11, 12
PREF_MAX_WORKSPACE_BYTES = 1
EPILOGUE_DEFAULT, EPILOGUE_BIAS = 1, 4
EPILOGUE_GELU_AUX_BIAS, EPILOGUE_DGELU_BGRAD, EPILOGUE_DGELU = 164, 208, 192
EPILOGUE_BGRADB = 512
STATUS_NOT_SUPPORTED = 15  # the heuristic's answer when no algorithm fits (the workspace among the limits)
HEURISTIC_RESULTS = 8  # algorithms asked of the heuristic per GEMM: the first is used, the rest can be timed
HEADER_NAMES = {
    "CUBLAS_COMPUTE_32F": CUBLAS_COMPUTE_32F,
    "CUBLASLT_MATMUL_DESC_TRANSA": DESC_TRANSA,
    "CUBLASLT_MATMUL_DESC_TRANSB": DESC_TRANSB,
    "CUBLASLT_MATMUL_DESC_EPILOGUE": DESC_EPILOGUE,
    "CUBLASLT_MATMUL_DESC_BIAS_POINTER": DESC_BIAS_POINTER,
    "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER": DESC_EPILOGUE_AUX_POINTER,
    "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD": DESC_EPILOGUE_AUX_LD,
    "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": PREF_MAX_WORKSPACE_BYTES,
    "CUBLASLT_EPILOGUE_DEFAULT": EPILOGUE_DEFAULT,
    "CUBLASLT_EPILOGUE_BIAS": EPILOGUE_BIAS,
    "CUBLAS_STATUS_NOT_SUPPORTED": STATUS_NOT_SUPPORTED,
}
WORKSPACE_BYTES = 32 * 1024 * 1024  # what PyTorch gives cuBLASLt on Hopper (CUBLASLT_WORKSPACE_SIZE default)
WORKSPACE_ENV = "CUBLASLT_WORKSPACE_SIZE"  # PyTorch's setting for its own cuBLASLt calls, in KiB


class CublasLtError(RuntimeError):
    """A cuBLASLt call failed: the function and its cublasStatus_t."""


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", _Algo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def library_path() -> str | None:
    """The libcublasLt this process has loaded (PyTorch's CUDA build loads it with libtorch_cuda)."""
    from torchrig.inputfiles import read_proc

    maps = read_proc("/proc/self/maps", max_bytes=16 * 2**20)  # a CUDA process maps a few thousand regions
    if maps is None:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcublasLt.so" in path:
            return path
    return None


EPILOGUES = {
    "GELU_AUX_BIAS": EPILOGUE_GELU_AUX_BIAS,
    "DGELU_BGRAD": EPILOGUE_DGELU_BGRAD,
    "DGELU": EPILOGUE_DGELU,
    "BGRADB": EPILOGUE_BGRADB,
}


def epilogue_values(header: str) -> dict[str, int]:
    """The ``cublasLtEpilogue_t`` members of cublasLt.h's text and their values; the header writes some as
    compositions (``CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS)``)."""
    exprs = dict(re.findall(r"\bCUBLASLT_EPILOGUE_(\w+)\s*=\s*([^,}\n]+)", header))
    values: dict[str, int] = {}
    for _ in range(len(exprs)):  # each pass resolves the members whose parts are known
        for name, expr in exprs.items():
            parts = [
                p.strip().removeprefix("CUBLASLT_EPILOGUE_")
                for p in expr.replace("(", " ").replace(")", " ").split("|")
            ]
            if name not in values and all(p.isdigit() or p in values for p in parts):
                values[name] = 0
                for p in parts:
                    values[name] |= int(p) if p.isdigit() else values[p]
    return values


def installed_headers() -> str | None:
    """cublasLt.h and cublas_api.h (where ``cublasComputeType_t`` is) of the cuBLAS wheel in this Python's
    site-packages (``nvidia/cu13/include`` for CUDA 13, ``nvidia/cublas/include`` for 12), or None."""
    import glob
    import site

    from torchrig.inputfiles import read_text

    roots = [*site.getsitepackages(), site.getusersitepackages()]
    for lt in sorted(p for r in roots for p in glob.glob(f"{r}/nvidia/*/include/cublasLt.h")):
        api = Path(lt).with_name("cublas_api.h")
        return read_text(lt, "cublasLt.h") + (read_text(api, "cublas_api.h") if api.exists() else "")
    return None


def header_mismatches(header: str) -> list[str]:
    """The names whose value in cublasLt.h's text differs from this module's."""
    out = []
    for name, value in HEADER_NAMES.items():
        m = re.search(rf"\b{name}\s*=\s*(\d+)", header)
        if m is None or int(m.group(1)) != value:
            out.append(f"{name}: header {m.group(1) if m else 'absent'}, module {value}")
    found = epilogue_values(header)
    for name, value in EPILOGUES.items():
        if found.get(name) != value:
            out.append(f"CUBLASLT_EPILOGUE_{name}: header {found.get(name, 'absent')}, module {value}")
    return out


class _Lib:
    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self.handle = ctypes.c_void_p()
        self.check("cublasLtCreate", ctypes.byref(self.handle))

    def check(self, fn: str, *args: object) -> None:
        status = getattr(self.lib, fn)(*args)
        if status != 0:
            raise CublasLtError(f"{fn} returned cublasStatus_t {status}")


@dataclass
class _Plan:
    desc: ctypes.c_void_p
    layouts: tuple[ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]  # A, B, D
    algos: tuple[_Algo, ...]  # the heuristic's choices, best first


_state: dict[str, object] = {}
_lock = threading.Lock()


def _lib() -> _Lib:
    lib = _state.get("lib")
    if lib is None:
        eye = torch.eye(8, device="cuda", dtype=torch.bfloat16)
        eye @ eye  # PyTorch's CUDA build has loaded cuBLAS and cuBLASLt by its first GEMM
        path = library_path()
        if path is None:
            raise CublasLtError("libcublasLt is not loaded in this process (a CPU-only PyTorch?)")
        lib = _state["lib"] = _Lib(path)
    assert isinstance(lib, _Lib)
    return lib


def workspace_bytes() -> int:
    """The workspace this module gives cuBLASLt, fixed at its first use in the process: CUBLASLT_WORKSPACE_SIZE
    (KiB, the setting PyTorch's own cuBLASLt calls read) where it is a whole number, else WORKSPACE_BYTES. With
    0 the heuristic offers only algorithms that need no workspace (no split-K or stream-K reduction in it)."""
    size = _state.get("ws_bytes")
    if size is None:
        raw = os.environ.get(WORKSPACE_ENV, "").strip()
        size = _state["ws_bytes"] = int(raw) * 1024 if raw.isdigit() else WORKSPACE_BYTES
    assert isinstance(size, int)
    return size


def _workspace(device: torch.device) -> torch.Tensor:
    key = f"ws{device.index}"
    ws = _state.get(key)
    if ws is None:
        if torch.cuda.is_current_stream_capturing():
            raise CublasLtError(
                "cuBLASLt's workspace cannot be allocated during CUDA graph capture: call "
                "torchrig.train.fusedmlp.prepare(device) before compiling or capturing"
            )
        ws = _state[key] = torch.empty(workspace_bytes(), dtype=torch.uint8, device=device)
    assert isinstance(ws, torch.Tensor)
    return ws


def prepare(device: torch.device | str) -> None:
    """Load cuBLASLt and allocate ``device``'s workspace now. Called before the first compiled step: a workspace
    allocated lazily inside a CUDA-graph tree's warm-up run would land in that graph's private memory pool, which
    must hold nothing but the graph's own tensors (torch/_inductor/cudagraph_trees.py, check_memory_pool)."""
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(dev):
        _lib()
        _workspace(dev)


def _set(lib: _Lib, desc: ctypes.c_void_p, attr: int, value: ctypes._SimpleCData) -> None:
    size = ctypes.c_size_t(ctypes.sizeof(value))
    lib.check("cublasLtMatmulDescSetAttribute", desc, ctypes.c_int(attr), ctypes.byref(value), size)


def _algorithms(
    lib: _Lib, desc: ctypes.c_void_p, layouts: tuple[ctypes.c_void_p, ...], what: str
) -> tuple[_Algo, ...]:
    """The heuristic's algorithms for this GEMM (up to HEURISTIC_RESULTS, best first, within the workspace)."""
    pref = ctypes.c_void_p()
    lib.check("cublasLtMatmulPreferenceCreate", ctypes.byref(pref))
    ws = ctypes.c_uint64(workspace_bytes())
    lib.check(
        "cublasLtMatmulPreferenceSetAttribute",
        pref,
        ctypes.c_int(PREF_MAX_WORKSPACE_BYTES),
        ctypes.byref(ws),
        ctypes.c_size_t(8),
    )
    results, count = (_Heuristic * HEURISTIC_RESULTS)(), ctypes.c_int(0)
    try:
        status = lib.lib.cublasLtMatmulAlgoGetHeuristic(
            lib.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref,
            ctypes.c_int(HEURISTIC_RESULTS), results, ctypes.byref(count),
        )  # fmt: skip
    finally:
        lib.check("cublasLtMatmulPreferenceDestroy", pref)
    if status not in (0, STATUS_NOT_SUPPORTED):
        raise CublasLtError(f"cublasLtMatmulAlgoGetHeuristic returned cublasStatus_t {status}")
    if status == STATUS_NOT_SUPPORTED or count.value < 1:  # none fits: cuBLASLt says so either way
        raise CublasLtError(
            f"cuBLASLt has no algorithm for this GEMM and {what} within a workspace of {ws.value} bytes"
            " (CUBLASLT_WORKSPACE_SIZE)"
        )
    algos = tuple(
        results[i].algo for i in range(min(count.value, HEURISTIC_RESULTS)) if results[i].state == 0
    )
    if not algos:
        raise CublasLtError(f"cuBLASLt's algorithms for this GEMM and {what} all failed")
    return algos


def _plan(key: tuple[int, ...]) -> _Plan:
    """Descriptors and the heuristic's algorithms (best first) for (transa, transb, m, n, k, lda, ldb, ldd,
    epilogue, device, D's data type): A and B are bf16, D (and C) bf16 or fp32."""
    plans = _state.setdefault("plans", {})
    assert isinstance(plans, dict)
    if key in plans:
        return plans[key]
    lib = _lib()
    ta, tb, m, n, k, lda, ldb, ldd, epilogue, _device, d_type = key
    desc = ctypes.c_void_p()
    lib.check(
        "cublasLtMatmulDescCreate",
        ctypes.byref(desc),
        ctypes.c_int(CUBLAS_COMPUTE_32F),
        ctypes.c_int(CUDA_R_32F),
    )
    _set(lib, desc, DESC_TRANSA, ctypes.c_int32(ta))
    _set(lib, desc, DESC_TRANSB, ctypes.c_int32(tb))
    _set(lib, desc, DESC_EPILOGUE, ctypes.c_uint32(epilogue))
    layouts = []
    for rows, cols, ld, dtype in (
        (*((k, m, lda) if ta else (m, k, lda)), CUDA_R_16BF),
        (*((n, k, ldb) if tb else (k, n, ldb)), CUDA_R_16BF),
        (m, n, ldd, d_type),
    ):
        lay = ctypes.c_void_p()
        lib.check(
            "cublasLtMatrixLayoutCreate", ctypes.byref(lay), ctypes.c_int(dtype),
            ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld),
        )  # fmt: skip
        layouts.append(lay)
    if epilogue in (EPILOGUE_GELU_AUX_BIAS, EPILOGUE_DGELU_BGRAD, EPILOGUE_BIAS, EPILOGUE_BGRADB):
        # the heuristic checks the epilogue's pointers' alignment: give it an aligned stand-in until the call
        _set(lib, desc, DESC_BIAS_POINTER, ctypes.c_void_p(256))
    if epilogue in (EPILOGUE_GELU_AUX_BIAS, EPILOGUE_DGELU_BGRAD, EPILOGUE_DGELU):
        _set(lib, desc, DESC_EPILOGUE_AUX_POINTER, ctypes.c_void_p(256))
        _set(lib, desc, DESC_EPILOGUE_AUX_LD, ctypes.c_int64(ldd))
    algos = _algorithms(lib, desc, (layouts[0], layouts[1], layouts[2]), f"epilogue {epilogue} ({key})")
    plan = plans[key] = _Plan(desc, (layouts[0], layouts[1], layouts[2]), algos)
    return plan


def _matmul(
    a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, *, ta: int, tb: int, m: int, n: int, k: int,
    lda: int, ldb: int, ldd: int, epilogue: int, bias: torch.Tensor | None = None, aux: torch.Tensor | None = None,
    algo: int = 0,
) -> None:  # fmt: skip
    """D = op(A)·op(B) (column-major), with the epilogue's bias and aux pointers, by the heuristic's ``algo``-th
    algorithm (0: its first choice); D is bf16 or fp32, as ``d`` is."""
    d_type = CUDA_R_32F if d.dtype == torch.float32 else CUDA_R_16BF
    with _lock:
        plan = _plan((ta, tb, m, n, k, lda, ldb, ldd, epilogue, d.device.index or 0, d_type))
        if not 0 <= algo < len(plan.algos):
            raise CublasLtError(
                f"the heuristic gave {len(plan.algos)} algorithms for this GEMM, not {algo + 1}"
            )
        lib = _lib()
        if bias is not None:
            _set(lib, plan.desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        if aux is not None:
            _set(lib, plan.desc, DESC_EPILOGUE_AUX_POINTER, ctypes.c_void_p(aux.data_ptr()))
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        ws = _workspace(d.device)
        lib.check(
            "cublasLtMatmul", lib.handle, plan.desc, ctypes.byref(one),
            ctypes.c_void_p(a.data_ptr()), plan.layouts[0], ctypes.c_void_p(b.data_ptr()), plan.layouts[1],
            ctypes.byref(zero), ctypes.c_void_p(d.data_ptr()), plan.layouts[2],
            ctypes.c_void_p(d.data_ptr()), plan.layouts[2], ctypes.byref(plan.algos[algo]),
            ctypes.c_void_p(ws.data_ptr() if ws.numel() else None), ctypes.c_size_t(ws.numel()),
            ctypes.c_void_p(torch.cuda.current_stream(d.device).cuda_stream),
        )  # fmt: skip


def _check_2d(*ts: torch.Tensor) -> None:
    for t in ts:
        if t.dtype != torch.bfloat16 or not t.is_cuda or not t.is_contiguous():
            raise CublasLtError(
                f"cuBLASLt epilogues take contiguous bf16 CUDA tensors, got {t.dtype} {t.device}"
            )


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it at a 256-byte boundary: the heuristic chose the algorithm for aligned pointers (its
    default assumption), and a view into a larger buffer (Inductor packs some outputs so) may not be."""
    return t if t.data_ptr() % 256 == 0 else t.clone()


def operand_layout(t: torch.Tensor) -> tuple[int, int] | None:
    """(transpose, leading dimension) of a row-major matrix operand for cuBLASLt's column-major call: a
    contiguous [R, C] matrix is the column-major [C, R] with leading dimension C (``CUBLAS_OP_N``); the
    transpose of a contiguous matrix (``w.t()``, as a Linear's weight gradient reads its output gradient) is
    used through ``CUBLAS_OP_T`` with the stored matrix's leading dimension. None for any other strides."""
    rows, cols = t.shape
    if t.stride() == (cols, 1):
        return CUBLAS_OP_N, cols
    if t.stride() == (1, rows):
        return CUBLAS_OP_T, rows
    return None


def _mm_key(x: torch.Tensor, y: torch.Tensor) -> tuple[int, int, int, int, int, int, int, int]:
    lx, ly = operand_layout(x), operand_layout(y)
    if lx is None or ly is None or x.shape[1] != y.shape[0]:
        raise CublasLtError(
            f"matmul takes [M, K] @ [K, N], each contiguous or a contiguous matrix's transpose; got "
            f"{tuple(x.shape)} strides {x.stride()} and {tuple(y.shape)} strides {y.stride()}"
        )
    (tb, ldb), (ta, lda) = lx, ly
    m, k = x.shape
    n = y.shape[1]
    # C[M, N] row-major is Cᵀ [N, M] column-major = op(y's storage) · op(x's storage)
    return ta, tb, n, m, k, lda, ldb, n


def algorithm_count(x: torch.Tensor, y: torch.Tensor, bias: bool = False) -> int:
    """How many algorithms the heuristic gave for ``matmul(x, y)`` (with a bias epilogue when ``bias``)."""
    ta, tb, m, n, k, lda, ldb, ldd = _mm_key(x, y)
    with _lock:
        key = (
            ta,
            tb,
            m,
            n,
            k,
            lda,
            ldb,
            ldd,
            EPILOGUE_BIAS if bias else EPILOGUE_DEFAULT,
            x.device.index or 0,
            CUDA_R_16BF,
        )
        return len(_plan(key).algos)


def matmul(
    x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None = None, *, algo: int = 0
) -> torch.Tensor:
    """``x @ y (+ bias)`` for bf16 x [M, K], y [K, N] (each contiguous or a contiguous matrix's transpose),
    bias [N], fp32 accumulation, by the heuristic's ``algo``-th algorithm (0: its first choice)."""
    for t in (x, y) if bias is None else (x, y, bias):
        if t.dtype != torch.bfloat16 or not t.is_cuda:
            raise CublasLtError(f"cuBLASLt matmul takes bf16 CUDA tensors, got {t.dtype} {t.device}")
    if bias is not None and (bias.shape != (y.shape[1],) or not bias.is_contiguous()):
        raise CublasLtError(f"the bias must be a contiguous [{y.shape[1]}] vector, got {tuple(bias.shape)}")
    ta, tb, m, n, k, lda, ldb, ldd = _mm_key(x, y)
    x, y = _aligned(x), _aligned(y)
    d = torch.empty(x.shape[0], y.shape[1], dtype=x.dtype, device=x.device)
    _matmul(
        y, x, d, ta=ta, tb=tb, m=m, n=n, k=k, lda=lda, ldb=ldb, ldd=ldd,
        epilogue=EPILOGUE_DEFAULT if bias is None else EPILOGUE_BIAS,
        bias=None if bias is None else _aligned(bias), algo=algo,
    )  # fmt: skip
    return d


def linear_gelu(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *, algo: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gelu_tanh(x @ wᵀ + b), x @ wᵀ + b)`` for x [T, K], w [N, K], b [N], bf16: one GEMM
    (``GELU_AUX_BIAS``; ``algo``: which of the heuristic's algorithms, 0 its first)."""
    _check_2d(x, w, b)
    x, w, b = _aligned(x), _aligned(w), _aligned(b)
    t, k = x.shape
    n = w.shape[0]
    h = torch.empty(t, n, dtype=x.dtype, device=x.device)
    pre = torch.empty_like(h)
    _matmul(
        w, x, h, ta=CUBLAS_OP_T, tb=CUBLAS_OP_N, m=n, n=t, k=k, lda=k, ldb=k, ldd=n,
        epilogue=EPILOGUE_GELU_AUX_BIAS, bias=b, aux=pre, algo=algo,
    )  # fmt: skip
    return h, pre


def dgelu_matmul(
    g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor, *, algo: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dpre = (g @ w) * gelu_tanh'(pre)`` and ``dbias = dpre.sum(0)`` for g [T, N2], w [N2, N], pre [T, N],
    bf16: one GEMM (``DGELU_BGRAD``)."""
    dpre, dbias = _dgelu(g, w, pre, bgrad=True, algo=algo)
    assert dbias is not None
    return dpre, dbias


def dgelu_only(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor, *, algo: int = 0) -> torch.Tensor:
    """``dpre = (g @ w) * gelu_tanh'(pre)`` alone (``DGELU``): the bias gradient left to a separate sum, for
    GPUs where the epilogue's column sum slows the GEMM (tools/gpu/lt_epilogue_bench.py measures both)."""
    return _dgelu(g, w, pre, bgrad=False, algo=algo)[0]


def _dgelu(
    g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor, *, bgrad: bool, algo: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    _check_2d(g, w, pre)
    g, w, pre = _aligned(g), _aligned(w), _aligned(pre)
    t, n2 = g.shape
    n = w.shape[1]
    dpre = torch.empty(t, n, dtype=g.dtype, device=g.device)
    dbias = torch.empty(n, dtype=g.dtype, device=g.device) if bgrad else None
    _matmul(
        w, g, dpre, ta=CUBLAS_OP_N, tb=CUBLAS_OP_N, m=n, n=t, k=n2, lda=n, ldb=n2, ldd=n,
        epilogue=EPILOGUE_DGELU_BGRAD if bgrad else EPILOGUE_DGELU, bias=dbias, aux=pre, algo=algo,
    )  # fmt: skip
    return dpre, dbias


def weight_grad(
    dy: torch.Tensor, x: torch.Tensor, *, fp32: bool = False, algo: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear's weight and bias gradients ``(dyᵀ @ x, dy.sum(0))`` for dy [T, N], x [T, K], bf16, fp32
    accumulation: one GEMM (``BGRADB``: the bias gradient is the sum of the B operand, dy, over the GEMM's
    reduction dimension T). Both come out bf16, or with ``fp32`` fp32 (the bias gradient has D's type, cublasLt.h),
    as an fp32 parameter's gradient is kept. Column-major:
    ``dWᵀ [K, N] = op_N(x's storage [K, T]) · op_T(dy's storage [N, T])``."""
    _check_2d(dy, x)
    if dy.shape[0] != x.shape[0]:
        raise CublasLtError(
            f"weight_grad takes dy [T, N] and x [T, K], got {tuple(dy.shape)} and {tuple(x.shape)}"
        )
    dy, x = _aligned(dy), _aligned(x)
    t, n = dy.shape
    k = x.shape[1]
    out = torch.float32 if fp32 else dy.dtype
    dw = torch.empty(n, k, dtype=out, device=dy.device)
    db = torch.empty(n, dtype=out, device=dy.device)
    _matmul(
        x, dy, dw, ta=CUBLAS_OP_N, tb=CUBLAS_OP_T, m=k, n=n, k=t, lda=k, ldb=n, ldd=k,
        epilogue=EPILOGUE_BGRADB, bias=db, algo=algo,
    )  # fmt: skip
    return dw, db
