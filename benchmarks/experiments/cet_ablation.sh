#!/usr/bin/env bash
# The CET-ViT ablation of docs/cet_vit.md ("Why it falls behind: the ablation"): today's cet_vit_nano on
# compare/cifar10_p4, then each change of issue 13 added in turn, one training at a time (one thread), then the
# test-time grouping ablation (random-S, uniform-S) and slot-usage K at init and at the end of every run
# (benchmarks/experiments/cet_grouping.py). The ViT and Swin it is tested against are the 3-seed runs of
# benchmarks/experiments/compare_cifar10.sh (benchmarks/results/experiments/compare_cifar10_p4_cpu_2026-11-30.json).
#
#   benchmarks/experiments/cet_ablation.sh /path/to/cifar10.npz "base:0 pos:0 select:0 select:1 slots:0"   # the run in the docs
#
# Each item is VARIANT:SEED; the variants are cumulative:
#   base    today's model (pos_embed none, 32 slots at 64 tokens, hard top-3)
#   pos     + model.pos_embed=learned
#   slots   + model.slot_ratio=8 model.mask_empty_slots=true   (the card's 8:1: 8 slots at 64 tokens)
#   select  + model.select_grad=dense_st                      (gradient to all K_max logits)
#   eicard  + loss.lambda_ei=0.01 loss.ei_schedule=constant   (the v4 card's weight, compare/cifar10_p4_ei_card)
#   gumbel  slots + model.dynamic_k=gumbel model.k_candidates=[4,6,8]   (the straight-through Dynamic-K over budgets
#           of the 8 slots, with the EI ramp; not cumulative with select)
# Finished runs (test_metrics.json present) are skipped. RUNS (default runs/cet-ablation) is where runs go.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 PATH/TO/cifar10.npz \"VARIANT:SEED ...\" [config overrides...]" >&2
    exit 2
fi
data=$1 items=$2
shift 2
runs=${RUNS:-runs/cet-ablation}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
vitlab=${VITLAB:-vitlab}
python=${PYTHON:-python}
mkdir -p "$runs"

overrides() {  # variant -> the cumulative overrides
    local o=""
    case $1 in
        gumbel) o="model.dynamic_k=gumbel model.k_candidates=[4,6,8] model.slot_ratio=8 model.mask_empty_slots=true"
                o="$o model.pos_embed=learned" ;;
        eicard) o="loss.lambda_ei=0.01 loss.ei_schedule=constant" ;&
        select) o="$o model.select_grad=dense_st" ;&
        slots) o="$o model.slot_ratio=8 model.mask_empty_slots=true" ;&
        pos) o="$o model.pos_embed=learned" ;&
        base) ;;
        *) echo "unknown variant $1 (base, pos, slots, select, eicard, gumbel)" >&2; return 1 ;;
    esac
    echo "$o"
}

for item in $items; do
    variant=${item%%:*} seed=${item##*:}
    run_dir=$runs/$variant-seed$seed
    extra=$(overrides "$variant")
    if [[ -f $run_dir/test_metrics.json ]]; then
        echo "done: $run_dir"
    else
        echo "training: $run_dir ($extra)"
        if [[ -f $run_dir/checkpoints/last.ckpt ]]; then  # interrupted (a session ended): continue it exactly
            $vitlab fit --resume "$run_dir" >> "$run_dir.log" 2>&1
        else
            # shellcheck disable=SC2086
            $vitlab fit --config compare/cifar10_p4 data.path="$data" run.seed="$seed" run.dir="$run_dir" \
                run.overwrite=true trainer.enable_progress_bar=false $extra "$@" > "$run_dir.log" 2>&1
        fi
    fi
    if [[ ! -f $run_dir/grouping.json ]]; then
        $python benchmarks/experiments/cet_grouping.py "$run_dir" --data "$data" --out "$run_dir/grouping.json" >> "$run_dir.log" 2>&1
    fi
    # RESULTS (optional): one JSON per finished run, to commit at once
    if [[ -n ${RESULTS:-} && ! -f $RESULTS/$variant-seed$seed.json ]]; then
        $python benchmarks/experiments/run_result.py "$run_dir" --experiment cet-ablation --arm "$variant" --seed "$seed" \
            --out "$RESULTS/$variant-seed$seed.json"
    fi
done
