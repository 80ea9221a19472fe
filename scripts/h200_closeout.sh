#!/usr/bin/env bash
# The release closeout on a Hopper box, spread over as many device calls (each at most 10 minutes, at most 8
# files back) as it needs. Each call picks up where the last one stopped, from the STATE folder that the last
# call's OUT/state.tar.gz unpacks to (empty or missing on the first call):
#   1. the extension: the .so built by the first call is carried on (resuming a sweep needs the same bytes), with
#      the compiled fold planner (_fold_plan) where the tree builds one;
#   2. the release sweep of manifests/h200.yaml (one worker per visible GPU), resumed from its partial log;
#      once complete: verify and render it;
#   3. in the order given, `gradsweep bench` for each --bench-ops group not yet done and, where --drift stands,
#      the release drift run (bench/bench_drift.py); never beside the sweep: timing is alone. Where --census stands
#      (put it last), scripts/kernel_census.py profiles every case the signed bench files so far record a missed
#      target for (unsigned, a diagnostic: which kernels each side runs; OUT's state gets census/). Where --tile-ab
#      stands (after --census), scripts/gemm_tile_ab.py times the Triton TMA GEMM's candidate tiles against cuBLAS
#      and today's kernel, bits compared (unsigned, a diagnostic; OUT's state gets tile_ab/). Where --host-audit
#      stands, scripts/host_probe.py --fold-plan-audit says where the fold plan's host time goes on this host
#      (allocator events, synchronising calls, cProfile; OUT's state gets host_audit/). Where --cell-profile stands,
#      scripts/cell_profile.py says where the release sweep's slowest cells spend their time (the chain's first cell
#      and decode, per GPU profile; unsigned; OUT's state gets cell_profile/).
# A bench or drift step starts only with the time it took last time left (NEEDS below), else a later, shorter one
# may run. A step that cannot finish before the deadline is cut by `timeout`: a cut sweep keeps its partial log for
# the next call; a cut bench or drift leaves nothing and runs again next call.
# Usage (repo root, on the GPU machine):
#   bash scripts/h200_closeout.sh STATE OUT KEY [--deadline S] [--sweep-shards N] [--bench-ops "OP OP ..."]... [--drift]
#                                 [--census] [--tile-ab] [--host-audit] [--cell-profile]
#                                 [--backward-thread worker|caller]   (given to every bench; default: bench's own)
# (a group written "caller:OPS" or "worker:OPS" runs on that engine thread whatever --backward-thread says, its
# files named with a -caller / -worker suffix: one call can record a group on both)
# (keep N the same across the calls of one closeout: each shard resumes from its own partial log; the shards run one
# at a time, so N only sets how the sweep's progress is cut into separately signed parts)
# OUT gets: state.tar.gz (everything the next call needs and every result so far), logs.tar.gz, summary.txt, and
# triton-cache.tar.gz (Triton's compile cache at the end of the call, when it packs to 15 MiB or less): put it in
# the next call's STATE folder and that call starts with the kernels compiled (a fresh box spends ~90 s of the
# sweep compiling; the cache is keyed by each kernel's source and options, so a changed kernel compiles anew).
set -uo pipefail
state=${1:?STATE}; out=${2:?OUT}; key=${3:?signing key}; shift 3
deadline=560; groups=(); shards=1; bench_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bench-ops) groups+=("$2"); shift 2;;
    --deadline) deadline=$2; shift 2;;
    --drift) groups+=(drift); shift;;
    --census) groups+=(census); shift;;
    --tile-ab) groups+=(tile_ab); shift;;
    --host-audit) groups+=(host_audit); shift;;
    --cell-profile) groups+=(cell_profile); shift;;
    --backward-thread) bench_extra+=(--backward-thread "$2"); shift 2;;
    --sweep-shards) shards=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
t_start=$(date +%s)
left() { echo $(( deadline - ( $(date +%s) - t_start ) )); }
pub="${key%.pem}.pub.pem"
new=$(mktemp -d); logs=$(mktemp -d)
mkdir -p "$state" "$out" out
cp -a "$state"/. "$new"/ 2>/dev/null
rm -f "$new/triton-cache.tar.gz"  # travels beside the state, not inside it
note() { echo "$*" | tee -a "$new/summary.txt"; }
# What each step took in the last full re-sign (thirty-eighth session, one H100), plus ~15%: a step starts only with
# that much left, so a call does not spend its end on a step that cannot finish there (that session's first call cut
# attention after 66 s, and the step ran again in full in the next call); a later, shorter step may still fit.
# Steps not listed start with the floor their branch gives (45-60 s). CLOSEOUT_NEEDS="GROUP=S;..." overrides.
declare -A NEEDS=([attention]=85 [det_gemm]=137 [chain]=76 ["rms_norm qk_norm rope silu swiglu embedding"]=70
  ["logp linear_logp fold_plan"]=237 [drift]=75 ["caller:rms_norm qk_norm rope silu swiglu embedding"]=68
  ["caller:det_gemm"]=139)
IFS=';' read -ra _needs <<< "${CLOSEOUT_NEEDS:-}"
for _n in "${_needs[@]}"; do [ -n "$_n" ] && NEEDS["${_n%=*}"]=${_n##*=}; done
needs() { local n=${NEEDS[$1]:-$2}; [ "$n" -lt "$2" ] && n=$2; echo "$n"; }  # (never below the branch's floor)
# OUT holds the state after every finished step, not only at the end: a call killed past its device limit (the
# limit can be shorter than asked when a cold start ate the session's device time) still returns what it finished.
save() {
  cp "$new/summary.txt" "$out/summary.txt"
  tar -czf "$out/.state.tar.gz" -C "$new" . && mv "$out/.state.tar.gz" "$out/state.tar.gz"
  tar -czf "$out/.logs.tar.gz" -C "$logs" . && mv "$out/.logs.tar.gz" "$out/logs.tar.gz"
}
# run_diag NAME LEAST "CODES" CMD...: an unsigned diagnostic writing into $new/NAME (its output in NAME/stdout.txt),
# started with at least LEAST s left; done (never run again) once it exits with one of CODES; a run cut by the
# deadline keeps what it wrote and runs again in the next call
run_diag() {
  local name=$1 least=$2 codes=$3 budget t0 rc; shift 3
  [ -f "$new/$name/done" ] && return
  budget=$(( $(left) - 10 ))
  if [ "$budget" -lt "$least" ]; then note "$name not started: $budget s left"; return; fi
  t0=$(date +%s); mkdir -p "$new/$name"
  timeout "$budget" "$@" > "$new/$name/stdout.txt" 2>&1
  rc=$?
  case " $codes " in *" $rc "*) touch "$new/$name/done";; esac
  note "$name rc=$rc in $(( $(date +%s) - t0 )) s (budget $budget s)"
  tail -40 "$new/$name/stdout.txt"
  save
}
note "--- call at $(date -u +%FT%TZ), deadline ${deadline} s"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$HOME/site" .whl/*.whl \
    && export PYTHONPATH="$HOME/site:$PYTHONPATH"
fi

# 0. Triton's compile cache, where the caller brought one
tcache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -f "$state/triton-cache.tar.gz" ]; then
  mkdir -p "$tcache" && tar -xzf "$state/triton-cache.tar.gz" -C "$tcache" \
    && note "triton cache restored: $(find "$tcache" -type f | wc -l) files" || note "triton cache: not restored"
fi

# 1. the extension
so=$(ls "$state"/_C.cpython-*.so 2>/dev/null | head -1)
if [ -n "$so" ]; then
  cp "$so" gradsweep/ && note "extension carried: $(basename "$so") $(sha256sum "$so" | cut -c1-12)"
  for plan in "$state"/_fold_plan.cpython-*.so; do  # the compiled fold planner, where the tree has one
    [ -f "$plan" ] && cp "$plan" gradsweep/ && note "fold planner carried: $(basename "$plan")"
  done
else
  t0=$(date +%s)
  { nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.device_count())"
    python3 setup.py build_ext --inplace; } > "$logs/build.log" 2>&1
  note "build rc=$? in $(( $(date +%s) - t0 )) s"
  cp gradsweep/_C.cpython-*.so "$new"/
  cp gradsweep/_fold_plan.cpython-*.so "$new"/ 2>/dev/null
fi

# 2. the release sweep: one process, or --sweep-shards N shard processes run one after another (each resumes from
# its own partial log; `gradsweep merge` then signs the shards' union, which it checks is exactly the unsharded cell
# set). Not side by side: on 2026-12-04 three shard processes on the one H200 ran it out of memory (each process's
# caching allocator keeps what its largest cells took): 35 of 451 cells ended as CUDA out-of-memory errors.
# Prefer one process (the default): a worker computes each op's FP64 reference and stock baselines once per profile,
# and every shard process does it again; on 2026-12-04 the release sweep took 695 s as one process resumed across two
# calls, 877 s as two shards.
ev=out/h200.evidence.json
finish_sweep() {  # verify and render the complete evidence
  cp out/h200.evidence.json out/h200.test-result.json "$new"/
  python3 -m gradsweep.cli verify "$ev" --trusted-key "$pub" > "$new/h200.verify.txt" 2>&1
  note "verify rc=$?"
  python3 -m gradsweep.cli report "$ev" --format md -o "$new/h200.md" --trusted-key "$pub" >> "$logs/sweep.log" 2>&1
  python3 -m gradsweep.cli report "$ev" --trusted-key "$pub" > "$new/h200.table.txt" 2>&1
  cp "$logs/sweep.log" "$new/h200.sweep.log"
}
if [ -f "$state/h200.evidence.json" ]; then
  note "sweep: complete in an earlier call"
elif [ "$shards" -le 1 ]; then
  resume=()
  if [ -f "$state/h200.evidence.json.partial.jsonl" ]; then
    cp "$state/h200.evidence.json.partial.jsonl" out/ && resume=(--resume)
    note "sweep: resuming after $(( $(wc -l < out/h200.evidence.json.partial.jsonl) - 1 )) cell(s)"
  fi
  t0=$(date +%s)
  timeout -s INT -k 15 $(( $(left) - 25 )) python3 -m gradsweep.cli sweep manifests/h200.yaml -o "$ev" --key "$key" \
    --no-progress "${resume[@]}" >> "$logs/sweep.log" 2>&1
  note "sweep rc=$? in $(( $(date +%s) - t0 )) s"
  if [ -f "$ev" ]; then
    rm -f "$new/h200.evidence.json.partial.jsonl"
    finish_sweep
  else
    cp out/h200.evidence.json.partial.jsonl "$new"/ 2>/dev/null
    note "sweep: $(( $(wc -l < "$new/h200.evidence.json.partial.jsonl") - 1 )) cell(s) done so far"
  fi
  tail -4 "$logs/sweep.log"
  save
else
  t0=$(date +%s)
  for k in $(seq 1 "$shards"); do  # one shard process at a time (see the header: side by side they ran out of memory)
    part=h200.shard-$k-of-$shards.evidence.json
    [ -f "$state/$part" ] && continue
    [ "$(left)" -lt 70 ] && break
    resume=()
    if [ -f "$state/$part.partial.jsonl" ]; then cp "$state/$part.partial.jsonl" out/ && resume=(--resume); fi
    timeout -s INT -k 15 $(( $(left) - 40 )) python3 -m gradsweep.cli sweep manifests/h200.yaml --shard "$k/$shards" \
      -o "out/$part" --key "$key" --no-progress "${resume[@]}" >> "$logs/sweep-$k.log" 2>&1
  done
  complete=0
  for k in $(seq 1 "$shards"); do
    part=h200.shard-$k-of-$shards.evidence.json
    if [ -f "out/$part" ]; then
      cp "out/$part" "$new"/ && rm -f "$new/$part.partial.jsonl"
    elif [ -f "out/$part.partial.jsonl" ]; then
      cp "out/$part.partial.jsonl" "$new"/
    fi
    if [ -f "$new/$part" ]; then
      complete=$(( complete + 1 ))
    else
      note "sweep shard $k/$shards: $(( $(wc -l < "$new/$part.partial.jsonl" 2>/dev/null || echo 1) - 1 )) cell(s) done so far"
    fi
    [ -f "$logs/sweep-$k.log" ] && { echo "=== shard $k/$shards"; cat "$logs/sweep-$k.log"; } >> "$logs/sweep.log"
  done
  note "sweep: $complete of $shards shard(s) complete after $(( $(date +%s) - t0 )) s"
  if [ "$complete" -eq "$shards" ]; then
    python3 -m gradsweep.cli merge "$new"/h200.shard-*-of-"$shards".evidence.json -o "$ev" --key "$key" \
      --trusted-key "$pub" >> "$logs/sweep.log" 2>&1
    note "merge rc=$?"
    [ -f "$ev" ] && finish_sweep
  fi
  tail -4 "$logs/sweep.log"
  save
fi

# 3. the bench, one evidence file per group of ops, only once the sweep is complete
if [ -f "$new/h200.evidence.json" ]; then
  for group in "${groups[@]}"; do
    if [ "$group" = census ]; then
      if [ -d "$new/census" ]; then continue; fi
      budget=$(( $(left) - 10 ))
      if [ "$budget" -lt 60 ]; then note "census not started: $budget s left"; continue; fi
      t0=$(date +%s)
      timeout "$budget" python3 scripts/kernel_census.py out/census --missed-from "$new"/h200.bench-*.evidence.json \
        > "$logs/census.log" 2>&1
      rc=$?
      note "census rc=$rc in $(( $(date +%s) - t0 )) s (budget $budget s)"
      # (a cut census keeps what it wrote: each case's lines and the JSON so far)
      if [ -d out/census ]; then mkdir -p "$new/census" && cp -a out/census/. "$new/census"/ && cp "$logs/census.log" "$new/census/"; fi
      tail -25 "$logs/census.log"
      save
      continue
    fi
    if [ "$group" = tile_ab ]; then  # rc 1: a variant's bits differ (a finding: the run is done)
      run_diag tile_ab 45 "0 1" python3 scripts/gemm_tile_ab.py "$new/tile_ab/gemm_tile_ab.json"
      continue
    fi
    if [ "$group" = host_audit ]; then
      run_diag host_audit 30 "0" python3 scripts/host_probe.py "$new/host_audit" --op fold_plan --fold-plan-audit \
        --steps 200
      continue
    fi
    if [ "$group" = cell_profile ]; then  # one process per profile, as one sweep worker holds one profile
      for prof in cuda_bf16 triton_cuda_bf16; do
        run_diag "cell_profile/$prof" 60 "0" python3 scripts/cell_profile.py manifests/h200.yaml \
          "$new/cell_profile/$prof/profile.json" --sync chain/$prof/b1_singleton chain/$prof/bn_full chain/$prof/decode
      done
      continue
    fi
    if [ "$group" = drift ]; then
      if [ -f "$new/drift/drift.evidence.json" ]; then continue; fi
      budget=$(( $(left) - 10 ))
      if [ "$budget" -lt "$(needs drift 60)" ]; then
        note "drift not started: $budget s left (needs ~$(needs drift 60) s)"; continue
      fi
      t0=$(date +%s)
      timeout "$budget" python3 bench/bench_drift.py out/drift --key "$key" --manifest manifests/h200.yaml \
        > "$logs/drift.log" 2>&1
      rc=$?
      note "drift rc=$rc in $(( $(date +%s) - t0 )) s (budget $budget s)"
      if [ $rc -eq 0 ]; then mkdir -p "$new/drift" && cp -a out/drift/. "$new/drift"/ && cp "$logs/drift.log" "$new/drift/"; fi
      tail -25 "$logs/drift.log"
      save
      continue
    fi
    # "worker:OPS" / "caller:OPS": this group's autograd-engine thread (name suffix -worker / -caller), else
    # --backward-thread's (or the bench's default) and no suffix
    thread=(); suffix=""; ops_text=$group
    case "$group" in
      worker:*|caller:*) thread=(--backward-thread "${group%%:*}"); suffix="-${group%%:*}"; ops_text=${group#*:};;
    esac
    name=h200.bench-$(echo "$ops_text" | tr ' ' '-')$suffix
    if [ -f "$new/$name.evidence.json" ]; then continue; fi
    budget=$(( $(left) - 10 ))
    if [ "$budget" -lt "$(needs "$group" 45)" ]; then
      note "bench [$group] not started: $budget s left (needs ~$(needs "$group" 45) s)"; continue
    fi
    ops=(); for op in $ops_text; do ops+=(--op "$op"); done
    [ ${#thread[@]} -gt 0 ] || thread=("${bench_extra[@]}")
    t0=$(date +%s)
    timeout "$budget" python3 -m gradsweep.cli bench manifests/h200.yaml -o "out/$name.evidence.json" \
      --chart "out/$name.png" --key "$key" "${ops[@]}" "${thread[@]}" > "$logs/$name.log" 2>&1
    rc=$?
    note "bench [$group] rc=$rc in $(( $(date +%s) - t0 )) s (budget $budget s)"
    if [ $rc -eq 0 ] && [ -f "out/$name.evidence.json" ]; then
      cp "out/$name.evidence.json" "out/$name.png" "$new"/ 2>/dev/null
      python3 -m gradsweep.cli report "out/$name.evidence.json" --format md -o "$new/$name.md" \
        --trusted-key "$pub" >> "$logs/$name.log" 2>&1
    fi
    cp "$logs/$name.log" "$new/$name.log"
    tail -40 "$logs/$name.log"
    save
  done
fi

note "call done in $(( $(date +%s) - t_start )) s"
save
if [ -d "$tcache" ] && tar -czf "$out/.triton-cache.tar.gz" -C "$tcache" . 2>/dev/null; then
  size=$(stat -c %s "$out/.triton-cache.tar.gz")
  if [ "$size" -le $(( 15 << 20 )) ]; then
    mv "$out/.triton-cache.tar.gz" "$out/triton-cache.tar.gz"; note "triton cache handed back: $(( size >> 10 )) KiB"
  else
    rm -f "$out/.triton-cache.tar.gz"; note "triton cache not handed back: $(( size >> 20 )) MiB packed"
  fi
  cp "$new/summary.txt" "$out/summary.txt"
fi
cat "$new/summary.txt" | tail -12
