# Sourced by tools/setup_env.sh before mmcv is built: decide whether mmcv compiles its CUDA ops
# and make sure that build can succeed before it starts.
#
# mmcv 2.1.0 compiles CUDA ops when torch sees a GPU (or FORCE_CUDA=1). That needs nvcc from a
# CUDA toolkit whose major version is torch's; without it the build fails deep inside a
# compiler log. This stops first, with what to install, and otherwise targets the visible GPU's
# compute capability (TORCH_CUDA_ARCH_LIST, unless already set) so the build is not compiled for
# every architecture.
#
#   mmrobust_cuda_env PYTHON    # returns 1 (after saying why) when the build cannot work

mmrobust_cuda_env() {
  local python=$1 torch_cuda visible arch nvcc nvcc_version
  read -r torch_cuda visible arch <<<"$("$python" -c '
import torch
visible = torch.cuda.is_available()
arch = ".".join(map(str, torch.cuda.get_device_capability(0))) if visible else "none"
print(torch.version.cuda or "none", int(visible), arch)')"
  if [ "$visible" != 1 ] && [ "${FORCE_CUDA:-0}" != 1 ]; then
    echo "== mmcv: CPU ops (torch CUDA: $torch_cuda, no GPU visible)"
    return 0
  fi
  if [ "$torch_cuda" = none ]; then
    echo "error: FORCE_CUDA=1 but the installed torch has no CUDA; install a CUDA build of" \
      "torch 2.13.0 (https://pytorch.org/get-started/locally/) or unset FORCE_CUDA." >&2
    return 1
  fi
  nvcc=${CUDA_HOME:+$CUDA_HOME/bin/}nvcc
  if ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "error: torch (CUDA $torch_cuda) sees a GPU, so mmcv 2.1.0 compiles its CUDA ops," \
      "which needs nvcc, and there is none (looked for '$nvcc'). Install the CUDA $torch_cuda" \
      "toolkit (e.g. 'conda install -c nvidia cuda-toolkit=$torch_cuda', or NVIDIA's" \
      "installer), put its bin/ on PATH or set CUDA_HOME, and rerun. Nothing was built." >&2
    return 1
  fi
  nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
  if [ "${nvcc_version%%.*}" != "${torch_cuda%%.*}" ]; then
    echo "error: nvcc is CUDA $nvcc_version but torch was built with CUDA $torch_cuda; mmcv's" \
      "CUDA ops need the same major version. Install the CUDA $torch_cuda toolkit (or point" \
      "CUDA_HOME at it) and rerun. Nothing was built." >&2
    return 1
  fi
  if [ "$visible" = 1 ]; then
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch}
  fi
  export FORCE_CUDA=1
  echo "== mmcv: CUDA ops with nvcc $nvcc_version (torch CUDA $torch_cuda) for compute" \
    "capability ${TORCH_CUDA_ARCH_LIST:-(all that torch targets)}"
}
