# call D (carry .whl .br): FA4 still in /tmp/site; masks incl. strided vs Flex+FA4 / FA4, where_time vs FA4
set -u
export FA4_PARTS=3
. lab/gpu_env.sh
[ -f /tmp/kept_on ] && export ATTN_ZOO_GLUON_KEPT_LAUNCH=1
W=/tmp/w/d; mkdir -p $W
b() { echo "== $1 rc=$2 ($(date +%T))"; }
echo "ATTN_ZOO_GLUON_KEPT_LAUNCH=${ATTN_ZOO_GLUON_KEPT_LAUNCH:-unset}" | tee $W/env.txt
timeout -k 5 85 python3 -m eval.bench_flash --out $W --tag masks --variants win1024,bigbird,strided --N 1024,16384 --D 128 \
  --impls ours,flex_fa4,fa4 --rounds 3 --check --time-budget-s 70 > $W/masks.log 2>&1; b masks $?
grep -E "^ *(win1024|bigbird|strided) " $W/masks.log | cut -c1-170
timeout -k 5 45 python3 -m lab.where_time --out $W --tag where_fa4 --cases causal:16384:128,win1024:16384:128 --impls ours,fa4 > $W/where_fa4.log 2>&1; b where_fa4 $?
grep -E "wall|Error" $W/where_fa4.log | cut -c1-160
tar czf $OUT/d.tgz -C $W .
