#!/usr/bin/env bash
# The GPU measurements, each stage under its own time limit so a slow or
# failing stage costs only itself:
#     bash scripts/gpu_suite.sh OUT_DIR                        # every stage (about 25 minutes: two calls)
#     STAGES="fla_tests mixers" bash scripts/gpu_suite.sh OUT  # only those (fits one 10-min call)
#     SMOKE=1 bash scripts/gpu_suite.sh /tmp/gpu               # the same stages, tiny, on a CPU
# Stages: race_compiled (floor, then xbench: MFU), attention_cuda (every option's
# hand-written kernel, bf16, causal, 1K-16K, against SDPA's FlashAttention as `full`), flex
# (FlexAttention against the hand-written patterns), cuda_tests, race_eager (floor, xbench,
# x-transformers); fla_tests (xbench's chunked engines against fla's kernels),
# mixers (the recurrent mixers' cost with fla's kernels, then with XBENCH_FLA=0 their PyTorch
# chunked form on the same GPU), decode (tokens/s of cached decoding against tokens generated;
# on an H200 `full` had not reached 8K tokens in 100 s: each point is printed as measured).
# Measured on an H200: fla_tests 270 s, mixers_torch 16 s; fla's sweep needs more than 100 s.
# study: a study's runs at its GPU budget, WORKERS at once on the GPU, resumable (see below).
# Everything lands in OUT_DIR, and OUT_DIR/gpu_suite.tar.gz after each stage.
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR}
mkdir -p "$out/r"
log="$out/r/suite.log"
export PYTHONUNBUFFERED=1
if [ "${SMOKE:-0}" = 1 ]; then
  size=default; lengths="256 512"; device=cpu; precision=32-true; steps=3; flex_len=256
  train_dtype=fp32; decode_lengths="64 128"
else
  size=d1024-L12; lengths="1024 2048 4096 8192 16384"; device=cuda; precision=bf16-mixed
  steps=20; flex_len="4096 16384"; train_dtype=bf16
  decode_lengths="1024 2048 4096"
fi

stages=${STAGES:-race_compiled attention_cuda flex cuda_tests race_eager fla_tests mixers decode study}
stage() {  # stage NAME SECONDS COMMAND...; runs when STAGES names NAME or its prefix
  local name=$1 limit=$2; shift 2
  case " $stages " in *" $name "*|*" ${name%%_*} "*|*" ${name%_*} "*) ;; *) return 0 ;; esac
  echo "=== $name (limit ${limit}s) $(date -u +%T)" | tee -a "$log"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - started))s" | tee -a "$log"
  tar -czf "$out/gpu_suite.tar.gz" -C "$out" r
}

{ nvidia-smi 2>&1 | head -15; python3 -c "import torch; print(torch.__version__,
  torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"; } >>"$log" 2>&1
python3 -c "from xformer_bench.config import compose_config; compose_config('model=vanilla')" \
  >>"$log" 2>&1 || { echo "the package does not import: see $log"; tail -20 "$log"; exit 3; }

race="python3 scripts/bench_train.py --sizes $size --steps $steps --device $device
  --precision $precision"
stage race_compiled_floor 90 $race --out "$out/r/train_compiled_floor" --contenders floor --compile
stage race_compiled_xbench 120 $race --out "$out/r/train_compiled_xbench" --contenders xbench \
  --compile
# the hand-written kernels everywhere (XBENCH_FLEX=0); FlexAttention has its own stage
XBENCH_FLEX=0 stage attention_cuda 90 python3 scripts/bench_attention.py --device $device --dtype $train_dtype \
  --lengths $lengths --repeats 3 --cap-seconds 0.5 --cap-megabytes 40000 --out "$out/r"
if [ -f scripts/check_flex_cuda.py ] && [ "${FLEX:-1}" = 1 ]; then
  stage flex 100 python3 scripts/check_flex_cuda.py --device $device --dtype $train_dtype \
    --lengths $flex_len --out "$out/r/flex"
fi
tests=$(ls tests/test_gpu_path.py tests/test_bench_train.py tests/test_ddp.py 2>/dev/null)
[ "${FLEX:-1}" = 1 ] && tests="$tests $(ls tests/test_flex_attention.py 2>/dev/null)"
stage cuda_tests 35 python3 -m pytest -v -p no:cacheprovider -rs $tests
stage race_eager 70 $race --out "$out/r/train_eager"
# fla's kernels (carried as wheels on a machine without them) against xbench's engines
# a fresh machine spends 1-4 minutes a test compiling and autotuning fla's Triton kernels
# (H200, fla 0.6.0): the tests run side by side (pytest-xdist) and fla's timing stage is long
parallel=$(python3 -c "import xdist" 2>/dev/null && echo "-n 10")
stage fla_tests 330 python3 -m pytest $parallel -v -p no:cacheprovider -rs -k "cuda or fla or gpu" \
  tests/test_mixer_gated_linear.py tests/test_mixer_delta_rule.py
mixers="full linear performer s4d hyena retnet gla mamba2 deltanet gated_deltanet"
stage mixers_fla 420 python3 scripts/bench_attention.py --device $device --dtype $train_dtype \
  --attention $mixers --lengths $lengths --repeats 3 --cap-seconds 1 --out "$out/r/mixers_fla"
XBENCH_FLA=0 stage mixers_torch 100 python3 scripts/bench_attention.py --device $device \
  --dtype $train_dtype --attention full retnet gla mamba2 deltanet gated_deltanet \
  --lengths $lengths --repeats 3 --cap-seconds 1 --out "$out/r/mixers_torch"
stage decode 100 python3 scripts/bench_decode.py --device $device --dtype $train_dtype \
  --attention full mamba2 gated_deltanet gla --lengths $decode_lengths --out "$out/r/decode"
# A study at its GPU budget (the study's gpu_budget, printed by --dry-run), WORKERS runs at once
# on the one GPU, each with its share of the CPU cores.  Resumable: the records accumulate in
# STUDY_RESULTS (in the checkout: commit what comes back), finished runs are skipped and a killed
# run resumes from its last resume point; each stage's records are copied to OUT_DIR as it ends.
# Needs the budget's data under data/ (enwik8.zip: the machine is offline); STUDY_DATA overrides.
# STUDY_BUDGET=cpu runs the study's CPU budget instead (a shipped CPU reference re-run on the GPU,
# in fp32: trainer.precision=32-true keeps the CPU runs' ids, so either machine finishes the other's).
# STUDY may name several studies ("narang_activations systems_lm"): one stage each, in turn, each
# limited to STUDY_SECONDS.
study_results=${STUDY_RESULTS:-results/gpu_studies}
for study in ${STUDY:-narang_table1}; do
  if [ "${SMOKE:-0}" = 1 ]; then
    budget="experiment=smoke"
  elif [ "${STUDY_BUDGET:-gpu}" = cpu ]; then
    budget="experiment=$study trainer.precision=32-true ${STUDY_DATA:-}"
  else
    budget="experiment=$study $(python3 -c "from xformer_bench.sweep_plan import budget_lines as b
print(b(['experiment=$study'])[-1].split(' ', 6)[-1])") ${STUDY_DATA:-}"
  fi
  stage "study_$study" ${STUDY_SECONDS:-540} python3 -m xformer_bench.cli -m $budget logger=none \
    paths.results_dir=$study_results --workers ${WORKERS:-4}
  mkdir -p "$out/r/studies"  # the records (not the resume points: they stay on the machine)
  records=$(cd "$out/r/studies" && pwd)
  (cd "$study_results" 2>/dev/null && find . -name '*.json' -not -path './checkpoints/*' \
    -exec cp --parents {} "$records/" \;)
  tar -czf "$out/gpu_suite.tar.gz" -C "$out" r
done
echo "done $(date -u +%T)" | tee -a "$log"
tar -czf "$out/gpu_suite.tar.gz" -C "$out" r
