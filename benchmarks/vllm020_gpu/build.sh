#!/bin/bash
# Build a one-call bundle that brings a real vLLM 0.20.0 engine to the lent H200 (sm_90) machine.
# (The project's own copy of the bundle recipe; kept in the repo so benchmarks need nothing outside it.)
# Run from the root of YOUR repo (the one whose working tree a GPU run sends); writes .gpub/big and .gpub/s there.
#   bash benchmarks/vllm020_gpu/build.sh [MODELS_DIR]        # MODELS_DIR holds target/ and (optionally) draft/ (HF layout)
#   (no models yet? python3 benchmarks/vllm020_gpu/make_models.py DIR makes a tiny random pair; needs CPU torch+transformers)
# Needs on this machine: readelf + strip (binutils), zstd, xz, unzip, nvcc (only if a placeholder cubin is missing),
# pip with the registry. About 2 min on 2 cores (xz -9e). Result: ~15.5 MiB + your models; see README.md.
set -e
H=$(cd "$(dirname "$0")" && pwd); R=$PWD
MODELS=${1:-}  # optional: kernel benchmarks need no models
[ -n "$MODELS" ] && MODELS=$(cd "$MODELS" && pwd)
DEST=$R/.gpub/big
grep -q '^/.gpub/$' .git/info/exclude 2>/dev/null || echo "/.gpub/" >> .git/info/exclude
CACHE=${GPUB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpub}; mkdir -p "$CACHE/deps"
WHL=$(ls "$CACHE"/vllm-0.20.0-*.whl 2>/dev/null | head -1)
[ -n "$WHL" ] || { python3 -m pip download -q --no-deps vllm==0.20.0 -d "$CACHE"; WHL=$(ls "$CACHE"/vllm-0.20.0-*.whl | head -1); }
XZ="xz -9e -T0"; XZBIN="xz --x86 --lzma2=preset=9e -T0"   # BCJ x86 filter: ~15-30 % smaller on machine code
T=$(mktemp -d); trap 'rm -rf $T' EXIT
rm -rf "$DEST" "$R/.gpub/s"; mkdir -p "$DEST/so"
cp -r "$H/device" "$R/.gpub/s"
cd $T && unzip -q "$WHL"
# 1. CUDA libraries: sm_90-only, unused kernels' TUs replaced (prune.py), symbol tables stripped (the loader uses .dynsym)
mkdir so && cp vllm/{_C,_moe_C,_C_stable_libtorch,cumem_allocator}.abi3.so vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so so/
(cd so && python3 "$H/prune.py" _C.abi3.so _moe_C.abi3.so _C_stable_libtorch.abi3.so _vllm_fa3_C.abi3.so \
  && python3 "$H/chk.py" _C.abi3.so _moe_C.abi3.so _C_stable_libtorch.abi3.so | grep "bad" && strip --strip-unneeded *.so)
for f in so/*.so; do $XZBIN -c "$f" > "$DEST/so/$(basename $f).xz"; done
# 2. vLLM's Python sources, less what srcprune.py proves unreachable (other models' files, bench, docs assets)
python3 "$H/srcprune.py" . > exclude.txt
tar --exclude='*.so' --exclude='__pycache__' -X exclude.txt -cf - vllm vllm-0.20.0.dist-info | $XZ > "$DEST/src.tar.xz"
# 3. the dependencies the image lacks that an offline engine imports (measured with device/imptrace.py; README says
#    which ones were dropped and why), unpacked as pip --target would, extension modules' symbol tables stripped,
#    one xz tar extracted into /tmp/site
DEPS="annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 cbor2==6.3.0 distro==1.9.0 fastapi==0.128.0
  gguf==0.19.0 llguidance==1.3.0 msgspec==0.23.0 openai==2.54.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7
  pybase64==1.5.1 pydantic==2.12.5 pydantic-core==2.41.5 pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1
  starlette==0.50.0 typing-extensions==4.15.0 typing-inspection==0.4.5 xgrammar==0.2.9
  compressed-tensors==0.15.0.1 loguru==0.7.3"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$CACHE/deps" $DEPS 2>&1 | grep -v "WARNING: Location" || true
python3 - "$CACHE/deps" deps $DEPS <<'PY'
import re, sys, zipfile, glob, os
src, out, want = sys.argv[1], sys.argv[2], sys.argv[3:]
for spec in want:
    name, ver = spec.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    w = [f for f in glob.glob(f"{src}/*.whl") if re.sub(r"[-_.]+", "_", os.path.basename(f).split("-")[0]).lower() == stem
         and os.path.basename(f).split("-")[1] == ver]
    assert len(w) == 1, (spec, w)
    with zipfile.ZipFile(w[0]) as z:
        for i in z.infolist():
            n = i.filename
            m = re.match(r"[^/]+\.data/(purelib|platlib)/(.*)", n)
            if m: n = m.group(2)
            elif re.match(r"[^/]+\.data/", n): continue  # scripts, headers: not needed
            if n.endswith("/") or not n: continue
            p = os.path.join(out, n); os.makedirs(os.path.dirname(p), exist_ok=True)
            with z.open(i) as a, open(p, "wb") as b: b.write(a.read())
            os.chmod(p, 0o755 if n.endswith(".so") or ".so." in n else 0o644)
PY
for f in $(find deps -name '*.so'); do if readelf -SW "$f" | grep -q '\.symtab'; then strip --strip-unneeded "$f"; fi; done
(cd deps && tar -cf - .) | $XZBIN > "$DEST/deps.tar.xz"
# 4. your models
if [ -n "$MODELS" ]; then (cd "$MODELS" && tar -cf - $(ls -d target draft 2>/dev/null) | xz -9 -T0 > "$DEST/models.tar.xz")
else tar -cf - -T /dev/null | xz > "$DEST/models.tar.xz"; fi
du -b "$DEST"/so/* "$DEST"/*.tar.xz | sed "s|$R/||"
echo "bundle without models: $(du -cb "$DEST"/so "$DEST"/src.tar.xz "$DEST"/deps.tar.xz "$R"/.gpub/s | tail -1 | cut -f1) bytes; models: $(du -b "$DEST"/models.tar.xz | cut -f1) bytes"
