"""`elmo-jax models`: the published models elmo-jax fetches by name, and
whether each is in the cache.

  elmo-jax models [--json] [--language zh]
"""
from __future__ import annotations

import argparse
import json
import os


def main(argv=None, prog: str = "elmo-jax models"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    ap.add_argument("--language", help="only models whose language contains this")
    args = ap.parse_args(argv)

    from elmo_jax.hub import cache_dir
    from elmo_jax.registry import list_models

    rows = [r for r in list_models()
            if not args.language or args.language.lower() in r["language"].lower()
            or args.language.lower() == r["name"].split("-")[-1]]
    for r in rows:
        r["cached"] = os.path.isdir(os.path.join(cache_dir(), "models", r["name"]))
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return
    print(f"{'name':<16} {'language':<24} {'params':<7} {'cached':<6} trained on")
    for r in rows:
        print(f"{r['name']:<16} {r['language']:<24} {r['params'] or '-':<7} "
              f"{'yes' if r['cached'] else 'no':<6} {r['data']}")
    print(f"\ncache: {cache_dir()} (ELMO_JAX_CACHE)")
