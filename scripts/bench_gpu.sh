#!/usr/bin/env bash
# The GPU figures the README reports, measured in one sitting: bash scripts/bench_gpu.sh PART CORPUS LOGDIR
#
# PART is one of smoke | tests | speed | runs | recipe | tune | nanogpt (each made to end within 10 minutes on one H100),
# or all (nanogpt only where NANOGPT is set). CORPUS is Tiny Shakespeare (or any text); every command and what it printed
# goes to LOGDIR/PART.log, one file per part.
#   smoke  the first thing to run on a lent GPU, about five minutes: every CUDA path once, one PASS or FAIL line each
#          (the CUDA tests; the GPU preset in bfloat16 and float16, compiled and not, float16 on cuda:0 by name; a
#          resume; each compile mode and scope offered; torchrun with NCCL, one process; sample.py eager and compiled,
#          streamed and batched; host syncs per sampled character counted under torch.cuda.set_sync_debug_mode)
#   tests  the whole suite on this machine (every failure, the slowest tests), then the CUDA-only tests alone
#   speed  bench.py on the GPU preset (a step, its halves, the update's operations, sampling), compiled by blocks
#          against the whole model and against no compilation; bench_sample.py cached, uncached and compiled, in
#          float32 and bfloat16
#   runs   the default command with an empty compile cache (evaluations compiled too, and not), then 3 rounds with
#          and without compilation (the first compiled round fills the cache, so the median is a warm run's);
#          sample.py's whole command for 500 characters with and without --compile
#   recipe nanoGPT's recipe (the preset shakespeare_char) once, to set beside nanoGPT's own run on the same card
#   tune   the default preset at 500, 600 and 700 steps, two seeds each (warm cache): how few steps reach <= 1.45
#   nanogpt nanoGPT's own run of that recipe, timed whole, its checkpoint then scored as our full validation is
#          (scripts/score_nanogpt.py); NANOGPT=DIR names a checkout of karpathy/nanoGPT (not part of this project)
# QUICK=1 shrinks every run and round to check the script itself on any machine, a CPU included (figures meaningless).
set -u -o pipefail
if [ $# -ne 3 ] || [ ! -f "$2" ]; then
    echo "usage: [NANOGPT=DIR] bash scripts/bench_gpu.sh smoke|tests|speed|runs|recipe|tune|nanogpt|all CORPUS LOGDIR" \
         "(CORPUS: a text file)" >&2
    exit 2
fi
part=$1 corpus=$(realpath "$2") logs=${3%/}
if [ -L "$logs" ]; then  # its logs would land wherever the link points
    echo "error: the log folder $3 is a symbolic link; name a real folder" >&2
    exit 2
fi
logs=$(realpath -m "$logs")

if [ "${QUICK:-0}" = 1 ]; then
    shrink=(--batch_size 2 --max_iters 4 --eval_interval 2 --eval_iters 1 --full_val false)
    small=(--n_layer 1 --n_head 2 --n_embd 32 --block_size 32 --compile false) steps=4 more=6 compiled=--no-compile
    rounds=1 iters=2 tokens=20
    nano_shrink=(--batch_size=2 --max_iters=4 --lr_decay_iters=4 --eval_interval=2 --eval_iters=1 --log_interval=1)
else
    shrink=() rounds=3 iters=20 tokens=500 nano_shrink=()
    small=() steps=100 more=150 compiled=--compile
fi

TIMEFORMAT='[%R s whole]'
run() {  # prints the command, runs it and times it whole; a failure is logged and the part goes on
    echo "\$ $*"
    time "$@"
    local code=$?
    echo "[exit $code]"
    echo
    return $code
}

verdicts=()
check() {  # NAME COMMAND...: run() it, then one line PASS NAME or FAIL NAME (exit N), kept for the part's summary
    local name=$1
    shift
    run "$@"
    local code=$?
    if [ $code = 0 ]; then verdicts+=("PASS $name"); else verdicts+=("FAIL $name (exit $code)"); fi
    echo "${verdicts[-1]}"
    echo
}

# Host syncs of sampling, counted: torch.cuda's sync debug mode warns at every wait of the host for the GPU.
# python -c "$syncs" CHECKPOINT eager|compiled CHARACTERS
syncs='import sys, warnings, torch
from pathlib import Path
from training import checkpoint
from model.generate import compiled_step, generate, one_token_step
path, kind, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
device = "cuda" if torch.cuda.is_available() else "cpu"
model, tokenizer, _ = checkpoint.load_model(path, device)
step = compiled_step(device) if kind == "compiled" else one_token_step
generate(model, [[0]], 8, step=step)  # compiled before counting
if device == "cuda":
    torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    text = generate(model, [tokenizer.encode("ROMEO:")] * 2, n, step=step)
waits = sum("synchroniz" in str(w.message) for w in caught)
print(f"{kind}: {waits} host syncs for 2 x {n} characters ({waits / n:.3f} per character)" if device == "cuda"
      else f"{kind}: {len(text[0])} characters; host syncs are counted on CUDA only")'

part_smoke() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    run python -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
    local gpu=1
    python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || gpu=0
    check "tests/test_cuda.py and test_cuda_paths.py" \
        python -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_cuda_paths.py
    local common=(--config shakespeare_char_gpu --data "$corpus" --cache_dir "$work/cache" --eval_interval 50
                  --eval_iters 5 --max_iters "$steps" "${small[@]}")
    # bfloat16 and float16 (the scaler), compiled and not; float16 on a GPU chosen by its index. A CPU (QUICK=1) has
    # no float16 training and compiles in the suite: there, the float32 and bfloat16 steps uncompiled.
    local dtypes=(bfloat16 float16) compiles=(true false)
    [ $gpu = 1 ] || dtypes=(float32 bfloat16) compiles=(false)
    for dtype in "${dtypes[@]}"; do
        for compile in "${compiles[@]}"; do
            local device=()
            [ "$dtype" = float16 ] && device=(--device cuda:0)
            check "train $dtype, compile $compile${device:+ on cuda:0}" python train.py "${common[@]}" --dtype "$dtype" \
                --compile "$compile" "${device[@]}" --out_dir "$work/$dtype-$compile"
        done
    done
    check "resume (bfloat16)" python train.py "${common[@]}" --dtype bfloat16 --compile "${compiles[0]}" \
        --out_dir "$work/bfloat16-${compiles[0]}" --max_iters "$more" --resume
    # every compile mode and scope still offered, on a small shape (max-autotune-no-cudagraphs times kernels)
    if [ $gpu = 1 ]; then
        for mode in default max-autotune-no-cudagraphs; do
            for scope in blocks model; do
                check "compile mode $mode, scope $scope" python train.py "${common[@]}" --compile true \
                    --compile_mode "$mode" --compile_scope "$scope" --n_layer 2 --n_embd 128 --n_head 4 \
                    --block_size 64 --max_iters 20 --out_dir "$work/$mode-$scope"
            done
        done
    fi
    check "torchrun, one process ($([ $gpu = 1 ] && echo NCCL || echo gloo))" torchrun --standalone \
        --nproc_per_node 1 train.py "${common[@]}" --out_dir "$work/torchrun"
    local model=$work/bfloat16-${compiles[0]}
    check "sample.py eager" python scripts/sample.py --out_dir "$model" --max_new_tokens "$tokens" --no-compile
    check "sample.py $compiled, streamed, 2 rows" python scripts/sample.py --out_dir "$model" \
        --max_new_tokens "$tokens" "$compiled" --stream --prompt "ROMEO:" --num_samples 2
    for kind in eager compiled; do
        [ $gpu = 1 ] || [ $kind = eager ] || continue  # (the CPU's compiled step is in the suite)
        check "sampling $kind, host syncs counted" python -c "$syncs" "$model/ckpt_best.pt" $kind "$tokens"
    done
    echo "smoke: $(printf '%s\n' "${verdicts[@]}" | grep -c '^PASS') passed," \
         "$(printf '%s\n' "${verdicts[@]}" | grep -c '^FAIL') failed"
    printf '%s\n' "${verdicts[@]}"
}

part_tests() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    run python -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
    # every failure, not the first only, and the slowest tests; cut off in time for the CUDA tests to run after it
    run timeout 420 python -m pytest -q -p no:cacheprovider --durations=15
    run python -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py
}

part_speed() {
    local common=(--data "$corpus" --cache_dir "$work/cache" "${shrink[@]}")
    run python scripts/bench.py --config shakespeare_char_gpu "${common[@]}" --iters "$iters" --sample_tokens "$tokens"
    run python scripts/bench.py --config shakespeare_char_gpu "${common[@]}" --iters "$iters" --rounds "$rounds" \
        --compile true --compare compile_scope=blocks,model
    run python scripts/bench.py --config shakespeare_char_gpu "${common[@]}" --iters "$iters" --rounds "$rounds" \
        --compare compile=true,false
    run python scripts/bench_sample.py --dtype float32,bfloat16 --compile --rounds "$rounds" --new_tokens "$tokens"
}

part_runs() {
    local common=(--data "$corpus" --cache_dir "$work/cache" "${shrink[@]}")
    run python scripts/bench_run.py --out_dir "$work/cold" --cold_compile_cache --compare compile_eval=true,false \
        "${common[@]}"
    run python scripts/bench_run.py --out_dir "$work/warm" --repeat 3 --compare compile=true,false "${common[@]}"
    local model
    model=$(find "$work/warm" -name ckpt_best.pt -print -quit)
    for compiled in --no-compile --compile; do
        run python scripts/sample.py --ckpt "$model" --max_new_tokens "$tokens" --no-stream "$compiled"
    done
}

part_recipe() {
    run python scripts/bench_run.py --out_dir "$work/recipe" --config shakespeare_char --data "$corpus" \
        --cache_dir "$work/cache" "${shrink[@]}"
}

part_tune() {
    local steps=500,600,700
    [ "${QUICK:-0}" = 1 ] && steps=2,4
    run python scripts/bench_run.py --out_dir "$work/tune" --data "$corpus" --cache_dir "$work/cache" "${shrink[@]}" \
        --compare max_iters="$steps" --compare seed=1337,2
}

part_nanogpt() {
    # A copy of the checkout's code (its Python files, configs and this dataset's prepare.py) in $work: nothing in
    # the user's checkout is written or removed. Its data folders are left out (OpenWebText's are gigabytes).
    local dir=$work/nanogpt-checkout data
    data=$dir/data/shakespeare_char
    run mkdir -p "$data"
    run cp -r "$NANOGPT"/*.py "$NANOGPT/config" "$dir/"
    run cp "$NANOGPT/data/shakespeare_char/prepare.py" "$data/"
    cp "$corpus" "$data/input.txt"  # else its prepare.py downloads it; offline here
    # prepare.py imports requests only to download, which it then does not: a stand-in where it is not installed
    run env -C "$data" python -c 'import importlib.util, runpy, sys, types
if importlib.util.find_spec("requests") is None:
    sys.modules["requests"] = types.ModuleType("requests")
runpy.run_path("prepare.py", run_name="__main__")'
    local device=()
    python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || device=(--device=cpu --compile=False)
    run env -C "$dir" python train.py config/train_shakespeare_char.py --out_dir="$work/nanogpt" "${device[@]}" \
        "${nano_shrink[@]}"
    run python scripts/score_nanogpt.py "$dir" "$work/nanogpt/ckpt.pt"
}

parts=("$part")
if [ "$part" = all ]; then
    parts=(smoke tests speed runs recipe tune nanogpt)
    [ -f "${NANOGPT:-}/train.py" ] || { unset 'parts[6]'; echo "note: NANOGPT not set: no nanogpt part"; }
fi
for p in "${parts[@]}"; do  # every mistake is found before anything runs
    case "$p" in
        nanogpt) if [ ! -f "${NANOGPT:-}/train.py" ]; then
            echo "error: set NANOGPT to a checkout of karpathy/nanoGPT (a folder with train.py)" >&2; exit 2; fi
            NANOGPT=$(realpath "$NANOGPT") ;;
        smoke|tests|speed|runs|recipe|tune) ;;
        *) echo "error: the part is smoke, tests, speed, runs, recipe, tune, nanogpt or all, not '$p'" >&2; exit 2 ;;
    esac
    if [ -L "$logs/$p.log" ]; then
        echo "error: the log $logs/$p.log is a symbolic link; remove it or name another LOGDIR" >&2
        exit 2
    fi
done
mkdir -p "$logs" || exit 2
[ -d "$logs" ] && [ ! -L "$logs" ] || { echo "error: the log folder $logs is not a folder" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
work=$(mktemp -d)  # run folders and copies: the logs keep what matters
trap 'rm -rf "$work"' EXIT

# The log is opened without following a link, its folder too (a link planted after the checks above is refused).
tee_log() {  # LOGFILE: stdin to stdout and to LOGFILE
    python -c 'import os, sys
folder, name = os.path.split(sys.argv[1])
folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
log = open(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=folder_fd), "wb")
out = sys.stdout.buffer
while chunk := os.read(0, 1 << 16):
    log.write(chunk)
    log.flush()
    if out is not None:
        try:
            out.write(chunk)
            out.flush()
        except BrokenPipeError:  # the reader of stdout has gone: the log is still written
            out = None' "$1"
}

# A part runs as a job in its own process group (set -m): SIGTERM or Ctrl-C ends that group, every process the part
# started, and waits for it, so no step goes on (or says FAIL) after the stop; then the EXIT trap removes $work.
set -m
job=
stop() {  # SIGNAL EXIT_CODE
    trap '' INT TERM
    if [ -n "$job" ]; then
        kill -TERM -- "-$job" 2>/dev/null
        for _ in $(seq 100); do kill -0 -- "-$job" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$job" 2>/dev/null
        wait 2>/dev/null
    fi
    echo "bench_gpu.sh: stopped by $1; the logs so far are in $logs" >&2
    exit "$2"
}
trap 'stop SIGTERM 143' TERM
trap 'stop Ctrl-C 130' INT
status=0
for p in "${parts[@]}"; do
    "part_$p" 2>&1 | tee_log "$logs/$p.log" &
    job=$(jobs -p)
    wait "$!" || status=$?
    job=
done
exit "$status"
