# call A (carry .whl .br .fa4/1): kept Gluon launches -- GPU test, bench and where_time on / off; decision to /tmp/kept_on
set -u
export FA4_PARTS=3
. lab/gpu_env.sh 1
W=/tmp/w/a; mkdir -p $W
b() { echo "== $1 rc=$2 ($(date +%T))"; }
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader | tee $W/env.txt
python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" | tee -a $W/env.txt
git log --oneline -1 2>/dev/null | tee -a $W/env.txt
timeout -k 5 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernel_flash_gluon_bwd.py -k "kept_gluon_launches_match" > $W/pytest_kept.txt 2>&1; rc_t=$?; b kept_test $rc_t; tail -n 3 $W/pytest_kept.txt
for kept in 0 1; do
  ATTN_ZOO_GLUON_KEPT_LAUNCH=$kept timeout -k 5 75 python3 -m eval.bench_flash --out $W --tag kept$kept --variants win1024,causal \
    --N 1024,16384 --D 128 --impls ours,ours_triton_all --rounds 3 --check --time-budget-s 60 > $W/kept$kept.log 2>&1; b bench_kept$kept $?
done
python3 - $W $rc_t <<'PY' | tee $W/decision.txt
import sys, pandas as pd
W, rc = sys.argv[1], int(sys.argv[2])
d = {k: pd.read_csv(f"{W}/kept{k}.csv") for k in (0, 1)}
m = d[0][d[0].impl == "ours"].merge(d[1][d[1].impl == "ours"], on=["variant", "N"], suffixes=("_off", "_on"))
m["on_vs_off"] = (m.fwd_bwd_tflops_on / m.fwd_bwd_tflops_off).round(3)
print(m[["variant", "N", "fwd_impl_off", "fwd_bwd_tflops_off", "fwd_bwd_tflops_on", "on_vs_off"]].to_string(index=False))
ok = rc == 0 and m.on_vs_off.min() >= 0.98 and m.on_vs_off.median() >= 1.01
print("decision: kept", "ON" if ok else "OFF", "(test rc", rc, ", min", m.on_vs_off.min(), ", median", m.on_vs_off.median(), ")")
if ok:
    open("/tmp/kept_on", "w").write("1")
PY
ATTN_ZOO_GLUON_KEPT_LAUNCH=1 timeout -k 5 50 python3 -m lab.where_time --out $W --tag where_kept1 --cases win1024:16384:128 \
  --impls ours,ours_triton_all > $W/where_kept1.log 2>&1; b where_kept1 $?; grep -E "wall|Error" $W/where_kept1.log | cut -c1-160
ls /tmp/fa4
tar czf $OUT/a.tgz -C $W .
