#!/usr/bin/env bash
# This round's checks on a GPU host, in one machine session: the worker's CUDA tests, the
# fine-tuning knobs against plain scripts, a user's sweep rate and warm model trials.
# Run from the repository root with the carried wheels (.whl, and .site for bitsandbytes
# and Liger; see the GPU host's notes). Each step has a time limit; a short table ends it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:$PWD/client:$PWD/.site:/tmp/site PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared GPU hosts (the ranks and plain scripts inherit it).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
out=${OUT:-/tmp/gpu_round}
mkdir -p "$out/logs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/logs/gpu.txt"
: > "$out/logs/steps.txt"
step() {
  local name=$1 limit=$2
  shift 2
  [ "$limit" = 0 ] && return  # a step left out of this session
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/logs/$name.log" 2>&1
  echo "| $name | rc $? | $((SECONDS - t0)) s |" >> "$out/logs/steps.txt"
}
step cuda-tests "${CUDA_TESTS_S:-200}" python3 -m pytest -q -m cuda -p no:cacheprovider tests/workers
step truth "${TRUTH_S:-170}" python3 -m bench.truth.run --only ${TRUTH_CASES:-dropout-gpt2 lora-r8-llama1b adamw8bit-llama1b liger-llama1b} --out "$out/logs/truth.json"
# Several GPUs of one host (a 2- or 4-GPU machine; cases needing more GPUs are skipped).
step distributed-tests "${DIST_TESTS_S:-0}" python3 -m pytest -q -m cuda -p no:cacheprovider tests/workers/test_distributed_cuda.py
step distributed-truth "${DIST_TRUTH_S:-0}" python3 -m bench.truth.run --only ${DIST_CASES:-ddp-gpt2-2 fsdp-llama8b-2 fsdp-llama1b-bf16mp-2 ddp-gpt2-4 fsdp-llama8b-4 hsdp-llama1b-4} --out "$out/logs/distributed.json"
step sweep "${SWEEP_S:-60}" python3 bench/sweep_rate.py --device cuda --runs 1
step clean "${CLEAN_S:-150}" python3 bench/experiment_rate.py --device cuda --only "default flags,1 warm,2 warm" --seq 20 --burst 40
step trials "${TRIALS_S:-300}" python3 bench/model_trials.py --device cuda --model gpt2 --trials 4 --batch 4 --seq 256
tar -C "$out" -czf "$out/logs.tar.gz" logs
for f in cuda-tests truth distributed-tests distributed-truth sweep clean trials; do
  echo "== $f"
  [ -f "$out/logs/$f.log" ] && grep -v -i "warn" "$out/logs/$f.log" | tail -n 14
done
echo "| step | exit | time |"
echo "| --- | --- | --- |"
cat "$out/logs/steps.txt"
