"""Numeric flags of every verb: empty, whitespace, non-numeric, negative, zero, fractional, NaN, inf, huge."""
from __future__ import annotations

from harness import SEARCH_FAST, SENS_FAST, SWEEP_FAST, Case, override

HUGE_INT = "1000000000000"
HUGE_FLOAT = "1e300"

INT_VALUES = {"empty": "", "space": " ", "abc": "abc", "neg": "-1", "zero": "0", "frac": "1.5",
              "nan": "nan", "huge": HUGE_INT}
FLOAT_VALUES = {"empty": "", "space": " ", "abc": "abc", "neg": "-1", "zero": "0", "nan": "nan",
                "inf": "inf", "huge": HUGE_FLOAT}

# (verb, flag, kind, base argv, needs, which values, {value-kind: expectation other than refuse})
SW, SE, SN = ["sweep", *SWEEP_FAST], ["search", *SEARCH_FAST], ["sensitivity", *SENS_FAST]
ALL_I = tuple(INT_VALUES)
ALL_F = tuple(FLOAT_VALUES)
FEW_I = ("abc", "neg", "zero", "frac", "nan", "huge")
FEW_F = ("abc", "neg", "nan", "inf", "huge")
FAM = ("abc", "neg", "nan")


def fam(f: str) -> list:
    return ["sweep", *override(SWEEP_FAST, bits=None), "--family", f]


ZERO_OK = {"zero": "either"}
SPECS = [
    # sweep, the quant family (the default)
    ("sweep", "--n-fit", "i", SW, (), ALL_I, {"huge": "either"}),
    ("sweep", "--n-calibration", "i", SW, (), ALL_I, {"huge": "either"}),
    ("sweep", "--n-eval", "i", SW, (), ALL_I, {"huge": "either"}),
    ("sweep", "--max-length", "i", SW, (), FEW_I, {"huge": "either"}),
    ("sweep", "--timing-rounds", "i", SW, (), FEW_I, {"huge": "either"}),
    ("sweep", "--timing-warmup", "i", SW, (), FEW_I, {"zero": "accept", "huge": "either"}),
    ("sweep", "--timing-budget-s", "f", SW, (), FEW_F, {"zero": "either", "huge": "either"}),
    ("sweep", "--timing-min-rounds", "i", SW, (), FEW_I, {"zero": "either"}),
    ("sweep", "--timing-batch-sizes", "i", SW, (), FEW_I, {"huge": "either"}),
    ("sweep", "--near-tie-margin", "f", SW, (), FEW_F, ZERO_OK),
    ("sweep", "--batch-size", "i", SW, (), FEW_I, {"huge": "either"}),
    ("sweep", "--seed", "i", SW, (), FEW_I, {"zero": "accept", "huge": "either"}),
    ("sweep", "--workers", "i", SW, (), ("abc", "neg", "zero", "nan", "huge"), {"huge": "either"}),
    ("sweep", "--bits", "i", SW, (), ("empty", "abc", "neg", "zero", "nan"), {}),
    ("sweep", "--group-size", "i", SW, (), ("abc", "neg", "zero", "nan", "huge"), {}),
    ("sweep", "--zipf-exponent", "f", SW, (), ("abc", "nan"), {}),
    ("sweep", "--workload-calls", "i", SW, (), ("abc", "neg", "zero"), {}),
    # family flags, each under its family
    ("sweep", "--alpha", "f", fam("lowrank"), (), FAM + ("inf",), {"neg": "either"}),
    ("sweep", "--ratios", "f", fam("lowrank"), (), FAM + ("zero", "inf"), {}),
    ("sweep", "--energies", "f", fam("lowrank") + ["--rank-rule", "energy"], (), FAM + ("zero",), {}),
    ("sweep", "--ranks", "i", fam("lowrank") + ["--rank-rule", "rank"], (), FAM + ("zero", "huge"), {"huge": "either"}),
    ("sweep", "--lowrank-bits", "i", fam("lowrank") + ["--ratios", "0.9"], (), ("abc", "neg", "zero"), {}),
    ("sweep", "--keep-ratios", "f", fam("prune"), (), FAM + ("zero", "inf"), {}),
    ("sweep", "--prune-layers", "i", fam("prune"), (), FAM + ("huge",), {}),
    ("sweep", "--prune-bits", "i", fam("prune"), (), ("abc", "neg"), {}),
    ("sweep", "--exit-targets", "f", fam("exit"), (), FAM + ("inf",), {}),
    ("sweep", "--exit-thresholds", "f", fam("exit"), (), FAM, {"neg": "either"}),
    ("sweep", "--exit-layers", "i", fam("exit"), (), FAM + ("huge",), {}),
    ("sweep", "--exit-label-mix", "f", fam("exit"), (), FAM + ("inf",), {}),
    ("sweep", "--exit-bits", "i", fam("exit"), (), ("abc", "neg"), {}),
    ("sweep", "--student-layers", "i", fam("student"), (), FAM + ("zero", "huge"), {}),
    ("sweep", "--fallback-targets", "f", fam("student"), (), FAM, {}),
    ("sweep", "--student-epochs", "i", fam("student"), (), FAM + ("zero",), {"zero": "either"}),
    ("sweep", "--student-train-texts", "i", fam("student"), (), FAM + ("zero",), {}),
    ("sweep", "--student-lr", "f", fam("student"), (), FAM + ("inf", "zero"), {}),
    ("sweep", "--student-hidden-weight", "f", fam("student"), (), FAM + ("inf",), {}),
    ("sweep", "--cache-sizes", "i", fam("exact"), (), FAM + ("zero",), {"zero": "either"}),
    # check (recomputes verdicts of a finished run)
    ("check", "--near-tie-margin", "f", ["check", "{run}"], ("run",), FEW_F, ZERO_OK),
    ("check", "--alpha", "f", ["check", "{run}"], ("run",), FEW_F + ("zero",), {}),
    ("check", "--n-bootstrap", "i", ["check", "{run}"], ("run",), FEW_I, {"zero": "accept"}),  # 0 = none (--help)
    ("check", "--seed", "i", ["check", "{run}"], ("run",), FEW_I, {"zero": "accept", "huge": "either"}),
    ("check", "--worst", "i", ["check", "{run}"], ("run",), FEW_I, {"zero": "either", "huge": "either"}),
    ("selftest", "--seed", "i", ["selftest"], (), ("empty", "abc", "neg", "zero", "nan", "huge"),
     {"zero": "accept", "huge": "either"}),
    ("plot", "--dpi", "i", ["plot", "{run}"], ("run",), ALL_I, {}),
    # compare A:q8 (run base) with B:q6 (run other)
    ("compare", "--margin", "f", ["compare", "{run}:q8-g64", "{run2}:q6-g64"], ("run", "run2"), FEW_F,
     {"zero": "accept", "huge": "either"}),
    ("compare", "--relative-margin", "f", ["compare", "{run}:q8-g64", "{run2}:q6-g64"], ("run", "run2"),
     FEW_F, {"zero": "accept", "huge": "either"}),
    ("compare", "--n-bootstrap", "i", ["compare", "{run}:q8-g64", "{run2}:q6-g64"], ("run", "run2"), FEW_I,
     {"huge": "either"}),
    ("compare", "--seed", "i", ["compare", "{run}:q8-g64", "{run2}:q6-g64"], ("run", "run2"), FEW_I,
     {"zero": "accept", "huge": "either"}),
    # sensitivity
    ("sensitivity", "--n-examples", "i", SN, (), FEW_I, {"huge": "either"}),
    ("sensitivity", "--n-search", "i", SN, (), ("abc", "neg", "zero", "nan"), {}),
    ("sensitivity", "--n-fit", "i", SN, (), ("abc", "neg", "zero", "nan"), {}),
    ("sensitivity", "--n-calibration", "i", SN, (), ("abc", "neg", "zero"), {}),
    ("sensitivity", "--max-length", "i", SN, (), ("abc", "neg", "zero"), {}),
    ("sensitivity", "--bits", "i", SN, (), ("abc", "neg", "zero"), {}),
    ("sensitivity", "--seed", "i", SN, (), ("abc", "neg", "nan"), {}),
    ("sensitivity", "--workers", "i", SN, (), ("abc", "neg", "zero"), {}),
    # search
    ("search", "--max-candidates", "i", SE, (), ("abc", "neg", "zero", "nan"), {}),
    ("search", "--budget", "f", SE, (), ("abc", "neg", "nan", "inf"), {"inf": "either"}),
    ("search", "--bits", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--group-size", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--batch", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--chunk-size", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--search-margin", "f", SE, (), ("abc", "nan", "inf"), {}),
    ("search", "--n-search", "i", SE, (), ("abc", "neg", "zero", "nan"), {}),
    ("search", "--n-sensitivity", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--n-fit", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--n-calibration", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--n-eval", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--seed", "i", SE, (), ("abc", "neg", "nan"), {}),
    ("search", "--workers", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--timing-rounds", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--timing-warmup", "i", SE, (), ("abc", "neg"), {}),
    ("search", "--timing-budget-s", "f", SE, (), ("abc", "nan", "neg"), {}),
    ("search", "--timing-batch-sizes", "i", SE, (), ("abc", "neg", "zero"), {}),
    ("search", "--max-length", "i", SE, (), ("abc", "neg", "zero"), {}),
    # verify
    ("verify", "--tolerance", "f", ["verify", "{exp}"], ("exp",), FEW_F + ("zero",), {"zero": "either",
                                                                                    "huge": "either"}),
]


def number_cases() -> list:
    out = []
    for verb, flag, kind, base, needs, which, exp in SPECS:
        values = INT_VALUES if kind == "i" else FLOAT_VALUES
        fam_tag = ""
        if verb == "sweep" and "--family" in base:
            fam_tag = base[base.index("--family") + 1] + "-"
        for vk in which:
            argv = [base[0], *override(base[1:], **{flag[2:].replace("-", "_"): values[vk]})]
            out.append(Case(id=f"num-{verb}-{fam_tag}{flag[2:]}-{vk}", family=f"{verb}-numbers", argv=argv,
                            expect=exp.get(vk, "refuse"), needs=needs, timeout=90))
    return out
