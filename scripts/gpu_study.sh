#!/usr/bin/env bash
# The GPU study (params/gpu-quick.yaml) in ONE command of a lent GPU machine, prepared and
# rehearsed here. Run from the project root:
#
#   bash scripts/gpu_study.sh prepare     the wheels (.whl/) and Fashion-MNIST (.gpu-data/) it
#                                         carries, then prints the device command
#   bash scripts/gpu_study.sh command     prints the device command, its carry list and timeout
#   bash scripts/gpu_study.sh rehearse    runs that command here, on the CPU at a tiny size
#                                         (params/gpu-rehearsal.yaml), in a copy of the tree that
#                                         holds what would travel, with only the GPU machine's
#                                         packages importable, a fake $OUT, then checks $OUT
#   bash scripts/gpu_study.sh unpack DIR  the device's $OUT files (DIR) into results/gpu-quick
#   bash scripts/gpu_study.sh device      what the device command runs (there: $OUT set)
#
# The device machine (see docs/gpu.md) has Python 3.12 with PyTorch, timm and the
# scientific stack, no network: pydantic and what it needs travel as wheels (scripts/gpu_wheels.txt),
# the dataset as its four IDX files. Its $OUT returns at most 8 files: the results come back as one
# tarball beside the run record and the logs.
set -euo pipefail

WHEELS_DIR=.whl
DATA_DIR=.gpu-data
DATASET_DIR=${DATASET_DIR:-/usr/share/datasets/fashion-mnist}
# Seconds. The study's own limit (it stops cleanly and keeps the seeds that finished), the hard
# kill after it, then the GPU tests' limit: 10 + 380 + 80 + packing stays under the 8 minutes the
# issue gives one command (params/gpu-quick.yaml has the arithmetic).
STUDY_LIMIT=${GPU_STUDY_LIMIT:-360}
STUDY_KILL=$((STUDY_LIMIT + 20))
TESTS_LIMIT=${GPU_TESTS_LIMIT:-80}
DEVICE_COMMAND='bash scripts/gpu_study.sh device'
DEVICE_CARRY='[".whl", ".gpu-data"]'
DEVICE_TIMEOUT=540

wheel_names() { grep -v '^#' scripts/gpu_wheels.txt | grep -v '^$'; }

# $1: target folder; $2..: pip's platform flags (none: this machine's Python and platform).
download_wheels() {
    local into=$1
    shift
    rm -rf "$into" && mkdir -p "$into"
    # shellcheck disable=SC2046
    python3 -m pip download --quiet --no-deps --only-binary=:all: "$@" -d "$into" $(wheel_names)
}

prepare() {
    download_wheels "$WHEELS_DIR" --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64
    rm -rf "$DATA_DIR" && mkdir -p "$DATA_DIR/fashion-mnist"
    cp "$DATASET_DIR"/*-ubyte.gz "$DATA_DIR/fashion-mnist/"
    local wheels data tracked
    wheels=$(du -sm "$WHEELS_DIR" | cut -f1)
    data=$(du -sm "$DATA_DIR" | cut -f1)
    tracked=$(git ls-files -z | du -cm --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    echo "carried: $WHEELS_DIR ${wheels} MiB ($(ls "$WHEELS_DIR" | wc -l) wheels), $DATA_DIR ${data} MiB;" \
        "tracked files ${tracked} MiB (limit 64 MiB in all)"
    command_text
}

command_text() {
    echo "device command (run with: command, carry, timeout_s):"
    echo "  command:   $DEVICE_COMMAND"
    echo "  carry:     $DEVICE_CARRY"
    echo "  timeout_s: $DEVICE_TIMEOUT"
}

# What runs on the GPU machine, in the project root, with $OUT set.
device() {
    : "${OUT:?OUT must name the folder whose files come back}"
    local python=${PYTHON:-python3} site=${GPU_SITE:-/tmp/site} work=${GPU_WORK:-/tmp/gpu-work}
    local started=$SECONDS
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$WHEELS_DIR"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    {
        nvidia-smi || echo "no nvidia-smi"
        "$python" -c 'import pydantic, torch, timm, numpy
print("pydantic", pydantic.VERSION, pydantic.__file__)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())
print("timm", timm.__version__, "numpy", numpy.__version__)'
    } >"$OUT/environment.txt" 2>&1
    rm -rf "$work" && mkdir -p "$work"
    local status=0
    # shellcheck disable=SC2086
    timeout -k 10 "$STUDY_KILL" "$python" -m modelupgrade gpu-study \
        --overlay params/gpu-quick.yaml ${GPU_STUDY_OVERLAYS:-} --out "$work/gpu-quick" \
        --time-limit "$STUDY_LIMIT" --dataset-root "$DATA_DIR/fashion-mnist" \
        >"$OUT/study.log" 2>&1 || status=$?
    echo "study exit $status after $((SECONDS - started)) s" | tee -a "$OUT/study.log"
    if [ -d "$work/gpu-quick" ]; then
        cp "$work/gpu-quick/run.json" "$OUT/" 2>/dev/null || true
        # A seed killed under way (the hard timeout) leaves its scratch: it does not come back.
        tar -czf "$OUT/gpu-quick.tar.gz" --exclude='.seed-*' --exclude=.splits -C "$work" gpu-quick
    fi
    status=0
    timeout -k 5 "$TESTS_LIMIT" "$python" -m pytest -m gpu -q -p no:cacheprovider \
        tests/test_gpu.py tests/test_gpu_study.py tests/test_search_without_faiss.py \
        >"$OUT/pytest-gpu.log" 2>&1 || status=$?
    echo "pytest -m gpu exit $status after $((SECONDS - started)) s" | tee -a "$OUT/pytest-gpu.log"
    tail -5 "$OUT/study.log"
}

# The device command on this machine: a copy of what would travel (tracked and untracked files
# git does not ignore, and the carried folders), this machine's Python with only the GPU machine's
# packages importable (scripts/gpu_machine), the wheels for that Python, the tiny profile on the
# CPU, a fake $OUT; then the checks on what came back.
rehearse() {
    [ -d "$DATA_DIR/fashion-mnist" ] || { echo "run: bash scripts/gpu_study.sh prepare" >&2; exit 2; }
    local scratch tree
    scratch=$(mktemp -d /tmp/gpu-rehearsal.XXXXXX)
    tree=$scratch/tree
    mkdir -p "$tree" "$scratch/out"
    git ls-files -z -co --exclude-standard | tar -c --null -T - | tar -x -C "$tree"
    cp -r "$DATA_DIR" "$tree/"
    download_wheels "$tree/$WHEELS_DIR"
    echo "rehearsal in $scratch"
    (
        cd "$tree"
        export OUT=$scratch/out GPU_SITE=$scratch/site GPU_WORK=$scratch/work
        export PYTHON=${PYTHON:-python3} PYTHONPATH=$PWD/scripts/gpu_machine
        export MODELUPGRADE_DEVICE=cpu OMP_NUM_THREADS=1
        export GPU_STUDY_OVERLAYS=params/gpu-rehearsal.yaml GPU_STUDY_LIMIT=${GPU_STUDY_LIMIT:-240}
        eval "$DEVICE_COMMAND"
    )
    check_out "$scratch/out"
    unpack "$scratch/out" "$scratch/results"
    PYTHONPATH=$PWD python3 -m modelupgrade.report.gpu_scale "$scratch/results/gpu-quick" | head -12
}

# The device tool returns at most 8 files, no deeper than 2 folders, names of [A-Za-z0-9._-].
check_out() {
    local out=$1 files
    files=$(cd "$out" && find . -type f | sed 's|^\./||')
    echo "\$OUT holds $(echo "$files" | wc -l) files: $(echo "$files" | tr '\n' ' ')"
    [ "$(echo "$files" | wc -l)" -le 8 ] || { echo "more than 8 files in \$OUT" >&2; exit 1; }
    if echo "$files" | grep -Eq '/.*/.*/|[^A-Za-z0-9._/-]'; then
        echo "a file in \$OUT is too deep or oddly named" >&2
        exit 1
    fi
    for name in gpu-quick.tar.gz run.json study.log pytest-gpu.log environment.txt; do
        [ -s "$out/$name" ] || { echo "\$OUT lacks $name" >&2; exit 1; }
    done
}

# $1: the folder of the device's $OUT files; $2: where results/gpu-quick goes (default results).
unpack() {
    local from=${1:?give the folder of the device OUT files} into=${2:-results}
    [ -f "$from/gpu-quick.tar.gz" ] || { echo "$from/gpu-quick.tar.gz does not exist" >&2; exit 2; }
    mkdir -p "$into/gpu-quick"
    rm -rf "$into/gpu-quick"/seed-* "$into/gpu-quick/run.json" "$into/gpu-quick/params.yaml"
    tar -xzf "$from/gpu-quick.tar.gz" -C "$into"
    echo "unpacked into $into/gpu-quick: $(ls "$into/gpu-quick" | tr '\n' ' ')"
}

case "${1:-}" in
    prepare) prepare ;;
    command) command_text ;;
    device) device ;;
    rehearse) rehearse ;;
    unpack) unpack "${2:-}" "${3:-results}" ;;
    *)
        sed -n '2,17p' "$0"
        exit 2
        ;;
esac
