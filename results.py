"""`make results`: the downstream experiments behind RESULTS.md, end to end.

1. pretrains the `tiny` biLM on State of the Union addresses (another domain
   than the tasks' text) for --pretrain_minutes;
2. fine-tunes it on the Brown corpus's training files (the tagging task's own
   text: the paper's "biased" pretraining / domain transfer) for --finetune_minutes;
3. tags Brown (universal POS, fixed split by file) with a linear tagger over:
   the scalar mix, layer 0, the top layer, and random word embeddings;
4. runs the 1-nearest-neighbour WordNet sense probe per layer;
5. writes the tables of RESULTS.md (between its markers) and runs/results/results.json;
6. Chinese (`--parts zh`): pretrains `tiny` on Chinese news + People's Daily's
   training text for --zh_minutes, and tags People's Daily (PKU tags) the same
   ways; with --zhs_model (ELMoForManyLangs' Simplified Chinese model, a local
   path or the cached `manylangs-zhs`) also with that model. Its tables go
   between the `results-zh` markers (runs/results/results-zh.json).

    python results.py [--pretrain_minutes 20] [--finetune_minutes 8] [--tagger_epochs 2]
                      [--parts en zh] [--zh_minutes 20] [--zhs_model PATH]

Each step prints the command line that repeats it on its own, and leaves its\nresult in --workdir: run again, it resumes after the last finished step.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def say(msg):
    print(f"\n== {msg}", flush=True)


def cached(path, compute):
    """The JSON record at `path`, computed (and written) only when missing, so
    that an interrupted `make results` resumes where it stopped."""
    if os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    record = compute()
    with open(path, "w") as fh:
        json.dump(record, fh, indent=2)
    return record


def pretrain(name, train_glob, vocab_file, workdir, minutes, init_from=None):
    from elmo_jax import training
    from elmo_jax.config import load_config

    config = load_config(os.path.join(HERE, "configs", "tiny.json"), [
        f"data.train_files={json.dumps(train_glob)}", f"data.vocab_file={json.dumps(vocab_file)}",
        f"data.init_from={json.dumps(init_from)}", f"train.max_seconds={60 * minutes}",
        "train.log_every=100"])
    cmd = (f"python train.py --config configs/tiny.json --train_files '{train_glob}' "
           f"--vocab_file {vocab_file} --workdir {workdir} --max_seconds {60 * minutes:g}"
           + (f" --init_from {init_from}" if init_from else ""))
    say(f"{name}: {cmd}")
    t0 = time.time()
    last = training.train_and_evaluate(config, workdir)
    seconds = time.time() - t0
    training.export(workdir, os.path.join(workdir, "export"))
    steps = last["step"]
    return {"name": name, "command": cmd, "steps": steps,
            "tokens_seen": steps * config.model.batch_size * config.model.unroll_steps,
            "train_seconds": round(seconds), "export": os.path.join(workdir, "export")}


def write_vocab(files, out, max_vocab=20000):
    from elmo_jax.data import vocab_from_files

    vocab_from_files(files, max_vocab=max_vocab)[0].to_file(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pretrain_minutes", type=float, default=20)
    ap.add_argument("--finetune_minutes", type=float, default=8)
    ap.add_argument("--tagger_epochs", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join("runs", "results"))
    ap.add_argument("--max_train_sentences", type=int,
                    help="tag with only this many training sentences (a quick smoke run)")
    ap.add_argument("--cache_dir")
    ap.add_argument("--parts", nargs="+", choices=("en", "zh"), default=["en", "zh"])
    ap.add_argument("--zh_minutes", type=float, default=20)
    ap.add_argument("--zhs_model", default="manylangs-zhs",
                    help="ELMoForManyLangs' Simplified Chinese model: a path, or the registry "
                         "name when it is in the cache (nothing is downloaded here)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if "zh" in args.parts:
        chinese(args)
    if "en" not in args.parts:
        return

    from elmo_jax import training
    from elmo_jax.data import recipes
    from elmo_jax.api.elmo import Elmo
    from elmo_jax.tasks import pos, wsd

    w = args.workdir
    os.makedirs(w, exist_ok=True)
    rec = {n: recipes.prepare(n, args.cache_dir) for n in ("brown", "sotu", "wordnet")}
    models = {}
    sotu_vocab = write_vocab(rec["sotu"]["train_files"], os.path.join(w, "vocab-sotu.txt"))
    models["sotu"] = cached(os.path.join(w, "model-sotu.json"), lambda: pretrain(
        "pretrain on SOTU", rec["sotu"]["train_files"], sotu_vocab, os.path.join(w, "sotu"),
        args.pretrain_minutes))
    brown_vocab = write_vocab(rec["brown"]["train_files"], os.path.join(w, "vocab-brown.txt"))
    models["sotu+brown"] = cached(os.path.join(w, "model-sotu+brown.json"), lambda: pretrain(
        "fine-tune on Brown's training text", rec["brown"]["train_files"], brown_vocab,
        os.path.join(w, "sotu+brown"), args.finetune_minutes,
        init_from=models["sotu"]["export"]))
    for name, m in models.items():
        run = os.path.join(w, name)
        say(f"perplexity of {name} on the Brown test files: python train.py eval --workdir {run} "
            f"--eval_files {rec['brown']['test_file']}")
        m["brown_test"] = cached(os.path.join(w, f"brown-test-{name}.json"),
                                 lambda: training.evaluate_workdir(run, rec["brown"]["test_file"]))
        print(json.dumps(m["brown_test"]))

    splits = [pos.load_split(rec["brown"]["pos_dir"], s) for s in ("train", "dev", "test")]
    tagging = []
    runs = [("sotu", mode) for mode in ("mix", "layer0", "top", "random")] + [
        ("sotu+brown", "mix"), ("sotu+brown", "top"), ("sotu", "random+mix"),
        ("sotu+brown", "random+mix")]
    for name, mode in runs:
        tagging += tagging_runs(rec["brown"]["pos_dir"], models[name]["export"], [(name, mode)],
                                args, w, "", splits)

    baseline = pos.most_frequent_tag_accuracy(splits[0], splits[2])
    print("most frequent tag per word:", json.dumps(baseline))

    probes = []
    for name, m in models.items():
        cmd = (f"python -m elmo_jax.tasks.wsd --weights {m['export']} --examples "
               f"{rec['wordnet']['examples_file']}")
        say(cmd)

        def run_probe(m=m, name=name, cmd=cmd):
            elmo = Elmo.from_pretrained(m["export"])
            return {"model": name, "command": cmd,
                    **wsd.probe(elmo, wsd.load_examples(rec["wordnet"]["examples_file"]))}

        r = cached(os.path.join(w, f"wsd-{name}.json"), run_probe)
        print(json.dumps(r))
        probes.append(r)

    out = {"models": models, "tagging": tagging, "most_frequent_tag": baseline, "wsd": probes,
           "args": vars(args), "date": time.strftime("%Y-%m-%d")}
    with open(os.path.join(w, "results.json"), "w") as fh:
        json.dump(out, fh, indent=2)
    write_tables(out, os.path.join(HERE, "RESULTS.md"))
    print("\nwrote RESULTS.md tables and", os.path.join(w, "results.json"))


def tagging_runs(pos_dir, export, runs, args, w, prefix, splits):
    """Tag with each (model name, mode) in `runs`; cached per run."""
    from elmo_jax.formats.stored_model import open_model
    from elmo_jax.tasks import pos

    out = []
    for name, mode in runs:
        cmd = (f"python -m elmo_jax.tasks.pos --weights {export} --pos_dir {pos_dir} "
               f"--mode {mode} --epochs {args.tagger_epochs}")
        say(cmd)

        def tag(mode=mode, name=name, cmd=cmd):
            model = open_model(export)
            config = pos.TaggerConfig(mode=mode, epochs=args.tagger_epochs,
                                      max_train_sentences=args.max_train_sentences)
            return {**pos.train_and_evaluate(model.params, model.options, *splits, config,
                                             progress=True, lexicon=model.lexicon),
                    "model": name, "command": cmd}

        r = cached(os.path.join(w, f"{prefix}pos-{name}-{mode}.json"), tag)
        print(json.dumps(r))
        out.append(r)
    return out


def chinese(args) -> dict:
    """The Chinese rows: a tiny biLM on Chinese news + People's Daily, its
    perplexity beside the add-one unigram model's, and People's Daily tagging."""
    from elmo_jax import training
    from elmo_jax.data import recipes
    from elmo_jax.training.evaluation import unigram_perplexity
    from elmo_jax.data.recipes.common import link_shards
    from elmo_jax.formats.hub import DownloadError, resolve
    from elmo_jax.tasks import pos
    from elmo_jax.core.vocab import Vocabulary

    w = args.workdir
    rec = {n: recipes.prepare(n, args.cache_dir) for n in ("zh-news", "peoples-daily")}
    train_glob = link_shards({n: rec[n]["train_files"] for n in rec},
                             os.path.join(w, "zh-train"))
    vocab_file = write_vocab(train_glob, os.path.join(w, "vocab-zh.txt"))
    model = cached(os.path.join(w, "model-zh.json"), lambda: pretrain(
        "pretrain on Chinese news + People's Daily", train_glob, vocab_file,
        os.path.join(w, "zh"), args.zh_minutes))
    test = rec["peoples-daily"]["test_file"]
    say(f"perplexity of zh on People's Daily test: python train.py eval --workdir "
        f"{os.path.join(w, 'zh')} --eval_files {test}")
    model["pd_test"] = cached(os.path.join(w, "pd-test-zh.json"),
                              lambda: training.evaluate_workdir(os.path.join(w, "zh"), test))
    model["pd_test_unigram"] = unigram_perplexity(train_glob, Vocabulary.from_file(vocab_file),
                                                  test)
    print(json.dumps(model["pd_test"]), "unigram", json.dumps(model["pd_test_unigram"]))
    pos_dir = rec["peoples-daily"]["pos_dir"]
    splits = [pos.load_split(pos_dir, s) for s in ("train", "dev", "test")]
    runs = [("zh", m) for m in ("mix", "layer0", "top", "random", "random+mix")]
    tagging = tagging_runs(pos_dir, model["export"], runs, args, w, "zh-", splits)
    os.environ.setdefault("ELMO_JAX_OFFLINE", "1")  # results never download
    try:
        zhs = resolve(args.zhs_model, progress=False)[0]
    except (DownloadError, FileNotFoundError) as e:
        zhs, zhs_note = None, (
            f"ELMoForManyLangs' Simplified Chinese model was not run here: {e}. This machine "
            "cannot download it (no internet); `python results.py --parts zh --zhs_model "
            "PATH` runs it where the model is (its folder or archive).")
        print(zhs_note)
    if zhs is not None:
        tagging += tagging_runs(pos_dir, zhs, [("manylangs-zhs", "mix")], args, w, "zh-",
                                splits)
        zhs_note = None
    out = {"model": model, "tagging": tagging, "recipes": rec, "zhs_note": zhs_note,
           "most_frequent_tag": pos.most_frequent_tag_accuracy(splits[0], splits[2], "n"),
           "args": vars(args), "date": time.strftime("%Y-%m-%d")}
    with open(os.path.join(w, "results-zh.json"), "w") as fh:
        json.dump(out, fh, indent=2, ensure_ascii=False)
    write_zh_tables(out, os.path.join(HERE, "RESULTS.md"))
    return out


def _replace_block(path: str, marker: str, table: str) -> None:
    """Replace the text between `<!-- MARKER: begin/end -->` (appended when missing)."""
    home = os.path.expanduser("~") + "/"  # shown as ~, outside quotes so that shells expand it
    table = table.replace("'" + home, "~/'").replace(home, "~/")
    begin, end = f"<!-- {marker}: begin -->", f"<!-- {marker}: end -->"
    text = open(path).read() if os.path.exists(path) else "# Results\n"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{table}\n{end}",
                  text, flags=re.S)
    with open(path, "w") as fh:
        fh.write(text)


TAGGER_INPUTS = {"mix": "ELMo scalar mix", "layer0": "layer 0 only", "top": "top layer only",
                 "random": "random word embeddings (no ELMo)",
                 "random+mix": "random word embeddings + ELMo scalar mix"}


def pos_table(what: str, tagging: list[dict], baseline: dict, unknown: str) -> list[str]:
    """A POS table: a row per tagging run, then the most-frequent-tag baseline."""
    return (["", f"**POS tagging** ({what}, linear tagger, test accuracy; epoch chosen on dev):",
             "", "| biLM | input to the tagger | dev | test | mix weights (layer 0, 1, 2) | command |",
             "| --- | --- | --- | --- | --- | --- |"] + tagging_rows(tagging)
            + [f"| — | no model: each word's most frequent training tag ({unknown} if unseen; "
               f"{baseline['unseen_word_rate']:.1%} of test words are) | | "
               f"{baseline['test_accuracy']:.4f} | | |"])


def tagging_rows(tagging: list[dict]) -> list[str]:
    """The POS tables' rows, one per tagging run."""
    rows = []
    for r in tagging:
        model = "—" if r["mode"] == "random" else r["model"]
        weights = ", ".join(f"{x:.2f}" for x in r.get("mix_weights", [])) or ""
        rows.append(f"| {model} | {TAGGER_INPUTS[r['mode']]} | {r['dev_accuracy']:.4f} | "
                    f"{r['test_accuracy']:.4f} | {weights} | `{r['command']}` |")
    return rows


def write_zh_tables(out: dict, path: str) -> None:
    m, b, a = out["model"], out["model"]["pd_test"], out["args"]
    lines = [f"Run of {out['date']} (`python results.py --parts zh --zh_minutes "
             f"{a['zh_minutes']:g} --tagger_epochs {a['tagger_epochs']}`).", "",
             "**Chinese biLM** (the `tiny` config; words from jieba on the news, the gold "
             "segmentation on People's Daily):", "",
             "| model | how | steps | tokens seen | training time | People's Daily test "
             "perplexity (fwd / bwd / avg) | add-one unigram |",
             "| --- | --- | --- | --- | --- | --- | --- |",
             f"| zh | `{m['command']}` | {m['steps']} | {m['tokens_seen']:,} | "
             f"{m['train_seconds'] / 60:.0f} min | {b['eval_ppl_forward']:.0f} / "
             f"{b['eval_ppl_backward']:.0f} / {b['eval_ppl']:.0f} | "
             f"{m['pd_test_unigram']['ppl']:.0f} |"]
    lines += pos_table("People's Daily 1998, PKU tags", out["tagging"], out["most_frequent_tag"],
                       "n")
    if out.get("zhs_note"):
        lines += ["", out["zhs_note"]]
    _replace_block(path, "results-zh", "\n".join(lines))


def write_tables(out: dict, path: str) -> None:
    """Replace the text between the markers of RESULTS.md with fresh tables."""
    lines = [f"Run of {out['date']} (`python results.py "
             f"--pretrain_minutes {out['args']['pretrain_minutes']:g} "
             f"--finetune_minutes {out['args']['finetune_minutes']:g} "
             f"--tagger_epochs {out['args']['tagger_epochs']}`).", "",
             "**biLMs** (the `tiny` config, 256 cells / 64 projection, 2 layers):", "",
             "| model | how | steps | tokens seen | training time | Brown test perplexity (fwd / bwd / avg) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, m in out["models"].items():
        b = m["brown_test"]
        lines.append(f"| {name} | `{m['command']}` | {m['steps']} | {m['tokens_seen']:,} | "
                     f"{m['train_seconds'] / 60:.0f} min | {b['eval_ppl_forward']:.0f} / "
                     f"{b['eval_ppl_backward']:.0f} / {b['eval_ppl']:.0f} |")
    lines += pos_table("Brown, 12 universal tags", out["tagging"], out["most_frequent_tag"],
                       "NOUN")
    lines += ["", "**Word-sense probe** (WordNet usage examples, leave-one-out 1-nearest "
              "neighbour per layer):", "",
              "| biLM | lemmas | scored examples | first sense | layer 0 | layer 1 | layer 2 | command |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in out["wsd"]:
        acc = " | ".join(f"{a:.4f}" for a in r["accuracy_by_layer"])
        lines.append(f"| {r['model']} | {r['lemmas']} | {r['scored_examples']} | "
                     f"{r['first_sense_accuracy']:.4f} | {acc} | `{r['command']}` |")
    _replace_block(path, "results", "\n".join(lines))


if __name__ == "__main__":
    from elmo_jax.cli.huge_pages import reexec_with_huge_pages  # before JAX loads

    reexec_with_huge_pages()
    main()
