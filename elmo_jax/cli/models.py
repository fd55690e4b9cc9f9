"""`elmo-jax models`: the published models elmo-jax fetches by name, and
whether each is in the cache; `--details NAME` shows one model's sources,
URLs (tried in order), what is inferred and what to know when its links fail.

  elmo-jax models [--json] [--language zh]
  elmo-jax models --details NAME

The README's "Pretrained models" table is this command's table with an
empty cache: `ELMO_JAX_CACHE=$(mktemp -d) elmo-jax models`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def table(rows: list[dict]) -> list[str]:
    """The table's lines (rows with "cached" set)."""
    lines = [f"{'name':<17} {'language':<24} {'params':<7} {'cached':<6} trained on"]
    for r in rows:
        params = r["params"] or "-"
        data = r["data"] if r["supported"] else f"(not supported: another architecture) {r['data']}"
        lines.append(f"{r['name']:<17} {r['language']:<24} {params:<7} "
                     f"{'yes' if r['cached'] else 'no':<6} {data}")
    return lines


def details(r: dict) -> list[str]:
    """One model's facts, their sources, and what is inferred."""
    lines = [r["name"], f"  published by  {r['family']}", f"  language      {r['language']}",
             f"  trained on    {r['data']}", f"  parameters    {r['params'] or 'not published'}"]
    if not r["supported"]:
        lines.append("  supported     no")
    for role, urls in r["files"].items():
        lines += [f"  {role:<13} {u}" if i == 0 else f"  {'':<13} {u}" for i, u in enumerate(urls)]
    for role, checks in r["checks"].items():
        lines.append(f"  {'checked':<13} {role}: " + ", ".join(f"{k} {v}" for k, v in checks.items()))
    lines += [f"  source        {s}" for s in r["sources"]]
    lines += [f"  inferred      {s}" for s in r["inferred"]]
    if r["note"]:
        lines.append(f"  note          {r['note']}")
    return lines


def main(argv=None, prog: str = "elmo-jax models"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    ap.add_argument("--language", help="only models whose language contains this")
    ap.add_argument("--details", metavar="NAME", help="one model's sources, URLs and notes")
    args = ap.parse_args(argv)

    from elmo_jax.formats.downloads import cache_dir
    from elmo_jax.formats.registry import list_models

    rows = list_models()
    if args.details:
        found = [r for r in rows if r["name"] == args.details]
        if not found:
            print(f"error: no model named {args.details!r}; `{prog}` lists them",
                  file=sys.stderr)
            return 2
        print("\n".join(details(found[0])))
        return
    rows = [r for r in rows
            if not args.language or args.language.lower() in r["language"].lower()
            or args.language.lower() == r["name"].split("-")[-1]]
    for r in rows:
        r["cached"] = os.path.isdir(os.path.join(cache_dir(), "models", r["name"]))
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return
    print("\n".join(table(rows)))
    print(f"\ncache: {cache_dir()} (ELMO_JAX_CACHE)")
