"""Import check of the vLLM 0.26.0 bundle on a machine with no GPU (check.sh runs it; read check.sh first).

Runs under `python3 -S` with PYTHONPATH = TWINS : SITE : IMG, nothing else:
  SITE   the bundle unpacked as install.sh lays it out on the device (/tmp/site026)
  TWINS  the same versions of the bundle's compiled dependencies, built for this machine's Python (cp312 ones
         cannot load here); nothing else
  IMG    links to a CPU torch and the device image's other packages (KINDS.md's list) taken from a local venv, the
         image's own versions of huggingface-hub / transformers / tokenizers / safetensors in front of them
The compiled vLLM extensions are replaced by empty modules (no CUDA here), the platform is forced to CUDA with
device capability 9.0. Then:
  1. ENGINE: every module of the engine (the pruner's SEEDS, the kept models, both model runners, warm-up, sampling,
     spec decode, structured output) is imported. Any failure other than one caused by the missing GPU (CUDA /
     NVML / op-registration errors) fails the check.
  2. ALL: every other module the bundle keeps is imported; a failure because a vllm.* file is missing fails the
     check (the pruner left out a file that a kept file needs at import); failures because a package that neither
     the image nor the bundle has is missing are counted (the whole wheel fails there too).
  3. Every module loaded in 1-2 came from SITE, TWINS (the twin of a bundled package), IMG, the standard library or a
     stub: a package loaded from IMG must be one of the image's packages (an IMG link is made only for those).
  4. The repo's vLLM plugin (REPO given) is imported and registered, as vLLM does in every process.
usage: python3 -S impcheck.py SITE TWINS IMG WHEEL_FILE_LIST [REPO]   (WHEEL_FILE_LIST: the wheel's paths, one a line)
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import traceback
import types

SITE, TWINS, IMG, WHEEL_LIST = sys.argv[1:5]
REPO = sys.argv[5] if len(sys.argv) > 5 else None
STUBBED = {
    "vllm._C_stable_libtorch",
    "vllm._moe_C_stable_libtorch",
    "vllm.cumem_allocator",
    "vllm.vllm_flash_attn._vllm_fa3_C",
}
HERE = os.path.dirname(os.path.abspath(__file__))


class Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in STUBBED else None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Stubs())
import torch  # noqa: E402


class _FakeOp:  # stands for an op of the real .so (absent here) where a module touches one at import
    def __call__(self, *a, **k):
        return False

    def __getattr__(self, name):
        return self


class _Namespace:
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        try:
            return getattr(self._real, name)
        except AttributeError:
            return _FakeOp()


for _ns in ("_C", "_moe_C", "_C_cache_ops", "_C_cuda_utils", "_C_custom_ar", "_vllm_fa3_C"):
    setattr(torch.ops, _ns, _Namespace(getattr(torch.ops, _ns)))
_register_fake = torch.library.register_fake


def _tolerant_register_fake(op, *a, **k):  # fake kernels for ops that only the real .so registers: skipped
    def apply(fn):
        try:
            return _register_fake(op, fn, **k)
        except (RuntimeError, ValueError, AttributeError):
            return fn

    return apply(a[0]) if a else apply


torch.library.register_fake = torch.library.impl_abstract = _tolerant_register_fake
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

# platform: CUDA, sm_90, as on the device
import logging  # noqa: E402

import vllm.platforms as P  # noqa: E402

# vLLM's warnings and errors while importing: a module that fails softly ("Failed to import ...") shows here
logged = []


class _Keep(logging.Handler):
    def emit(self, record):
        logged.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


logging.getLogger("vllm").addHandler(_Keep(logging.WARNING))

for k in list(P.builtin_platform_plugins):
    P.builtin_platform_plugins[k] = (lambda: "vllm.platforms.cuda.CudaPlatform") if k == "cuda" else (lambda: None)
import vllm.platforms.cuda as C  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402

C.CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(9, 0))
C.CudaPlatform.get_device_name = classmethod(lambda cls, device_id=0: "NVIDIA H200")
C.CudaPlatform.get_device_total_memory = classmethod(lambda cls, device_id=0: 141 << 30)
_old = P._current_platform  # `import vllm` may have resolved it already (to UnspecifiedPlatform: no NVML here)
P._current_platform = None
for _m in list(sys.modules.values()):
    if _old is not None and getattr(_m, "current_platform", None) is _old:
        _m.current_platform = P.current_platform
assert P.current_platform.is_cuda(), P.current_platform
assert P.current_platform.has_device_capability(90), P.current_platform.get_device_capability()

sys.argv = ["srcprune026", SITE]
sys.path.insert(0, HERE)
import srcprune026 as SP  # noqa: E402  (its module table is built over SITE: exactly the kept files)

wheel_py = {line.strip() for line in open(WHEEL_LIST) if line.strip().endswith(".py")}
wheel_mods = sorted({p[:-3].replace("/", ".").removesuffix(".__init__") for p in wheel_py if p.startswith("vllm/")})
kept = sorted(SP.mods)
# the engine's modules are taken from the WHEEL's list, so one that the pruner left out is caught too
engine = list(SP.SEEDS) + [m for m in wheel_mods if SP.KEEP_MODELS.match(m)]
engine += [
    m
    for m in wheel_mods
    if m.startswith(
        (
            "vllm.v1.worker.gpu.",
            "vllm.model_executor.warmup.",
            "vllm.v1.sample.",
            "vllm.v1.core.",
            "vllm.v1.engine.",
            "vllm.compilation.",
            "vllm.v1.attention.backends.mla.prefill.",
            "vllm.model_executor.layers.fused_moe.router.",
        )
    )
]
engine += [
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.spec_decode.metadata",
    "vllm.v1.spec_decode.utils",
    "vllm.v1.attention.backends.mla.triton_mla",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.model_executor.layers.attention.mla_attention",
    "vllm.model_executor.layers.rotary_embedding",
    "vllm.model_executor.layers.layernorm",
    "vllm.model_executor.layers.activation",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.v1.structured_output.backend_xgrammar",
    "vllm.v1.structured_output.backend_guidance",
    "vllm.v1.structured_output.backend_types",
    "vllm.v1.structured_output.utils",
    "vllm.v1.structured_output.request",
]  # the other backends are imported when a request asks for them
engine += ["setproctitle"]  # imported by every engine process at its start (vllm.utils.system_utils)
engine = list(dict.fromkeys(engine))

ENV = re.compile(
    r"CUDA|cuda|NVML|nvml|Torch not compiled|_OpNamespace|_FakeOp|torch\.ops|no attribute '(cuda|_C)'|"
    r"not compiled with|Found no NVIDIA driver|device-side|libcuda|GPU|"
    + "|".join(re.escape(f"'{s}'") for s in STUBBED)
)  # "cannot import name X from <a stub>"


def norm(n):
    return re.sub(r"[-_.]+", "_", n).lower()


image_dists = {
    norm(line.strip()) for line in open(os.path.join(HERE, "image_packages.txt")) if line.strip() and line[0] != "#"
}
image_names = (
    {line.split()[0] for line in open(os.path.join(IMG, ".image_tops"))}
    if os.path.exists(os.path.join(IMG, ".image_tops"))
    else set()
)
bundle_tops = {
    e.split(".")[0] for e in os.listdir(SITE) if not e.endswith((".dist-info", ".pth")) and not e.startswith(".")
}


def attempt(m):
    try:
        importlib.import_module(m)
        return None
    except BaseException as e:  # noqa: BLE001  (SystemExit from a module's top level counts too)
        return e


def missing_name(e):
    while e is not None:
        if isinstance(e, ModuleNotFoundError) and e.name:
            return e.name
        e = e.__cause__ or e.__context__
    return None


fail, env, optional = [], [], {}
for m in engine:
    if m.startswith("vllm") and m not in SP.mods:
        fail.append(f"ENGINE {m}: an engine module the pruner left out")
        continue
    e = attempt(m)
    if e is None:
        continue
    miss = missing_name(e)
    text = f"{type(e).__name__}: {e}"
    top = miss.split(".")[0] if miss else None
    if miss and (top == "vllm" or top in bundle_tops):
        fail.append(f"ENGINE {m}: {text}")
    elif miss and norm(top) in image_dists:
        env.append(f"{m}: needs {top}, an image package this machine lacks ({text})")
    elif miss and top in SP.NOT_ON_DEVICE:
        optional.setdefault(top, []).append(m)  # unimportable on the device with the whole wheel too
    elif miss:
        fail.append(f"ENGINE {m}: needs {miss}, in neither the image nor the bundle ({text})")
    elif ENV.search(text) or ENV.search("".join(traceback.format_exception(e))[-600:]):
        env.append(f"{m}: {text[:160]}")
    else:
        fail.append(f"ENGINE {m}: {text[:300]}")
n_engine = len(engine)
others = [m for m in kept if m not in set(engine)]
for m in others:
    e = attempt(m)
    if e is None:
        continue
    miss = missing_name(e)
    if miss and miss.startswith("vllm"):
        rel = miss.replace(".", "/")
        if f"{rel}.py" in wheel_py or f"{rel}/__init__.py" in wheel_py:
            fail.append(f"ALL {m}: needs {miss}, which the pruner left out")
        else:
            optional.setdefault(miss, []).append(m)  # not in the wheel either (e.g. a ROCm-only extension)
    elif miss:
        optional.setdefault(miss.split(".")[0], []).append(m)
    else:
        optional.setdefault(f"{type(e).__name__} (no GPU here, or optional)", []).append(m)

# 3. where every loaded module came from (by the path of its file: a vendored copy inside a package counts as that
#    package's)
here = {os.path.realpath(__file__), os.path.realpath(SP.__file__)}
stdlib = os.path.realpath(os.path.dirname(os.__file__))
origin_bad, from_img, from_twins = [], set(), set()


def entry(f, root):  # the top-level entry of ROOT that holds file f, or None
    rel = os.path.relpath(os.path.abspath(f), os.path.abspath(root))
    if rel.startswith(".."):
        return None
    e = rel.split(os.sep)[0]
    return e[:-3] if e.endswith(".py") else e.split(".")[0]


for name, mod in list(sys.modules.items()):
    f = getattr(mod, "__file__", None)
    if not f or name in STUBBED or not os.path.exists(f) or os.path.realpath(f) in here:
        continue
    if entry(f, SITE):
        continue
    e = entry(f, TWINS)
    if e:
        from_twins.add(e)
        if e not in bundle_tops:
            origin_bad.append(f"{name}: from TWINS ({e}) but not a bundled package")
        continue
    e = entry(f, IMG)
    if e:
        from_img.add(e)
        if image_names and e not in image_names:
            origin_bad.append(f"{name}: from IMG ({e}) but not an image package")
        continue
    if os.path.realpath(f).startswith(stdlib):
        continue
    origin_bad.append(f"{name}: from {f}")
fail += [f"ORIGIN {x}" for x in origin_bad]

# 4. the repo's vLLM plugin, loaded as vLLM loads it in every process (install.sh installs it into the site)
plugin_note = "not tried (no REPO argument)"
if REPO:
    sys.path.append(REPO)
    try:
        import vllm_k2_plugin

        vllm_k2_plugin.register()
        plugin_note = "register() OK"
    except BaseException as e:  # noqa: BLE001
        miss = missing_name(e)
        rel = (miss or "").replace(".", "/")
        if miss and miss.startswith("vllm.") and (f"{rel}.py" in wheel_py or f"{rel}/__init__.py" in wheel_py):
            fail.append(f"PLUGIN needs {miss}, which the pruner left out")
        plugin_note = f"register() raised {type(e).__name__}: {str(e)[:200]}"
print(f"impcheck: repo plugin: {plugin_note}")
for line in dict.fromkeys(logged):
    print(f"impcheck: vLLM logged: {line}")
    for miss in re.findall(r"No module named '((?:vllm|triton_kernels)[A-Za-z0-9_.]*)'", line):
        rel = SP.ALIASES.get(miss.split(".")[0], miss.split(".")[0]) + miss[len(miss.split(".")[0]) :]
        rel = rel.replace(".", "/")
        if f"{rel}.py" in wheel_py or f"{rel}/__init__.py" in wheel_py:  # a file the wheel has but the bundle not
            fail.append(f"LOG {line}")
vllm_loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
print(
    f"impcheck: ENGINE {n_engine} modules imported, {len(env)} stopped only by what this machine lacks (GPU, "
    f"the real .so, an image package)"
)
for x in env:
    print(f"  env: {x}")
print(
    f"impcheck: ALL {len(others)} further kept modules imported; failures by the package they need "
    f"(neither image nor bundle has it, or no GPU here):"
)
for k, v in sorted(optional.items(), key=lambda kv: -len(kv[1])):
    print(f"  {k}: {len(v)} ({' '.join(sorted(v)[:3])}{' ...' if len(v) > 3 else ''})")
print(f"impcheck: {len(vllm_loaded)} vllm modules loaded; image packages used: {' '.join(sorted(from_img))}")
print(f"impcheck: bundled packages loaded (their cp311 twins here): {' '.join(sorted(from_twins))}")
bundled_loaded = sorted({m.split(".")[0] for m in sys.modules} & bundle_tops)
print(f"impcheck: bundled top-level packages loaded: {' '.join(bundled_loaded)}")
print(f"impcheck: bundled top-level packages never loaded: {' '.join(sorted(bundle_tops - set(bundled_loaded)))}")
for x in fail:
    print(f"impcheck: FAIL {x}")
print(f"impcheck: {'FAILED' if fail else 'OK'} ({len(fail)} failures)")
sys.stdout.flush()
os._exit(1 if fail else 0)  # no interpreter teardown: some imported modules start threads
