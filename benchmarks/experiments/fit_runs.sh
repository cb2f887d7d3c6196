# shellcheck shell=bash
# Sourced by the drivers that train a set of runs (compare_cifar10.sh, auto_vs_fp32.sh): one run trained, resumed
# or skipped, and a slot for the next background job. Needs $vitlab and $jobs_max set by the driver.

fit_once() {  # RUN_DIR CONFIG [overrides...]: skip a finished run, resume an interrupted one, else train it
    local run_dir=$1 config=$2
    shift 2
    if [[ -f $run_dir/test_metrics.json ]]; then
        echo "done: $run_dir"
    elif [[ -f $run_dir/checkpoints/last.ckpt ]]; then
        echo "resuming: $run_dir"
        $vitlab fit --resume "$run_dir" > "$run_dir.log" 2>&1
    else
        echo "training: $run_dir"
        $vitlab fit --config "$config" run.dir="$run_dir" trainer.enable_progress_bar=false "$@" > "$run_dir.log" 2>&1
    fi
}

wait_for_slot() {  # block until fewer than $jobs_max background jobs run
    while (( $(jobs -rp | wc -l) >= jobs_max )); do
        wait -n || true
    done
}
