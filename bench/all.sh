#!/usr/bin/env bash
# Every row of BENCHMARKS.md, side by side with the peers, one invocation per row.
# Run on a quiet machine (any other process halves a measurement); 45-75 minutes on 2 cores.
#   bash bench/all.sh [.venv/bin/python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
R=bench/results
$PY -m bench.embed --config allennlp-tiny  --repeats 3 --json-out $R/embed_tiny.json
$PY -m bench.embed --config allennlp-small --repeats 3 --json-out $R/embed_small.json
$PY -m bench.embed --config allennlp-small --repeats 3 --dtype bfloat16 --json-out $R/embed_small_bf16.json
$PY -m bench.embed --config original       --repeats 3 --json-out $R/embed_original.json
$PY -m bench.embed --config original       --repeats 3 --dtype bfloat16 --json-out $R/embed_original_bf16.json
$PY -m bench.train --config bilm-tf-small  --repeats 3 --json-out $R/train_small.json
$PY -m bench.train --config bilm-tf-small  --repeats 3 --dtype bfloat16 --json-out $R/train_small_bf16.json
$PY -m bench.train --config original       --repeats 2 --json-out $R/train_original.json
$PY -m bench.train --config original       --repeats 2 --dtype bfloat16 --json-out $R/train_original_bf16.json
$PY -m bench.bf16_accuracy --config allennlp-small original --json-out $R/bf16_accuracy.json
# the products floor of every row (bench/floor.py): the step's products alone, each at XLA's speed
for dt in float32 bfloat16; do
  $PY -m bench.floor --embed allennlp-small --dtype $dt --json-out $R/floor_embed_small_$dt.json
  $PY -m bench.floor --embed original       --dtype $dt --json-out $R/floor_embed_original_$dt.json
  $PY -m bench.floor --config bilm-tf-small --dtype $dt --json-out $R/floor_train_small_$dt.json
  $PY -m bench.floor --config original      --dtype $dt --json-out $R/floor_train_original_$dt.json
done
$PY -m bench.floor --embed allennlp-tiny --json-out $R/floor_embed_tiny_float32.json
# the same two rows with the peers also given glibc's huge pages (elmo-jax's commands set
# them for themselves: elmo_jax/cli/huge_pages.py): how much of the lead is that setting
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 $PY -m bench.embed --config allennlp-small --repeats 3 --json-out $R/embed_small_peer_tuned.json
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 $PY -m bench.train --config bilm-tf-small --repeats 3 --json-out $R/train_small_peer_tuned.json
