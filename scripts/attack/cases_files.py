"""Corrupt inputs: contract TOMLs, data files, model TOMLs; tampered run folders and export folders."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from harness import REPO, SWEEP_FAST, Case, override

DEFAULT = (REPO / "contracts" / "default.toml").read_text()
CLAUSE = '[[clause]]\nid = "x"\nmetric = "agreement"\nstratum = "decided"\nstatistic = "rate"\nmin = 0.9\n'
HEAD = 'name = "t"\n'


def write(name, data):
    def setup(ctx):
        p = Path(ctx["tmp"]) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


CONTRACTS = {
    "empty": "", "garbage": b"\x00\xff\xfe garbage \x80", "syntax": "[[clause]\nid = ",
    "no-clauses": HEAD, "unknown-top-key": HEAD + "colour = 1\n" + CLAUSE,
    "unknown-clause-key": HEAD + CLAUSE + "colour = 1\n",
    "bad-metric": HEAD + CLAUSE.replace('"agreement"', '"bogus"'),
    "bad-stratum": HEAD + CLAUSE.replace('"decided"', '"bogus"'),
    "bad-statistic": HEAD + CLAUSE.replace('"rate"', '"bogus"'),
    "bound-string": HEAD + CLAUSE.replace("0.9", '"high"'),
    "bound-nan": HEAD + CLAUSE.replace("0.9", "nan"),
    "bound-inf": HEAD + CLAUSE.replace("0.9", "inf"),
    "bound-rate-above-1": HEAD + CLAUSE.replace("0.9", "1.5"),
    "min-over-max": HEAD + CLAUSE + "max = 0.5\n",
    "no-bound": HEAD + CLAUSE.replace("min = 0.9\n", ""),
    "no-metric": HEAD + CLAUSE.replace('metric = "agreement"\n', ""),
    "duplicate-id": HEAD + CLAUSE + CLAUSE,
    "clause-not-table": HEAD + 'clause = "x"\n',
    "alpha-bad": HEAD + "alpha = 2\n" + CLAUSE,
    "non-utf8-name": b'name = "\xff\xfe"\n' + CLAUSE.encode(),
    "kl-on-agreement": HEAD + CLAUSE.replace('metric = "agreement"', 'metric = "kl"'),
    "default-copy": DEFAULT,
}
CONTRACT_OK = {"default-copy": "accept", "bound-rate-above-1": "either"}  # an unmeetable bound: FAIL is right

ROW = {"id": "r{i}", "text": "text number {i} is {w}", "options": ["negative", "neutral", "positive"],
       "label": "{l}"}


def rows(n=300, **over):
    out = []
    words = ["great", "awful", "fine", "bad", "lovely", "boring"]
    for i in range(n):
        r = {"id": f"r{i}", "text": f"text number {i} is {words[i % 6]}",
             "options": ["negative", "neutral", "positive"], "label": ["positive", "negative", "neutral"][i % 3]}
        for k, v in over.items():
            if v is None:
                r.pop(k, None)
            else:
                r[k] = v(i) if callable(v) else v
        out.append(json.dumps(r))
    return "\n".join(out) + "\n"


DATAS = {
    "empty.jsonl": "", "blank-lines.jsonl": "\n\n\n", "garbage.jsonl": b"\x00\x01garbage{{\n",
    "bad-json-line.jsonl": rows(299) + "{not json\n", "no-text.jsonl": rows(text=None),
    "text-null.jsonl": rows(text=lambda i: None if i == 5 else f"t {i}"),
    "text-number.jsonl": rows(text=lambda i: i), "empty-texts.jsonl": rows(text=""),
    "non-utf8.jsonl": rows(60).encode() + b'{"id": "x", "text": "\xff\xfe bad"}\n',
    "dup-ids.jsonl": rows(id="same"), "label-out-of-range.jsonl": rows(label=7),
    "label-negative.jsonl": rows(label=-1), "label-not-option.jsonl": rows(label="bogus"),
    "one-option.jsonl": rows(options=["only"], label="only"), "options-not-list.jsonl": rows(options="abc"),
    "json-array.jsonl": "[" + ",".join(rows(50).splitlines()) + "]\n", "few-rows.jsonl": rows(12),
    "empty.csv": "", "header-only.csv": "id,text,label\n", "wrong-columns.csv": "a,b\n1,2\n3,4\n",
    "ragged.csv": "id,text\n1,hello,extra,more\n2\n", "garbage.parquet": b"PAR1garbagegarbage",
    "unknown-ext.txt": rows(100), "null-strings.jsonl": rows(id=lambda i: ["null", "NA", "nan", "None"][i % 4] + str(i // 4)),
    "huge-text.jsonl": rows(200, text=lambda i: "word " * (20000 if i == 3 else 5) + str(i)),
}
DATA_OK = {"null-strings.jsonl": "accept", "huge-text.jsonl": "accept", "few-rows.jsonl": "refuse",
           "text-number.jsonl": "either", "label-negative.jsonl": "refuse",
           "empty-texts.jsonl": "tolerate"}
DATA_DOC = {"empty-texts.jsonl": "docs/user-guide.md: rows whose text tokenizes to special tokens "
                                 "only (empty or whitespace-only) are kept, judged and counted"}

MODELS = {
    "empty": "", "garbage": b"\xff\x00[[[", "unknown-key": 'name = "m"\ncolour = "red"\n',
    "logits-bogus": 'name = "m"\nlogits = "bogus"\n', "name-slash": 'name = "../../evil"\n',
    "name-newline": 'name = "a\\nb"\n', "options-one": 'name = "m"\noptions = ["only"]\n',
    "temperature-bogus": 'name = "m"\n[temperature]\nmode = "bogus"\n',
    "factory-bogus": 'name = "m"\nfactory = "nomodule:build"\n', "checkpoint-missing": 'name = "m"\ncheckpoint = "nope"\n',
    "max-length-neg": 'name = "m"\nmax_length = -1\n', "max-length-string": 'name = "m"\nmax_length = "long"\n',
    "scores-mismatch": 'name = "m"\noptions = ["a", "b"]\nscores = [1.0]\n',
}


def tamper(rel, how):
    def setup(ctx):
        p = Path(ctx["tmp"]) / rel
        if how == "delete":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            return
        data = p.read_bytes()
        p.unlink()
        if how == "truncate":
            p.write_bytes(data[: len(data) // 2])
        elif how == "garbage":
            p.write_bytes(b"\x00garbage\xff" * 16)
        elif how == "empty":
            p.write_bytes(b"")
        elif how == "flip":  # one byte in the middle
            b = bytearray(data)
            b[len(b) // 2 + 1001] ^= 0x55
            p.write_bytes(bytes(b))
    return setup


RUN_FILES = ["run.json", "summary.csv", "report.json", "reference/fitted.npz", "reference/outputs.npz",
             "reference/calibration_outputs.npz", "q8-g64/outputs.npz", "q8-g64/calibration_outputs.npz",
             "q8-g64/metrics.json", "q8-g64/verdict.json", "q8-g64/timing.json", "q8-g64/build.json",
             "q8-g64/report.json", "q8-g64", "reference"]
REWRITTEN = {"summary.csv", "report.json", "q8-g64/metrics.json", "q8-g64/verdict.json", "q8-g64/report.json"}
EXP_FILES = ["model.safetensors", "manifest.json", "config.json", "eval_rows.npz", "outputs.npz", "tokenizer.json",
             "verdict.json", "model.toml", "contract.toml", "judged", "vocab.txt", "report.json"]


# files a verb does not read (check judges saved outputs; plot and compare read verdicts, outputs,
# timing): a tampered one is rightly ignored
UNREAD = {"check": {"run.json", "reference/fitted.npz", "q8-g64/timing.json", "q8-g64/build.json"},
          "plot": {"reference/fitted.npz", "reference/calibration_outputs.npz"},
          "compare": {"reference/fitted.npz", "reference/calibration_outputs.npz", "q8-g64/build.json"}}


def must_fail(ctx, res):
    return "tampered export verified as good (exit 0)" if res.rc == 0 else ""


def file_cases() -> list:
    C = []
    for k, v in CONTRACTS.items():
        C.append(Case(f"contract-check-{k}", "contracts", ["check", "{run}", "--contract", "c.toml"], needs=("run",),
                      setup=write("c.toml", v), expect=CONTRACT_OK.get(k, "refuse")))
    for k in ("garbage", "bad-metric", "min-over-max"):
        C.append(Case(f"contract-sweep-{k}", "contracts", ["sweep", *SWEEP_FAST, "--contract", "c.toml"],
                      setup=write("c.toml", CONTRACTS[k])))
    C.append(Case("contract-selftest-bad-stratum", "contracts", ["selftest", "--contract", "c.toml"],
                  setup=write("c.toml", CONTRACTS["bad-stratum"])))
    for k, v in DATAS.items():
        C.append(Case(f"data-sweep-{k}", "data", ["sweep", *override(SWEEP_FAST, n_fit="20", n_calibration="20",
                                                                   n_eval="20"), "--data", k],
                      setup=write(k, v), expect=DATA_OK.get(k, "refuse"), doc=DATA_DOC.get(k, ""),
                      timeout=150))
    for k, v in MODELS.items():
        C.append(Case(f"model-toml-{k}", "model-toml", ["sweep", *SWEEP_FAST, "--model-config", "m.toml"],
                      setup=write("m.toml", v), timeout=150))
    for rel in RUN_FILES:
        for how in ("delete", "truncate", "garbage"):
            if how != "delete" and rel in ("q8-g64", "reference"):
                continue
            tag = rel.replace("/", "-").replace(".", "-")
            exp = "either" if rel in REWRITTEN else "refuse"
            C.append(Case(f"tamper-run-{tag}-{how}-check", "tampered-run", ["check", "{run}"], needs=("run",),
                          setup=tamper("r/base/" + rel, how), expect=exp))
            if how != "truncate":
                C.append(Case(f"tamper-run-{tag}-{how}-plot", "tampered-run", ["plot", "{run}"], needs=("run",),
                              setup=tamper("r/base/" + rel, how), expect="either" if rel in REWRITTEN or "timing" in rel
                              or "build" in rel else "refuse"))
            if how == "garbage" or (how == "delete" and "/" not in rel):
                C.append(Case(f"tamper-run-{tag}-{how}-compare", "tampered-run",
                              ["compare", "{run}:q8-g64", "{run2}:q6-g64"], needs=("run", "run2"),
                              setup=tamper("r/base/" + rel, how), expect="either" if rel in REWRITTEN else "refuse"))
                C.append(Case(f"tamper-run-{tag}-{how}-export", "tampered-run",
                              ["export", "{run}", "--variant", "q8-g64", "--out", "o"], needs=("run",),
                              setup=tamper("r/base/" + rel, how), expect="either"))
    for rel in EXP_FILES:
        hows = ("delete", "truncate", "garbage") if rel != "judged" else ("delete",)
        if rel == "model.safetensors":
            hows += ("flip",)
        for how in hows:
            C.append(Case(f"tamper-exp-{rel.replace('.', '-')}-{how}", "tampered-export", ["verify", "{exp}"],
                          needs=("exp",), setup=tamper("exp/" + rel, how), expect="either", check=must_fail))
    C += [Case("tamper-exp-extra-file", "tampered-export", ["verify", "{exp}"], needs=("exp",),
               setup=write("exp/extra.bin", b"x"), expect="either"),
          Case("tamper-exp-readme-edit", "tampered-export", ["verify", "{exp}"], needs=("exp",),
               setup=tamper("exp/README.md", "garbage"), expect="either")]
    for c in C:
        m = c.id.split("-")
        if c.family == "tampered-run" and c.expect == "refuse":
            verb = m[-1]
            rel = next(r for r in RUN_FILES if c.id.startswith("tamper-run-" + r.replace("/", "-").replace(".", "-") + "-"))
            if rel in UNREAD.get(verb, ()):
                c.expect = "either"
    return C
