"""The benchmarks, side by side with the peers (../shared/peers): run each as
`python -m bench.NAME` from the checkout's root (`bench/all.sh` runs every
row of BENCHMARKS.md). `_common.py` holds what they share: the peers' paths,
child processes, the one timer (`call_times`), the machine's walls."""
