#!/usr/bin/env bash
# The pre-registered budget curve of docs/card_claim.md: the card-shaped CET-ViT, cet_vit_nano_global and the matched
# ViT, Swin and ToMe at 8, 24 and 48 epochs (seeds 0, 1; 0, 1, 2 at 48), then the 256-token arm (patch 2, 8 epochs,
# seeds 0-3: SEEDS_256). Runs already recorded (a JSON of their name in any RECORDED folder, the committed results of earlier
# sessions) and finished runs are skipped, interrupted ones resumed from their last.ckpt, so the script can be started
# again in a later session, on a fresh machine too; each finished run gets one JSON in RESULTS at once
# (benchmarks/experiments/card_claim.py record).
#
#   VITLAB=.venv/bin/vitlab JOBS=2 bash benchmarks/experiments/card_claim.sh ../shared/datasets/cifar10.npz runs/card-claim
#   BUDGETS="8" SEEDS_MAX=1 SEEDS_256=0 bash benchmarks/experiments/card_claim.sh DATA RUNS trainer.limit_train_batches=2   # a quick look
#   MODELS="cet_card vit" BUDGETS=24 bash benchmarks/experiments/card_claim.sh DATA RUNS   # some cells first
#
# Every run in fp32 (trainer.precision=32-true; docs/card_claim.md, "Changes after the pre-registration").
# JOBS (default 2): trainings at once, one thread each. RESULTS (default
# benchmarks/results/experiments/card_claim_<device>_<date>, the naming scheme of benchmarks/naming.py). RECORDED
# (default benchmarks/results/experiments/card_claim_*): the folders of runs that count as done. SEEDS_256 (default
# "0 1 2 3"): the seeds of the 256-token arm. GIT_REVISION: the
# revision to record, over the runs' env.json (a tree copied without its history, or with a stale one).
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 PATH/TO/cifar10.npz RUNS_DIR [config overrides...]" >&2
    exit 2
fi
data=$1 runs=$2
shift 2
[[ -f $data ]] || { echo "error: $data is not a file; pass the CIFAR-10 npz (x_train, y_train, x_test, y_test)" >&2; exit 2; }
VITLAB=${VITLAB:-vitlab}
PYTHON=${PYTHON:-python}
if [[ -z ${RESULTS:-} ]]; then
    device=$("$PYTHON" -c "from benchmarks.naming import cpu_model, device_name; print(device_name(cpu_model()))")
    RESULTS=benchmarks/results/experiments/card_claim_${device}_$(date -u +%F)
fi
RECORDED=${RECORDED:-benchmarks/results/experiments/card_claim_*}
BUDGETS=${BUDGETS:-8 24 48}
SEEDS_MAX=${SEEDS_MAX:-3}
# the 256-token arm's seeds: 0 1 as registered; 2 3 added by the amendment of 2026-12-06 (docs/card_claim.md)
SEEDS_256=${SEEDS_256:-0 1 2 3}
for seed in $SEEDS_256; do
    [[ $seed =~ ^[0-9]+$ ]] || { echo "error: SEEDS_256 names '$seed'; give seeds as numbers, e.g. SEEDS_256=\"0 1\"" >&2; exit 2; }
done
ALL_MODELS="cet_card cet_global vit swin tome"
MODELS=${MODELS:-$ALL_MODELS}  # which models' cells to run (the order of launch stays the design's)
for model in $MODELS; do
    [[ " $ALL_MODELS " == *" $model "* ]] || { echo "error: MODELS names '$model'; choose among: $ALL_MODELS" >&2; exit 2; }
done
jobs_max=${JOBS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$runs" "$RESULTS"

train() {  # key config epochs seed tokens [overrides...]
    local key=$1 config=$2 epochs=$3 seed=$4 tokens=$5
    shift 5
    local name=$key-e$epochs-t$tokens-seed$seed
    local dir=$runs/$name recorded fresh=()
    if [[ -f $RESULTS/$name.json ]]; then  # recorded here already (a fresh machine has no run folder for it)
        echo "recorded: $RESULTS/$name.json"
        return 0
    fi
    for recorded in $RECORDED; do
        case $(basename "$recorded") in card_claim_replicate_* | card_claim_gpu_*) continue ;; esac  # other designs
        if [[ -f $recorded/$name.json && $recorded != "$RESULTS" ]]; then
            echo "recorded: $recorded/$name.json"
            return 0
        fi
    done
    if [[ ! -f $dir/test_metrics.json ]]; then
        if [[ -f $dir/checkpoints/last.ckpt ]]; then
            echo "resuming: $dir"
            "$VITLAB" fit --resume "$dir" >> "$dir.log" 2>&1 || { echo "failed: $dir (see $dir.log)" >&2; return 0; }
        else
            # a run stopped before its first checkpoint holds nothing to resume: it starts again
            [[ -e $dir ]] && fresh=(run.overwrite=true)
            echo "training: $dir"
            # the EI ramp at the card's proportions of this budget (epochs 50 -> 200 of 300)
            local start end
            start=$("$PYTHON" -c "print(round($epochs / 6, 3))") end=$("$PYTHON" -c "print(round(2 * $epochs / 3, 3))")
            "$VITLAB" fit --config "$config" data.path="$data" run.seed="$seed" run.dir="$dir" run.name="card-$name" \
                trainer.max_epochs="$epochs" loss.ei_start="$start" loss.ei_end="$end" trainer.precision=32-true \
                trainer.enable_progress_bar=false "${fresh[@]}" "$@" > "$dir.log" 2>&1 || { echo "failed: $dir (see $dir.log)" >&2; return 0; }
        fi
    fi
    [[ -f $RESULTS/$name.json ]] || "$PYTHON" benchmarks/experiments/card_claim.py record "$dir" --model "$key" \
        --epochs "$epochs" --seed "$seed" --tokens "$tokens" --out "$RESULTS/$name.json" ${GIT_REVISION:+--git "$GIT_REVISION"}
}

launch() {  # the same arguments as train, at most JOBS at once; a model outside MODELS is left for later
    [[ " $MODELS " == *" $1 "* ]] || return 0
    while (( $(jobs -rp | wc -l) >= jobs_max )); do wait -n || true; done
    train "$@" &
}

for epochs in $BUDGETS; do
    seeds="0 1"
    [[ $epochs == 48 ]] && seeds="0 1 2"
    for seed in $seeds; do
        (( seed < SEEDS_MAX )) || continue
        launch cet_card compare/card_p4 "$epochs" "$seed" 64 "$@"
        launch cet_global compare/cifar10_p4_global "$epochs" "$seed" 64 "$@"
        launch vit compare/cifar10_p4_vit "$epochs" "$seed" 64 "$@"
        launch swin compare/cifar10_p4_swin "$epochs" "$seed" 64 "$@"
        launch tome compare/cifar10_p4_tome "$epochs" "$seed" 64 "$@"
    done
    if [[ $epochs == 8 ]]; then  # the 256-token arm, at the smallest budget
        for seed in $SEEDS_256; do
            launch cet_card compare/card_p2 8 "$seed" 256 "$@"
            launch swin compare/card_p2_swin 8 "$seed" 256 "$@"
        done
    fi
done
wait || true
design=("$RESULTS")  # the CPU design's folders: every session's, not another design's (a replicate, the GPU protocol)
for folder in $RECORDED; do
    [[ -d $folder && $folder != "$RESULTS" ]] || continue
    case $(basename "$folder") in card_claim_replicate_*) continue ;; esac
    design+=("$folder")
done
echo "results: $RESULTS ($(ls "$RESULTS" | wc -l) runs); summary: $PYTHON -m benchmarks.experiments.card_claim summarise ${design[*]}"
# the README's claims are recomputed from these files in CI: a new result can make them stale
"$PYTHON" -m benchmarks.reports.claims --check > /dev/null 2>&1 || echo "note: README.md or docs/results.md do not show \
the claims recomputed with these results; before committing them: $PYTHON -m benchmarks.reports.claims --write \
docs/results.md, then the README rows that $PYTHON -m benchmarks.reports.claims --check names"
