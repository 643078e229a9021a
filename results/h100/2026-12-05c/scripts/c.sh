# call C (carry .whl .br .fa4/3): FA4 installed; the committed best-against-best run (every anchor, one process per
# family) and the packed-document rows against FA4 varlen / Flex+FA4; kept launches as call A decided
set -u
export FA4_PARTS=3
. lab/gpu_env.sh 3
[ -f /tmp/kept_on ] && export ATTN_ZOO_GLUON_KEPT_LAUNCH=1
echo "ATTN_ZOO_GLUON_KEPT_LAUNCH=${ATTN_ZOO_GLUON_KEPT_LAUNCH:-unset}"
W=/tmp/w/c; mkdir -p $W
b() { echo "== $1 rc=$2 ($(date +%T))"; }
echo "ATTN_ZOO_GLUON_KEPT_LAUNCH=${ATTN_ZOO_GLUON_KEPT_LAUNCH:-unset}" > $W/env.txt
BUDGET_S=340 SOFTMAX_SHARE=62 LINEAR_SHARE=30 timeout -k 5 350 bash lab/h200_anchors.sh $W/anchors > $W/anchors.log 2>&1; b anchors $?
tail -n 8 $W/anchors.log
timeout -k 5 95 python3 -m eval.bench_flash --out $W --tag docs --variants causal,win1024 --N 16384 --D 128 --tokens 65536 \
  --docs fixed:2048,wikitext:real,geometric:1024 --impls ours,fa4_varlen,flex_fa4 --rounds 3 --check --time-budget-s 80 > $W/docs.log 2>&1; b docs $?
grep -E "^ *(causal|win1024) " $W/docs.log | cut -c1-170
tar czf $OUT/c.tgz -C $W .
