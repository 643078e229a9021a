# call B (carry .whl .br .fa4/2): pytest -m gpu and train.py trainer=gpu at the final code (kept launches as call A decided)
set -u
export FA4_PARTS=3
. lab/gpu_env.sh 2
[ -f /tmp/kept_on ] && export ATTN_ZOO_GLUON_KEPT_LAUNCH=1
W=/tmp/w/b; mkdir -p $W
b() { echo "== $1 rc=$2 ($(date +%T))"; }
echo "ATTN_ZOO_GLUON_KEPT_LAUNCH=${ATTN_ZOO_GLUON_KEPT_LAUNCH:-unset}" | tee $W/env.txt
timeout -k 5 100 python3 train.py trainer=gpu logger=csv hydra.run.dir=/tmp/w/readme_gpu > $W/train_gpu.log 2>&1; b train_gpu $?
grep -E "learned|val/acc by" $W/train_gpu.log | tail -2
timeout -k 5 320 python3 -m pytest -m gpu -q -p no:cacheprovider -n 14 > $W/pytest_gpu.txt 2>&1; b pytest_gpu $?
tail -n 3 $W/pytest_gpu.txt; grep -E "^(FAILED|ERROR)" $W/pytest_gpu.txt | head -20
tar czf $OUT/b.tgz -C $W .
