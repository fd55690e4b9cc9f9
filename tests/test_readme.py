"""The README's and the site's commands exist and run: ```bash and ```python
blocks of README.md and of every page under docs/ are run in order (`DOCS`)
in one sandbox; ```sh blocks (several hosts, accelerators) have their
scripts and flags checked against --help; ```gcs blocks run against the GCS
emulator; make targets exist. The site builds with no warning, names
every public name in its API reference, and executes the quick-start
notebook (notebooks/quickstart.ipynb) as it builds."""
import functools
import html
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO, devices_env

pytestmark = pytest.mark.e2e
# README.md, then the site's pages in the order their examples build on each
# other (the training guide's run is the AllenNLP and scoring sections' model)
DOCS = ["README.md", "docs/index.md", "docs/quickstart.md", "docs/guides/chinese.md",
        "docs/guides/embedding.md", "docs/guides/models.md", "docs/guides/flax.md",
        "docs/guides/corpus.md", "docs/guides/training.md", "docs/guides/serving.md",
        "docs/reference/commands.md",
        "docs/guides/pods.md", "docs/guides/tasks.md", "docs/performance.md",
        "docs/guides/recipes.md", "docs/reference/config.md", "docs/reference/api.md",
        "docs/reference/environment.md",
        "docs/formats/export.md", "docs/formats/serving.md", "docs/formats/store.md", "docs/formats/workdir.md",
        "docs/layout.md", "docs/changelog.md"]
TEXT = {d: open(os.path.join(REPO, d), encoding="utf-8").read() for d in DOCS}
README = TEXT["README.md"]
# fenced blocks: ```INFO at a line's start, to the next ``` at a line's start
BLOCKS = [(info.strip(), text) for d in DOCS
          for info, text in re.findall(r"^```([^\n]*)\n(.*?)^```", TEXT[d], re.S | re.M)]


def commands(text):
    """Shell lines of a block, with backslash continuations joined."""
    return [c.strip() for c in text.replace("\\\n", " ").splitlines()
            if c.strip() and not c.strip().startswith("#")]


def help_text(argv):
    return _help(tuple(argv))


@functools.lru_cache(maxsize=None)  # one --help per command, however often the README uses it
def _help(argv: tuple) -> str:
    """--help of `python SCRIPT [subcommand]` or `python -m MODULE`."""
    r = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, capture_output=True,
                       text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, (argv, r.stderr[-2000:])
    return r.stdout


def check_flags(cmd):
    words = shlex.split(cmd)
    if words[0] == "elmo-jax":  # the installed command is `python -m elmo_jax`
        words = ["python", "-m", "elmo_jax"] + words[1:]
    assert words[0] == "python", cmd
    if words[1:3] == ["-m", "elmo_jax"]:
        target = words[1:4]
    elif words[1] == "-m":
        target = words[1:3]
    else:
        assert os.path.exists(os.path.join(REPO, words[1])), cmd
        target = words[1:3] if len(words) > 2 and words[2] in ("export", "eval", "vocab", "score", "plan") \
            else words[1:2]
    usage = help_text(target)
    for flag in (w for w in words if w.startswith("--")):
        assert flag in usage, (flag, cmd)


def test_make_targets_exist():
    makefile = open(os.path.join(REPO, "Makefile")).read()
    for target in {t for d in DOCS for t in re.findall(r"^make (\w+)", TEXT[d], re.M)}:
        assert re.search(rf"^{target}:", makefile, re.M), target
    assert "make test" in open(os.path.join(REPO, ".ci", "run")).read()


def test_every_page_is_in_the_run_and_the_readme_is_short():
    pages = {os.path.relpath(os.path.join(f, n), REPO)
             for f, dirs, names in os.walk(os.path.join(REPO, "docs"))
             if "_build" not in f for n in names if n.endswith(".md")}
    assert pages == set(DOCS) - {"README.md"}
    assert README.count("\n") <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", README):  # the README's links to the site
        assert os.path.exists(os.path.join(REPO, link)), link


def test_the_site_builds_with_no_warning_and_references_every_public_name(tmp_path):
    """`make docs`'s build (Sphinx, warnings as errors) from the checkout, and
    an API entry for each name in `elmo_jax.__all__`."""
    import elmo_jax

    r = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b",
                        "html", os.path.join(REPO, "docs"), str(tmp_path / "html")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "html" / "reference" / "api.html").exists()
    api = TEXT["docs/reference/api.md"]
    entries = set(re.findall(r"\.\. auto(?:function|class):: elmo_jax\.(\w+)$", api, re.M))
    assert set(elmo_jax.__all__) - entries == set()
    page = (tmp_path / "html" / "reference" / "commands.html").read_text(encoding="utf-8")
    for flag in ("--train_files", "--workdir", "--sentence_vectors", "--eval_files"):
        assert flag in page, flag  # the commands' flags, from their parsers
    # the quick-start notebook, executed by the build (a failing cell fails it)
    page = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "html" / "notebooks" /
                                                  "quickstart.html").read_text("utf-8")))
    assert "layer 0: cosine of the two 'bank's = 1.000" in page  # one vector for both senses
    assert "learned layer weights:" in page and "plotted 3 layer weights" in page
    assert "Traceback" not in page


def test_sh_blocks_use_real_flags():
    cmds = [c for info, text in BLOCKS if info == "sh" for c in commands(text)]
    assert cmds
    for c in cmds:
        check_flags(c)


def test_bash_and_python_blocks_run_in_order(tmp_path):
    for name in ("elmo_jax", "configs", "tests", "train.py", "embed.py"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    # short runs whose time is compiling: LLVM at -O0, as the two-process tests
    env = dict(devices_env(1, compile_bound=True), PYTHONPATH=REPO)
    ran = 0
    for info, text in BLOCKS:
        if info == "bash":
            for c in commands(text):
                if c.startswith("python") and not c.startswith("python -c"):
                    check_flags(c)
                c = re.sub(r"^python ", shlex.quote(sys.executable) + " ", c)
                r = subprocess.run(c, shell=True, cwd=tmp_path, env=env, capture_output=True,
                                   text=True, timeout=600)
                assert r.returncode == 0, (c, r.stderr[-3000:])
                ran += 1
        elif info == "python":
            r = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, (text, r.stderr[-3000:])
            ran += 1
    assert ran >= 10
    assert (tmp_path / "runs" / "my_elmo" / "export" / "weights.hdf5").exists()
    assert (tmp_path / "runs" / "corpus.hdf5").exists()  # "Embed a corpus", in a fresh folder
    # the AllenNLP snippet (```py, not run: AllenNLP is not a dependency) names those files
    py = [text for info, text in BLOCKS if info == "py"]
    assert any("runs/my_elmo/export/weights.hdf5" in text for text in py)


def test_layout_names_every_module_and_top_level_file():
    """The Layout page's tree (generated: docs/_ext/layout.py) has a line for
    each module of the package, and its block of what lies beside the package
    names each top-level file and folder of the tree."""
    sys.path.insert(0, os.path.join(REPO, "docs", "_ext"))
    import layout

    page = TEXT["docs/layout.md"]
    assert "```{layout-tree}" in page and "```{layout-layers}" in page
    tree = "\n".join(layout.tree_lines())
    missing = [p for m, p in layout.modules().items() if not m.endswith("__main__")
               and os.path.basename(p if not p.endswith("__init__.py") else os.path.dirname(p))
               .removesuffix(".py") not in tree]
    beside = [text for info, text in re.findall(r"^```([^\n]*)\n(.*?)^```", page, re.S | re.M)
              if info == ""][0]
    named = set(re.findall(r"[\w.]+\.(?:py|ipynb|md)|[\w-]+/", beside))
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout
    top = {p.split("/")[0] + ("/" if "/" in p else "") for p in tracked.split()}
    hidden = {"Makefile", "README.md", "BENCHMARKS.md", "RESULTS.md", "pyproject.toml",
              "requirements.txt", "requirements-accelerators.txt",
              "requirements-docs.txt", "elmo_jax/"}  # described elsewhere; the tree above
    missing += sorted(t for t in top if not t.startswith(".") and t not in hidden
                      and t not in named and t + "/" not in named)  # configs: a link
    assert missing == []


def test_gcs_blocks_run_against_the_emulator(tmp_path, gcs):
    """The pods guide's ```gcs block: its commands run in order against the
    GCS emulator, in a bucket `my-bucket` holding the grammar corpus, from a
    folder that holds nothing of the run."""
    import fsspec

    from conftest import write_grammar_corpus

    data = write_grammar_corpus(tmp_path / "data")
    fs = fsspec.filesystem("gcs", use_listings_cache=False)
    if not fs.exists("my-bucket"):
        fs.mkdir("my-bucket")
    for name, path in data.items():
        fs.put_file(path, f"my-bucket/corpus/{name}")
    work = tmp_path / "host"
    work.mkdir()
    for name in ("configs", "train.py", "embed.py"):
        os.symlink(os.path.join(REPO, name), work / name)
    env = dict(devices_env(1, compile_bound=True), PYTHONPATH=REPO)
    cmds = [c for info, text in BLOCKS if info == "gcs" for c in commands(text)]
    assert len(cmds) >= 4
    for c in cmds:
        if not c.startswith("python -c"):
            check_flags(c)
        r = subprocess.run(re.sub(r"^python ", shlex.quote(sys.executable) + " ", c),
                           shell=True, cwd=work, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, (c, r.stderr[-3000:])
    assert r.stdout.split()[0] == "60"  # the held-out file's lines, read back from the bucket
    assert sorted(os.listdir(work)) == ["configs", "embed.py", "train.py"]
    assert fs.exists("my-bucket/elmo-tiny/export/weights.hdf5")
