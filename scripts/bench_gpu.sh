#!/usr/bin/env bash
# The GPU figures in one sitting: [NANOGPT=DIR] bash scripts/bench_gpu.sh PART CORPUS LOGDIR, logged to LOGDIR/PART.log.
# A smoke step says PASS or FAIL (why); a smoke part with a FAIL exits 1. docs/speed.md says what each part measures.
# QUICK=1 shrinks every run, to check the script on any machine (the figures then mean nothing).
set -u -o pipefail
parts_named="smoke, smoke2, smoke3, tests, speed, runs, recipe, tune, nanogpt or all"
if [ $# -ne 3 ] || [ ! -f "$2" ]; then
    echo "usage: [NANOGPT=DIR] bash scripts/bench_gpu.sh PART CORPUS LOGDIR (PART: $parts_named; CORPUS: a file)" >&2
    exit 2
fi
part=$1 corpus=$(realpath "$2") logs=${3%/}
[ -L "$logs" ] && { echo "error: the log folder $3 is a symbolic link. Name a real folder" >&2; exit 2; }
logs=$(realpath -m "$logs")

if [ "${QUICK:-0}" = 1 ]; then
    shrink=(--batch_size 2 --max_iters 4 --eval_interval 2 --eval_iters 1 --full_val false)
    small=(--n_layer 1 --n_head 2 --n_embd 32 --block_size 32 --batch_size 4 --eval_iters 1 --full_val false)
    preset=(--max_iters 4 --eval_interval 4 --log_interval 2 --compile_eval false) steps=4 more=6 bound=4.6
    compiled=--no-compile syncs=1 rounds=1 iters=2 tokens=20 whole=4.6  # a CPU reads each step's finite flag
    nano_shrink=(--batch_size=2 --max_iters=4 --lr_decay_iters=4 --eval_interval=2 --eval_iters=1 --log_interval=1)
else
    shrink=() small=() preset=() nano_shrink=() rounds=3 iters=20 tokens=500
    steps=100 more=150 compiled=--compile bound=3.0 whole=2.0 syncs=0
fi

TIMEFORMAT='[%R s whole]'
run() {  # print the command, run and time it; its output kept in $work/step.out
    echo "\$ $*"
    time "$@" 2>&1 | tee "$work/step.out"
    local code=$?
    printf '[exit %s]\n\n' $code
    return $code
}

# what a compile that fell back, a CUDA graph not taken or a refused recompilation print
fallback='torch\.compile failed|compiling the decoding step failed|skipping cudagraphs'
fallback+='|hit config\.(recompile|cache_size)_limit|RecompileError'
warned='^[^ ].*(UserWarning|FutureWarning|DeprecationWarning): '  # a Python warning on the user's screen
# python -c "$loss_check" RUN_DIR BOUND < OUTPUT: the run's figures; exit 1 unless its loss is finite and below BOUND
loss_check='import json, math, re, sys
summary = json.load(open(sys.argv[1] + "/summary.json"))
loss = summary.get("full_val_loss", summary.get("val_loss"))
times = summary["wall_seconds"], summary["train_seconds"], summary["seconds"].get("compilation", 0)
mfu = (re.findall(r"mfu ([0-9.]+)%", sys.stdin.read()) or ["(not logged) "])[-1]
print("loss {}, {:.1f} s whole, {:.1f} s training, {:.1f} s compiling, MFU {}%".format(loss, *times, mfu))
sys.exit(not (loss is not None and math.isfinite(loss) and loss < float(sys.argv[2])))'

verdicts=()
check() {  # NAME [--run DIR BOUND] [--expect REGEX] COMMAND...: run() it (--out_dir DIR added), then PASS or FAIL
    local name=$1 dir= most= expect= verdict= figures out=$work/step.out
    shift
    if [ "$1" = --run ]; then dir=$2 most=$3; shift 3; fi
    if [ "$1" = --expect ]; then expect=$2; shift 2; fi
    run "$@" ${dir:+--out_dir "$dir"}
    local code=$?
    if [ $code != 0 ]; then
        verdict="FAIL $name (exit $code)"
    elif grep -Eq "$fallback" "$out"; then
        verdict="FAIL $name (fell back: $(grep -Eom1 "$fallback" "$out"))"
    elif grep -Eq "$warned" "$out"; then
        verdict="FAIL $name (a warning reached the user: $(grep -Em1 "$warned" "$out" | cut -c1-160))"
    elif [ -n "$expect" ] && ! grep -Eq "$expect" "$out"; then
        verdict="FAIL $name (its output never says /$expect/)"
    elif [ -n "$dir" ]; then
        if figures=$(python -c "$loss_check" "$dir" "$most" < "$out" 2>&1); then
            verdict="PASS $name: $figures"
        else
            verdict="FAIL $name (not a finite loss below $most: $figures)"
        fi
    fi
    verdicts+=("${verdict:-PASS $name}")
    printf '%s\n\n' "${verdicts[-1]}"
}

verdict_summary() {  # PART: the verdicts counted and repeated; exit 1 if one is FAIL
    local failed
    failed=$(printf '%s\n' "${verdicts[@]}" | grep -c '^FAIL')
    echo "$1: $(printf '%s\n' "${verdicts[@]}" | grep -c '^PASS') passed, $failed failed"
    printf '%s\n' "${verdicts[@]}"
    [ "$failed" = 0 ]
}

about_the_machine() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    run python -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
}

# python -c "$decoding" CHECKPOINT eager|compiled CHARACTERS MOST_SYNCS: a padded batch of three rows, greedy, twice;
# exit 1 when the second call recompiled, recorded or skipped a CUDA graph, or waited more than MOST_SYNCS times.
decoding='import contextlib, sys, torch
from torch._dynamo.utils import counters
from model.generate import compiled_step, generate, one_token_step
from training import checkpoint
from common.machine import pick_dtype
sys.path.insert(0, "scripts")
from bench import GraphRecordings, HostWaits
path, kind, n, most = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
cuda = device.type == "cuda"
model, _, _ = checkpoint.load_model(path, device)
model = model.to(pick_dtype("auto", device, sampling=True, params=model.num_params(non_embedding=False)))
said = []
step = compiled_step(device.type, warn=said.append) if kind == "compiled" else one_token_step
recorded = GraphRecordings().__enter__()
counters.clear()
prompts = [[1, 2, 3, 4, 5], [6], [7, 1]]
warm = generate(model, prompts, n, temperature=0, step=step)
first = recorded.count, counters["stats"]["unique_graphs"]
with torch._dynamo.config.patch(error_on_recompile=True), \
        (HostWaits(device) if cuda else contextlib.nullcontext()) as waits:
    text = generate(model, prompts, n, temperature=0, step=step)
skips = counters["inductor"]["cudagraph_skips"]
print(*said, sep="\n", file=sys.stderr)
print(f"{kind}, {model.wte.weight.dtype}: 3 rows x {n} characters, the same text twice: {text == warm}; "
      + (f"{waits.count} host syncs in the counted call (at most {most}), {recorded.count} CUDA graph(s) recorded "
         f"({first[0]} by the first call, of {first[1]} graph(s) compiled), {skips} cudagraph skips{waits.describe()}"
         if cuda else "host syncs and CUDA graphs: counted on CUDA only"))
sys.exit(bool(said or text != warm or (cuda and (waits.count > most or skips or first[0] != recorded.count
                                                  or recorded.count != (kind == "compiled")))))'

part_smoke() {
    about_the_machine
    local run_dir=$work/preset dtypes=(bfloat16 float16) compile=true
    check "GPU preset, compiled, end to end" --run "$run_dir" "$whole" python train.py "${gpu_preset[@]}" \
        --compile true "${small[@]}" "${preset[@]}"
    [ $gpu = 1 ] || dtypes=(float32 bfloat16) compile=false  # a CPU: no float16 training; reads counted uncompiled
    for dtype in "${dtypes[@]}"; do
        check "host waits per training step, $dtype" python scripts/bench.py "${gpu_preset[@]}" "${small[@]}" \
            --dtype "$dtype" --compile "$compile" --warmup 3 --iters "$iters" --host_syncs "$syncs"
    done
    for kind in eager compiled; do
        check "sampling $kind: a padded batch, host syncs counted" python -c "$decoding" \
            "$run_dir/ckpt_best.safetensors" $kind "$tokens" 1
    done
    verdict_summary smoke
}

part_smoke2() {
    about_the_machine
    local all_ran='[0-9]+ passed' compile=false  # on a GPU none may be skipped
    [ $gpu = 1 ] && all_ran='^[0-9]+ passed(, [0-9]+ warnings?)? in ' compile=true
    check "tests/test_cuda.py and test_cuda_paths.py" --expect "$all_ran" \
        python -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_cuda_paths.py
    local one=(torchrun --standalone --nproc_per_node 1 train.py "${short[@]}" --compile "$compile")
    check "torchrun, one process (no process group)" --run "$work/torchrun" "$bound" "${one[@]}"
    # DDP over NCCL (gloo on a CPU) at world size 1: no_sync and compiled blocks under DDP on one GPU
    check "DDP at world size 1" --run "$work/ddp" "$bound" --expect "DDP over (nccl|gloo)" "${one[@]}" --ddp always \
        --grad_accum_steps 2
    verdict_summary smoke2
}

part_smoke3() {
    about_the_machine
    # float16 (the scaler) on a GPU named by its index; a CPU has no float16 training
    local runs=("bfloat16 false" "float16 true" "float16 false") model=$work/bfloat16-false
    [ $gpu = 1 ] || runs=("float32 false" "bfloat16 false")
    for one in "${runs[@]}"; do
        local dtype=${one% *} compile=${one#* } device=()
        [ "$dtype" = float16 ] && device=(--device cuda:0)
        check "train $dtype, compile $compile${device:+ on cuda:0}" --run "$work/$dtype-$compile" "$bound" \
            python train.py "${short[@]}" --dtype "$dtype" --compile "$compile" "${device[@]}"
    done
    check "resume (bfloat16)" --run "$model" "$bound" python train.py "${short[@]}" --dtype bfloat16 \
        --compile false --max_iters "$more" --resume
    if [ $gpu = 1 ]; then  # every compile mode and scope offered, on a small shape
        for mode in default max-autotune-no-cudagraphs; do
            for scope in blocks model; do
                check "compile mode $mode, scope $scope" --run "$work/$mode-$scope" 3.5 python train.py \
                    "${short[@]}" --compile true --compile_mode "$mode" --compile_scope "$scope" --n_layer 2 \
                    --n_embd 128 --n_head 4 --block_size 64 --max_iters 20 --eval_interval 20
            done
        done
    fi
    printf 'ROMEO:\nO\nJULIET: O Romeo\n' > "$work/prompts.txt"  # three rows of different lengths: a padded batch
    local sample=(python scripts/sample.py --out_dir "$model" --max_new_tokens "$tokens")
    check "sample.py eager" "${sample[@]}" --no-compile
    check "sample.py $compiled, streamed, 2 rows" "${sample[@]}" "$compiled" --stream --prompt "ROMEO:" --num_samples 2
    check "sample.py $compiled, a padded batch of 3" "${sample[@]}" "$compiled" --no-stream \
        --prompt_file "$work/prompts.txt" --prompts_per_line
    verdict_summary smoke3
}

part_tests() {
    about_the_machine
    run timeout 420 python -m pytest -q -p no:cacheprovider --durations=15  # cut off in time for the CUDA tests
    run python -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py
}

part_speed() {
    local bench=(python scripts/bench.py "${gpu_preset[@]}" "${shrink[@]}" --iters "$iters")
    run "${bench[@]}" --sample_tokens "$tokens" --compile true
    run "${bench[@]}" --rounds "$rounds" --compile true --compare compile_scope=blocks,model
    run "${bench[@]}" --rounds "$rounds" --compare compile=true,false
    run python scripts/bench_sample.py --dtype float32,bfloat16 --compile --rounds "$rounds" --new_tokens "$tokens"
}

bench_run() {  # FOLDER OPTIONS...: bench_run.py on the corpus, its runs in $work/FOLDER
    run python scripts/bench_run.py --out_dir "$work/$1" --data "$corpus" --cache_dir "$work/cache" "${shrink[@]}" \
        "${@:2}"
}

part_runs() {
    bench_run cold --cold_compile_cache --compare compile_eval=true,false --compile true
    bench_run warm --repeat 3 --compare compile=true,false
    local model
    model=$(find "$work/warm" -name ckpt_best.safetensors -print -quit)
    for compiled in --no-compile --compile; do
        run python scripts/sample.py --ckpt "$model" --max_new_tokens "$tokens" --no-stream "$compiled"
    done
}

part_recipe() {
    bench_run recipe --config shakespeare_char
}

part_tune() {
    local steps=500,600,700
    [ "${QUICK:-0}" = 1 ] && steps=2,4
    bench_run tune --compare max_iters="$steps" --compare seed=1337,2
}

part_nanogpt() {  # in bench_run.py's copy of the checkout, prepared on the corpus: the checkout is left as it is
    run python -c 'import sys; from pathlib import Path; sys.path[:0] = ["scripts", "."]
from bench_run import prepare_nanogpt
from errors import run_cli
sys.exit(run_cli(lambda argv: prepare_nanogpt(*map(Path, argv)) and 0, sys.argv[1:]))' "$NANOGPT" "$corpus" "$work"
    local device=()
    [ $gpu = 1 ] || device=(--device=cpu --compile=False)
    run env -C "$work/nanogpt-code" python train.py config/train_shakespeare_char.py --out_dir="$work/nanogpt" \
        "${device[@]}" "${nano_shrink[@]}"
    run python scripts/score_nanogpt.py "$work/nanogpt-code" "$work/nanogpt/ckpt.pt"
}

parts=("$part")
if [ "$part" = all ]; then
    parts=(smoke smoke2 smoke3 tests speed runs recipe tune nanogpt)
    [ -f "${NANOGPT:-}/train.py" ] || { unset 'parts[8]'; echo "note: NANOGPT not set: no nanogpt part"; }
fi
for p in "${parts[@]}"; do  # every mistake is found before anything runs
    declare -F "part_$p" > /dev/null || { echo "error: the part is $parts_named, not '$p'" >&2; exit 2; }
    if [ "$p" = nanogpt ]; then
        [ -f "${NANOGPT:-}/train.py" ] || { echo "error: set NANOGPT to a checkout of karpathy/nanoGPT" >&2; exit 2; }
        NANOGPT=$(realpath "$NANOGPT")
    fi
    if [ -L "$logs/$p.log" ]; then
        echo "error: the log $logs/$p.log is a symbolic link; remove it or name another LOGDIR" >&2
        exit 2
    fi
done
mkdir -p "$logs" && [ -d "$logs" ] && [ ! -L "$logs" ] || { echo "error: $logs is not a folder" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
work=$(mktemp -d)  # run folders and copies: the logs keep what matters
trap 'rm -rf "$work"' EXIT
gpu_preset=(--config shakespeare_char_gpu --data "$corpus" --cache_dir "$work/cache")
short=("${gpu_preset[@]}" --eval_interval 50 --eval_iters 5 --max_iters "$steps" "${small[@]}")  # smoke2, smoke3

# Each part runs in its own process group (set -m): a stop ends every process it started, then the EXIT trap
# removes $work.
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
gpu=1
python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || gpu=0
status=0
for p in "${parts[@]}"; do
    "part_$p" 2>&1 | tee -p "$logs/$p.log" &  # -p: the log is still written when the screen's pipe closes
    job=$(jobs -p)
    wait "$!" || status=$?
    job=
done
exit "$status"
