"""Paths, names, choices, duplicated / conflicting flags and VARIANTS_* environment variables."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness import REPO, SEARCH_FAST, SENS_FAST, SWEEP_FAST, Case, override

SW = ["sweep", *SWEEP_FAST]
DATA = str(REPO / "examples" / "vader_raters.jsonl")


def sw(**kw) -> list:
    return ["sweep", *override(SWEEP_FAST, **kw)]


def mkfile(name, text="x\n"):
    def setup(ctx):
        p = Path(ctx["tmp"]) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return setup


def mkdir(name):
    return lambda ctx: (Path(ctx["tmp"]) / name).mkdir(parents=True, exist_ok=True)


def copy_data(name):
    def setup(ctx):
        shutil.copy(DATA, Path(ctx["tmp"]) / name)
    return setup


def unreadable(name, kind):
    def setup(ctx):
        p = Path(ctx["tmp"], name)
        if kind == "checkpoint":
            shutil.copytree(REPO / "examples", p)  # any folder; unreadable anyway
        elif kind == "data":
            shutil.copy(DATA, p)
        elif kind == "contract":
            shutil.copy(REPO / "contracts" / "default.toml", p)
        else:
            shutil.copy(REPO / "examples" / "model-linear-head.toml", p)
        os.chmod(p, 0)
    return setup


def path_cases() -> list:
    C = []
    # sweep inputs
    for flag, extra in (("--data", []), ("--model-config", []), ("--checkpoint", []), ("--contract", [])):
        k = flag[2:]
        C += [Case(f"path-sweep-{k}-missing", "paths", sw(**{k.replace("-", "_"): "nope/missing.x"})),
              Case(f"path-sweep-{k}-empty", "paths", sw(**{k.replace("-", "_"): ""})),
              Case(f"path-sweep-{k}-newline", "paths", sw(**{k.replace("-", "_"): "a\nb"})),
              Case(f"path-sweep-{k}-unreadable", "paths", sw(**{k.replace("-", "_"): "f.x"}), setup=mkfile("f.x"),
                   as_nobody=True)]
        if flag != "--checkpoint":
            C.append(Case(f"path-sweep-{k}-is-dir", "paths", sw(**{k.replace("-", "_"): "adir"}), setup=mkdir("adir")))
    for c in C:  # an unreadable file of the right kind (a folder for --checkpoint)
        if c.id.endswith("unreadable"):
            name = {"data": "f.jsonl", "checkpoint": "ck"}.get(c.id.split("-")[2], "f.toml")
            c.argv = [name if a == "f.x" else a for a in c.argv]
            c.setup = unreadable(name, c.id.split("-")[2])
    C += [Case("path-sweep-checkpoint-is-file", "paths", sw(checkpoint="f.x"), setup=mkfile("f.x")),
          Case("path-sweep-checkpoint-empty-dir", "paths", sw(checkpoint="adir"), setup=mkdir("adir")),
          Case("path-sweep-data-space-name", "paths", sw(data="my data.jsonl", n_fit="60"), setup=copy_data("my data.jsonl"),
               expect="accept", timeout=200),
          Case("path-sweep-data-unicode-name", "paths", sw(data="dätä-ü.jsonl"), setup=copy_data("dätä-ü.jsonl"),
               expect="accept", timeout=200),
          Case("path-sweep-results-dir-is-file", "paths", sw(results_dir="f.x"), setup=mkfile("f.x")),
          Case("path-sweep-results-dir-empty", "paths", sw(results_dir="")),
          Case("path-sweep-results-dir-newline", "paths", sw(results_dir="r\nx")),
          Case("path-sweep-results-dir-readonly", "faults", sw(results_dir="ro"), setup=mkdir("ro"), as_nobody=True),
          Case("path-sweep-results-dir-space-unicode", "paths", sw(results_dir="rés ults"), expect="accept")]
    # check / plot / verify / export positional folders
    for verb, extra in (("check", []), ("plot", []), ("verify", []), ("export", ["--out", "o"])):
        C += [Case(f"path-{verb}-missing", "paths", [verb, "nope", *extra]),
              Case(f"path-{verb}-empty-string", "paths", [verb, "", *extra]),
              Case(f"path-{verb}-is-file", "paths", [verb, "f.x", *extra], setup=mkfile("f.x")),
              Case(f"path-{verb}-empty-dir", "paths", [verb, "adir", *extra], setup=mkdir("adir")),
              Case(f"path-{verb}-newline", "paths", [verb, "r/ba\nse", *extra], needs=("run",))]
    C += [Case("path-check-results-root", "paths", ["check", "r"], needs=("run",)),
          Case("path-check-export-folder", "paths", ["check", "{exp}"], needs=("exp",)),
          Case("path-plot-export-folder", "paths", ["plot", "{exp}"], needs=("exp",)),
          Case("path-verify-run-folder", "paths", ["verify", "{run}"], needs=("run",)),
          Case("path-export-export-folder", "paths", ["export", "{exp}", "--out", "o"], needs=("exp",)),
          Case("path-check-output-dir-is-file", "paths", ["check", "{run}", "--output-dir", "f.x"], needs=("run",),
               setup=mkfile("f.x")),
          Case("path-check-output-dir-empty", "paths", ["check", "{run}", "--output-dir", ""], needs=("run",)),
          Case("path-check-output-dir-new", "paths", ["check", "{run}", "--output-dir", "chk out"], needs=("run",),
               expect="accept"),
          Case("path-check-run-space-unicode", "paths", ["check", "r/bäse x"], needs=("run",), expect="accept",
               setup=lambda ctx: os.rename(Path(ctx["tmp"], "r/base"), Path(ctx["tmp"], "r/bäse x"))),
          Case("path-check-readonly-run", "faults", ["check", "{run}"], needs=("run",), as_nobody=True,
               expect="either"),
          Case("path-check-unreadable-outputs", "faults", ["check", "{run}"], needs=("run",), as_nobody=True,
               setup=lambda ctx: (os.system(f"chown -R 65534 '{ctx['tmp']}/r'"),
                                  os.chmod(Path(ctx["tmp"], "r/base/q8-g64/outputs.npz"), 0))),
          Case("path-verify-unreadable-model", "faults", ["verify", "{exp}"], needs=("exp",), as_nobody=True,
               setup=lambda ctx: (os.unlink(Path(ctx["tmp"], "exp/model.safetensors")),
                                  shutil.copy(Path(ctx["tmp"], "exp/config.json"), Path(ctx["tmp"], "exp/model.safetensors")),
                                  os.chmod(Path(ctx["tmp"], "exp/model.safetensors"), 0)))]
    # compare operands
    cmp = lambda a, b, **kw: Case(kw.pop("id"), "compare", ["compare", a, b], needs=("run", "run2", "run3", "exp"), **kw)
    C += [cmp("nope", "{run}", id="cmp-a-missing"), cmp("{run}", "nope", id="cmp-b-missing"),
          cmp("", "{run}", id="cmp-a-empty"), cmp("{run}:", "{run}", id="cmp-a-colon-empty-variant"),
          cmp(":", ":", id="cmp-colons"), cmp("{run}:nope", "{run}", id="cmp-a-variant-missing"),
          cmp("{run}", "{run3}", id="cmp-no-common-variant"),
          cmp("{run}", "{run2}", id="cmp-single-variants-different-names", expect="either"),
          cmp("{run}", "{run}", id="cmp-run-with-itself", expect="accept"),
          cmp("{run}:q8-g64", "{run3}:q4-g64", id="cmp-explicit-variants", expect="accept"),
          cmp("{run3}:q4-g64", "{run3}:q6-g64", id="cmp-two-of-one-run", expect="accept"),
          cmp("f.x", "{run}", id="cmp-a-is-file", setup=mkfile("f.x")),
          cmp("{exp}", "{run}", id="cmp-a-export-folder"),
          cmp("r", "{run}", id="cmp-a-results-root"),
          cmp("{run}:q8-g64:x", "{run}", id="cmp-a-two-colons")]
    CMP = ["compare", "{run}:q8-g64", "{run2}:q6-g64"]
    for flag in ("--markdown", "--json", "--html"):
        k = flag[2:]
        C += [Case(f"cmp-{k}-empty", "compare", CMP + [flag, ""], needs=("run", "run2")),
              Case(f"cmp-{k}-is-dir", "compare", CMP + [flag, "adir"], needs=("run", "run2"), setup=mkdir("adir")),
              Case(f"cmp-{k}-missing-parent", "compare", CMP + [flag, "no/such/dir/x"], needs=("run", "run2"),
                   expect="either")]
    C += [Case("cmp-issue-n-bootstrap-neg-same", "compare", ["compare", "{run}", "{run}", "--n-bootstrap", "-1"],
               needs=("run",)),
          Case("cmp-fail-if-worse-margin-neg", "compare", CMP + ["--fail-if-worse", "--margin", "-1"],
               needs=("run", "run2"), expect="either"),
          Case("cmp-margin-and-relative", "compare", CMP + ["--margin", "0.1", "--relative-margin", "0.1"],
               needs=("run", "run2"), expect="either")]
    # export outputs
    EX = ["export", "{run}", "--variant", "q8-g64"]
    C += [Case("exp-out-empty", "export", EX + ["--out", ""], needs=("run",)),
          Case("exp-out-space", "export", EX + ["--out", " "], needs=("run",)),
          Case("exp-out-nonempty-dir", "export", EX + ["--out", "adir"], needs=("run",),
               setup=mkfile("adir/keep.txt")),
          Case("exp-out-is-file", "export", EX + ["--out", "f.x"], needs=("run",), setup=mkfile("f.x")),
          Case("exp-out-newline", "export", EX + ["--out", "o\nx"], needs=("run",)),
          Case("exp-out-unicode-space", "export", EX + ["--out", "shïp ped"], needs=("run",), expect="accept"),
          Case("exp-out-readonly-parent", "faults", EX + ["--out", "ro/o"], needs=("run",), setup=mkdir("ro"),
               as_nobody=True),
          Case("exp-out-missing", "export", ["export", "{run}", "--variant", "q8-g64"], needs=("run",)),
          Case("exp-variant-missing", "export", ["export", "{run}", "--variant", "nope", "--out", "o"], needs=("run",)),
          Case("exp-variant-empty", "export", ["export", "{run}", "--variant", "", "--out", "o"], needs=("run",)),
          Case("exp-variant-dotdot", "export", ["export", "{run}", "--variant", "../base", "--out", "o"],
               needs=("run",)),
          Case("exp-variant-reference", "export", ["export", "{run}", "--variant", "reference", "--out", "o"],
               needs=("run",), expect="either"),
          Case("exp-no-variant-multi", "export", ["export", "{run3}", "--out", "o"], needs=("run3",)),
          Case("exp-no-variant-single", "export", ["export", "{run}", "--out", "o"], needs=("run",), expect="either"),
          Case("exp-allow-fail-on-pass", "export", EX + ["--out", "o", "--allow-fail"], needs=("run",),
               expect="accept")]
    # sensitivity / search outputs and regexes
    C += [Case("sens-issue-checkpoint-bad", "sensitivity", ["sensitivity", "--checkpoint", "BAD"]),
          Case("sens-out-empty", "sensitivity", ["sensitivity", *SENS_FAST, "--out", ""]),
          Case("sens-out-is-file", "sensitivity", ["sensitivity", *SENS_FAST, "--out", "f.x"], setup=mkfile("f.x")),
          Case("sens-layers-bad-regex", "sensitivity", ["sensitivity", *override(SENS_FAST, layers="(")]),
          Case("sens-layers-no-match", "sensitivity", ["sensitivity", *override(SENS_FAST, layers="zzz")]),
          Case("sens-group-size-bad", "sensitivity", ["sensitivity", *SENS_FAST, "--group-size", "48"]),
          Case("sens-model-bogus", "sensitivity", ["sensitivity", *SENS_FAST, "--model", "bogus"]),
          Case("sens-data-missing", "sensitivity", ["sensitivity", *SENS_FAST, "--data", "nope.jsonl"]),
          Case("sens-executor-bogus", "sensitivity", ["sensitivity", *SENS_FAST, "--executor", "bogus"]),
          Case("search-out-empty", "search", ["search", *SEARCH_FAST, "--out", ""]),
          Case("search-out-is-file", "search", ["search", *SEARCH_FAST, "--out", "f.x"], setup=mkfile("f.x")),
          Case("search-n-search-small", "search", ["search", *override(SEARCH_FAST, n_search="40")], expect="either"),
          Case("search-cost-bogus", "search", ["search", *SEARCH_FAST, "--cost", "bogus"]),
          Case("search-strategy-bogus", "search", ["search", *SEARCH_FAST, "--strategy", "bogus"]),
          Case("search-families-bogus", "search", ["search", *SEARCH_FAST, "--families", "bogus"]),
          Case("search-select-bogus", "search", ["search", *SEARCH_FAST, "--select", "bogus"]),
          Case("search-contract-bogus", "search", ["search", *SEARCH_FAST, "--contract", "bogus"]),
          Case("search-executor-bogus", "search", ["search", *SEARCH_FAST, "--executor", "bogus"]),
          Case("search-quant-method-bogus", "search", ["search", *SEARCH_FAST, "--quant-method", "bogus"]),
          Case("search-bits-one-width", "search", ["search", *override(SEARCH_FAST, bits="8")]),
          Case("search-bits-seven", "search", ["search", *override(SEARCH_FAST, bits=["7", "8"])]),
          Case("search-budget-tiny", "search", ["search", *SEARCH_FAST, "--budget", "1"], expect="either"),
          Case("search-ok-tiny", "search", ["search", *SEARCH_FAST], expect="accept", timeout=200)]
    return C


NAMES = {"slash": "a/b", "dotdot": "..", "dotdot-escape": "../escape", "dot": ".", "newline": "a\nb",
         "ctrl": "a\x01b", "tab": "a\tb", "long": "x" * 300, "empty": "", "space": " ", "dash": "-x",
         "null": "null", "NA": "NA", "nan": "nan", "abs": "{tmp}/abs-name", "backslash": "a\\b",
         "unicode": "ünï-名前", "trailing-space": "run "}
NAME_OK = {"null", "NA", "nan", "unicode", "dash"}


def name_cases() -> list:
    C = []
    for k, v in NAMES.items():
        exp = "either" if k in NAME_OK else "refuse"
        argv = ["sweep", *SWEEP_FAST, f"--run={v}"] if k == "dash" else sw(run=v)
        C.append(Case(f"name-sweep-run-{k}", "names", argv, expect=exp, timeout=120))
    for k in ("slash", "dotdot-escape", "newline", "ctrl", "long", "empty", "abs"):
        out = {"dotdot-escape": "sub/../o2"}.get(k, NAMES[k])
        C.append(Case(f"name-export-out-{k}", "names", ["export", "{run}", "--variant", "q8-g64", "--out", out],
                      needs=("run",), expect="accept" if k in ("slash", "dotdot-escape", "abs") else "refuse"))
        C.append(Case(f"name-check-variant-{k}", "names", ["check", "{run}", "--variant", NAMES[k]], needs=("run",)))
    for k in ("slash", "newline", "long", "nan"):
        C.append(Case(f"name-search-out-{k}", "names", ["search", *SEARCH_FAST, "--out", NAMES[k]],
                      expect="either" if k in ("slash", "nan") else "refuse", timeout=120))
    return C


def choice_cases() -> list:
    C = []
    for flag, val in (("--family", "bogus"), ("--quality-mode", "bogus"), ("--speed-mode", "bogus"),
                      ("--cold-start", "bogus"), ("--device", "tpu"), ("--device", ""), ("--dtype", "int8"),
                      ("--executor", "bogus"), ("--model", "bogus"), ("--model", ""), ("--model", "nomod:build"),
                      ("--model", "json:loads"), ("--model", "os:sep"), ("--group-size", "48"),
                      ("--bits-map", "garbage"), ("--bits-map", "foo=9"), ("--bits-map", "=8"),
                      ("--quant-method", "bogus"), ("--int8-layers", "("), ("--contract", "bogus"),
                      ("--ray-address", "localhost:1"), ("--device", "gpu")):
        C.append(Case(f"choice-sweep-{flag[2:]}-{val or 'empty'}".replace(":", "_").replace("(", "paren"), "choices",
                      ["sweep", *SWEEP_FAST, flag, val]))
    for fam, flag, val in (("lowrank", "--methods", "bogus"), ("lowrank", "--rank-rule", "bogus"),
                           ("lowrank", "--lowrank-group-size", "48"), ("lowrank", "--ratio-map", "garbage"),
                           ("prune", "--prune-scores", "bogus"), ("prune", "--prune-schedules", "bogus"),
                           ("exit", "--exit-rules", "bogus"), ("student", "--fallback-rule", "bogus"),
                           ("student", "--student-init", "bogus"), ("exact", "--exact-kinds", "bogus")):
        C.append(Case(f"choice-sweep-{fam}-{flag[2:]}", "choices",
                      ["sweep", *override(SWEEP_FAST, bits=None), "--family", fam, flag, val]))
    C += [Case("choice-check-contract-bogus", "choices", ["check", "{run}", "--contract", "bogus"], needs=("run",)),
          Case("choice-check-contract-strict", "choices", ["check", "{run}", "--contract", "strict"], needs=("run",)),
          Case("choice-selftest-contract-bogus", "choices", ["selftest", "--contract", "bogus"]),
          Case("choice-list-extra-arg", "choices", ["list", "extra"]),
          Case("choice-unknown-verb", "choices", ["sweeep"]),
          Case("choice-no-verb", "choices", []),
          Case("choice-unknown-flag", "choices", ["check", "{run}", "--bogus"], needs=("run",)),
          Case("choice-abbrev-flag", "choices", ["check", "{run}", "--fail"], needs=("run",), expect="either"),
          Case("choice-verify-two-dirs", "choices", ["verify", "{exp}", "{exp}"], needs=("exp",)),
          Case("choice-plot-no-dir", "choices", ["plot"])]
    # duplicated and conflicting flags
    C += [Case("dup-sweep-n-fit", "duplicates", SW + ["--n-fit", "70"], expect="tolerate",
               doc="argparse: the last value wins (standard for every CLI flag)", timeout=120),
          Case("dup-sweep-run", "duplicates", sw(run="a") + ["--run", "b"], expect="tolerate",
               doc="argparse: the last value wins", timeout=120),
          Case("dup-sweep-bits-repeated-value", "duplicates", sw(bits=["8", "8"]), expect="either", timeout=120),
          Case("dup-check-variant-twice", "duplicates", ["check", "{run}", "--variant", "q8-g64", "q8-g64"],
               needs=("run",), expect="either"),
          Case("conflict-min-rounds-over-rounds", "conflicts", SW + ["--timing-min-rounds", "5"]),
          Case("conflict-quant-flag-lowrank", "conflicts", ["sweep", *SWEEP_FAST, "--family", "lowrank"]),
          Case("conflict-model-and-config", "conflicts", SW + ["--model", "minilm-choice", "--model-config",
                                                                 str(REPO / "examples/model-marker.toml")]),
          Case("conflict-ray-address-local", "conflicts", SW + ["--executor", "local", "--ray-address", "h:1"]),
          Case("conflict-workers-local", "conflicts", SW + ["--executor", "local", "--workers", "2"],
               expect="either", timeout=120),
          Case("conflict-search-no-finalize-fail", "conflicts", ["search", *SEARCH_FAST, "--no-finalize",
                                                                 "--fail-on-violation"], expect="either", timeout=200),
          Case("conflict-budget-latency", "conflicts", ["search", *SEARCH_FAST, "--cost", "latency-b1",
                                                        "--budget", "0.001"], expect="either", timeout=200),
          Case("conflict-energies-params-rule", "conflicts", ["sweep", *override(SWEEP_FAST, bits=None),
                                                              "--family", "lowrank", "--energies", "0.9"])]
    return C


ENVS = [("VARIANTS_QKERNEL", "banana"), ("VARIANTS_QKERNEL", " "), ("VARIANTS_FUSED_LAYER", "banana"),
        ("VARIANTS_KERNEL_ISA", "banana"), ("VARIANTS_KERNEL_ISA", "avx9000"), ("VARIANTS_BLAS", "banana"),
        ("VARIANTS_BLAS", "/nonexistent/libfoo.so"), ("VARIANTS_FUSED_THREADS", "banana"),
        ("VARIANTS_FUSED_THREADS", "-1"), ("VARIANTS_FUSED_THREADS", "0"), ("VARIANTS_STREAMS", "banana"),
        ("VARIANTS_STREAMS", "-1"), ("VARIANTS_STREAMS", "0"), ("VARIANTS_STREAMS", "1000000"),
        ("VARIANTS_DEVICE", "tpu"), ("VARIANTS_DEVICE", "gpu"), ("VARIANTS_KERNEL_CACHE", "/proc/nope"),
        ("VARIANTS_MODERNBERT_ATTENTION", "banana")]


def env_cases() -> list:
    C = []
    for k, v in ENVS:
        tag = {"banana": "garbage", " ": "space", "-1": "neg", "0": "zero", "1000000": "huge"}.get(v, v.strip("/").split("/")[-1])
        C.append(Case(f"env-{k[9:].lower()}-{tag}", "env", SW, env={k: v}, timeout=150,
                      expect="either" if v == " " else "refuse"))  # whitespace = unset
    C += [Case("env-qkernel-off", "env", SW, env={"VARIANTS_QKERNEL": "off"}, expect="accept", timeout=150),
          Case("env-kernel-cache-file", "env", SW, env={"VARIANTS_KERNEL_CACHE": "f.x"}, setup=mkfile("f.x"),
               timeout=150),
          Case("env-qkernel-garbage-check", "env", ["check", "{run}"], env={"VARIANTS_QKERNEL": "banana"},
               needs=("run",), expect="either"),
          Case("env-device-garbage-list", "env", ["list"], env={"VARIANTS_DEVICE": "tpu"}, expect="either"),
          Case("env-test-nonfinite-garbage", "env", ["sweep", *SWEEP_FAST, "--model", "tests.sweep.nonfinite_model:build"],
               env={"VARIANTS_TEST_NONFINITE": "banana"}, expect="either", timeout=150)]
    return C


def input_cases() -> list:
    return path_cases() + name_cases() + choice_cases() + env_cases()
