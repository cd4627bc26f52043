#!/usr/bin/env bash
# Builds programs from NVIDIA's cuda-samples with this machine's nvcc (its default static
# runtime, as the samples' own builds do), for gpu-tests/run.sh --apps OUT:
#   gpu-tests/nvidia-samples.sh SAMPLES OUT NAME...
# SAMPLES: a cuda-samples tree (Common/ and Samples/*/NAME/); the GPU machine has no network, so
# carry the folders you need. A sample that fails to build is reported and left out.
set -uo pipefail
samples=${1:?usage: nvidia-samples.sh SAMPLES OUT NAME...}
out=${2:?usage: nvidia-samples.sh SAMPLES OUT NAME...}
shift 2
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
arch=${ARCH:-sm_90}
mkdir -p "$out"
status=0
for name in "$@"; do
    dir=$(find "$samples/Samples" -mindepth 2 -maxdepth 2 -type d -name "$name" | head -n 1)
    if [ -z "$dir" ]; then
        echo "nvidia-samples: no sample named $name" >&2
        status=1
        continue
    fi
    mapfile -t sources < <(find "$dir" -maxdepth 1 \( -name '*.cu' -o -name '*.cpp' \) | sort)
    if "$nvcc" -arch="$arch" -std=c++17 -I"$samples/Common" -I"$dir" -o "$out/$name" "${sources[@]}" \
        -lcuda -lcublas -lcusparse -lcusolver -lcufft -lcurand -Xcompiler -fopenmp >"$out/$name.build.log" 2>&1; then
        echo "nvidia-samples: built $name"
    else
        echo "nvidia-samples: $name did not build (see $out/$name.build.log)" >&2
        status=1
    fi
done
exit $status
