"""python -m elmo_jax.data.recipes NAME... [--cache_dir DIR]: prepare corpora."""
import argparse
import json
import sys

from elmo_jax.data.recipes import RECIPES, RecipeError, prepare


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m elmo_jax.data.recipes", description=__doc__)
    ap.add_argument("names", nargs="+", choices=sorted(RECIPES))
    ap.add_argument("--cache_dir", help="default: $ELMO_JAX_CACHE or ~/.cache/elmo-jax")
    args = ap.parse_args(argv)
    for name in args.names:
        try:
            print(json.dumps(prepare(name, args.cache_dir)))
        except RecipeError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
