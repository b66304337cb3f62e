"""What a search is asked: :class:`SearchOptions` (the flags of ``variants search``, validated
in one line each before anything is written), the settings an --out folder resumes with, and the
sweep keywords its finalists run with."""

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from variants import defaults as D
from variants.search import costs as costs_mod
from variants.search import strategies

FAMILIES = ("quant", "lowrank", "prune", "exit")  # beyond quant: --strategy optuna only
MAX_CANDIDATES = 10_000
MAX_SEED = 2**32 - 1
N_FINALISTS = 3


#: settings left out of search_settings.json at these values (a folder written before these
#: dimensions resumes); what an absent one means when a resume is refused
PLAIN = {"quant_methods": ["rtn"], "w8a8": False, "method_sensitivity": False,
         # a search from before issue #42's dimensions (fp32 scales, widths only, whole tables)
         "scale_dtype": "float32", "modes": [], "unseen_rows": False, "embedding_texts": "",
         # a search with --w8a8 before int8 candidates were judged on their native build
         "int8_judged": "simulated"}


@dataclass
class SearchOptions:
    """One field per ``variants search`` flag."""

    contract: str | None = None
    cost: str = "bytes"
    #: None: "latency" (the composed walk) for --cost latency-b1 / latency-b32, else "bisect"
    #: (few candidates: log2 of the threshold maps; greedy: one per raise)
    strategy: str | None = None
    families: tuple = ("quant",)
    seed: int = D.SEED
    max_candidates: int = 60
    budget: float | None = None
    bits: tuple = D.SEARCH_BITS
    group_size: int = D.GROUP_SIZE
    #: quantizers searched, one global choice per candidate (variants.search.dims)
    quant_methods: tuple = ("rtn",)
    #: AWQ's and GPTQ's walks read their own per-Linear sensitivity (variants.search.dims);
    #: False: every method walks on round-to-nearest's table
    method_sensitivity: bool = False
    #: Linears may also run as W8A8 on integer GEMMs (variants.search.dims)
    w8a8: bool = False
    #: the precision every affine unit stores its scales and biases in (formats.py): float16
    #: gives the same verdicts as float32 on minilm-sentiment's walk for 7% fewer bytes
    scale_dtype: str = "float16"
    #: microscaling modes each unit may take beside the widths (--cost bytes / bits / flops)
    modes: tuple = ("mxfp4", "mxfp8", "nvfp4")
    #: the word table's rows unseen in the fit texts are a unit of their own, lowered alone
    #: after the walk (row_lowering.py)
    unseen_rows: bool = True
    #: a file of the user's own texts whose word-table rows count as used (row_use.py)
    embedding_texts: str = ""
    #: the embedding tables are units of the search (quantized embeddings); the head only when
    #: asked (variants.search.units)
    quantize_embeddings: bool = True
    quantize_head: bool = False
    batch: int = 1
    chunk_size: int = 50
    stop: bool = True
    #: "bound": a clause passes on the search split only when its interval clears the threshold
    #: (variants.search.bounds); "value": the point value
    select: str = "bound"
    search_margin: float = 0.3  # max clauses: headroom a sample max needs (variants.search.margin)
    n_search: int | None = None  # None: from the data (variants.search.sizes)
    n_sensitivity: int = D.N_SENSITIVITY
    n_fit: int | None = None  # None: D.N_FIT on the bundled data, else from the data
    n_calibration: int = D.N_CALIBRATION
    n_eval: int = D.N_EVAL
    model: str | None = None
    model_config: str | None = None
    checkpoint: str | None = None
    data: str | None = None
    max_length: int | None = D.MAX_LENGTH
    results_dir: str = D.RESULTS_DIR
    out: str | None = None
    executor: str = "local"
    workers: int = 1
    ray_address: str | None = None
    # the finalists are timed as sweep variants, with the sweep's defaults
    timing_rounds: int = D.TIMING_ROUNDS
    timing_warmup: int = D.TIMING_WARMUP
    timing_budget_s: float = D.TIMING_BUDGET_S
    timing_batch_sizes: tuple = D.TIMING_BATCH_SIZES
    cold_start: str = D.COLD_START
    finalize: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self, log=None):
        """Raise ValueError (one line naming the flag and the fix) for a value out of range.
        Split sizes left None are chosen here (:func:`variants.search.sizes.resolve`, which
        says so through ``log``)."""
        from variants.families.quant.family import BITS, check_bits
        from variants.search import sizes
        from variants.sweep.config import SweepConfig

        learned = [m for m in self.quant_methods if m != "rtn"]
        if learned and self.n_fit == 0:  # before the sizes: they would blame the data file
            raise ValueError(f"--quant-method {learned[0]} learns from the fit rows, but --n-fit "
                             f"is 0; pass --n-fit {sizes.MIN_FIT} or more (with --data, leave "
                             "it out: half the fit-split rows then go to the fit), or "
                             "--quant-method rtn")
        if self.n_fit is None or self.n_search is None:
            source = SweepConfig(model=self.model, model_config=self.model_config).resolve_model()
            sizes.resolve(self, source, log=log or (lambda m: None))

        if isinstance(self.out, str) and not self.out.strip():  # not the default folder
            raise ValueError("--out is empty; pass a folder")

        if self.cost not in costs_mod.COSTS:
            raise ValueError(f"--cost {self.cost!r} is unknown; choose one of "
                             f"{', '.join(costs_mod.COSTS)}")
        if self.strategy is None:  # asked for speed: every family composed, by latency
            self.strategy = "latency" if self.cost.startswith("latency") else "bisect"
        if self.strategy not in strategies.STRATEGIES:
            raise ValueError(f"--strategy {self.strategy!r} is unknown; choose one of "
                             f"{', '.join(strategies.STRATEGIES)}")
        self.families = tuple(dict.fromkeys(self.families))  # a repeated family is one
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ValueError(f"--families {' '.join(bad) or '(none)'}: the search covers "
                             f"{', '.join(FAMILIES)}; pass e.g. --families quant")
        from variants.search.composed import check_options

        check_options(self)
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed {self.seed} is out of range; pass 0 to {MAX_SEED}")
        if not 1 <= self.max_candidates <= MAX_CANDIDATES:
            raise ValueError(f"--max-candidates {self.max_candidates} is out of range; pass 1 "
                             f"to {MAX_CANDIDATES}")
        if self.budget is not None and not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"--budget {self.budget} must be a finite cost > 0 in the --cost's "
                             f"unit ({costs_mod.UNITS[self.cost]})")
        widths = sorted(set(self.bits))
        for b in widths:
            check_bits(b, self.group_size, prefix="--")
        if len(widths) < 2 and not (self.strategy == "optuna" and len(self.families) > 1):
            raise ValueError(f"--bits {' '.join(map(str, self.bits))}: give at least two widths "
                             f"to choose between, from {BITS}, e.g. --bits 4 6 8")
        self.bits = tuple(widths)
        from variants.layer_maps import formats

        formats.check_scale_dtype(self.scale_dtype)
        self.modes = tuple(dict.fromkeys(self.modes))
        if "none" in self.modes:
            if len(self.modes) > 1:
                raise ValueError(f"--modes {' '.join(self.modes)}: 'none' means no mode; pass "
                                 "either none or modes")
            self.modes = ()
        for m in self.modes:
            if m not in formats.MX_SHAPE:
                raise ValueError(f"--modes {m!r} is not a microscaling mode; choose from "
                                 f"{' '.join(formats.MX_SHAPE)}, or pass --modes none")
        if self.cost.startswith("latency") or self.strategy == "optuna" or self.w8a8 \
                or self.quant_methods != ("rtn",):
            self.modes = ()  # priced and learned for affine widths only
        if not self.quantize_embeddings or self.strategy not in ("bisect", "greedy"):
            self.unseen_rows = False
        if self.embedding_texts:
            from variants.families.quant.row_use import read_texts

            if not self.unseen_rows:
                raise ValueError("--embedding-texts tells the word-table rows in use for the "
                                 "unseen-rows step, which is off here (--no-unseen-rows, "
                                 "--no-quantize-embeddings or this --strategy); drop "
                                 "--embedding-texts")

            read_texts(self.embedding_texts)  # a bad file: one line, before anything runs
            self.embedding_texts = str(Path(self.embedding_texts).resolve())  # (Ray workers)
        from variants.families.quant.config import METHODS

        self.quant_methods = tuple(dict.fromkeys(self.quant_methods))
        bad = [m for m in self.quant_methods if m not in METHODS]
        if bad or not self.quant_methods:
            raise ValueError(f"--quant-method {' '.join(bad) or '(none)'}: not known; choose "
                             f"from {' '.join(METHODS)}")
        if self.strategy == "optuna" and (self.w8a8 or self.quant_methods != ("rtn",)):
            raise ValueError("--w8a8 and --quant-method other than rtn are searched by the "
                             "bisect and greedy strategies only; drop them or pass --strategy "
                             "bisect")
        for flag, v, lo in (("--batch", self.batch, 1), ("--chunk-size", self.chunk_size, 1),
                            ("--n-sensitivity", self.n_sensitivity, 10),
                            ("--n-search", self.n_search, 40)):  # two parts of 20 at least
            if v < lo:
                raise ValueError(f"{flag} {v} must be >= {lo}")
        from variants.search.bounds import SELECT

        if self.select not in SELECT:
            raise ValueError(f"--select {self.select!r} is unknown; choose one of "
                             f"{', '.join(SELECT)}")
        if not 0 <= self.search_margin < 1:
            raise ValueError(f"--search-margin {self.search_margin} must be in [0, 1), e.g. "
                             "0.25")
        if self.finalize:  # the finalists' sweep settings: now, not after the whole search
            from variants.sweep.config import SweepConfig

            SweepConfig(**dict(self.sweep_kwargs(), timing_rounds=self.timing_rounds,
                               timing_warmup=self.timing_warmup,
                               timing_budget_s=self.timing_budget_s,
                               cold_start=self.cold_start)).validate()
        return self

    def settings(self):
        """What must match to resume (search_settings.json)."""
        d = asdict(self)
        for k in ("out", "progress", "executor", "workers", "ray_address", "extra",
                  "timing_rounds", "timing_warmup",
                  "timing_budget_s", "timing_batch_sizes", "cold_start", "finalize"):
            d.pop(k)
        d["families"], d["bits"] = list(self.families), list(self.bits)
        d["quant_methods"] = list(self.quant_methods)
        d["modes"] = list(self.modes)
        for k, plain in PLAIN.items():
            if k in d and d[k] == plain:  # a search from before these dimensions resumes
                del d[k]
        if d["max_length"] is None:  # the tokenizer files' (searches from before the flag)
            del d["max_length"]
        return d

    def sweep_kwargs(self):
        return dict(model=self.model, model_config=self.model_config, checkpoint=self.checkpoint,
                    data=self.data, max_length=self.max_length, family="quant",
                    contract=self.contract,
                    results_dir=self.results_dir,
                    n_fit=D.N_FIT if self.n_fit is None else self.n_fit,  # None: not validated
                    n_calibration=self.n_calibration, n_eval=self.n_eval, seed=self.seed,
                    progress=False, timing_batch_sizes=tuple(self.timing_batch_sizes),
                    params={"bits": [self.bits[0]], "group_size": self.group_size,
                            "quantize_embeddings": self.quantize_embeddings,
                            "quantize_head": self.quantize_head})

    def quant_config(self, default_bits, bits_map, method="rtn", int8=""):
        """The QuantConfig of a candidate (its map as ``--bits`` + ``--bits-map``, its
        quantizer as ``--quant-method``, its W8A8 Linears as ``--int8-layers``)."""
        from variants.families.quant.family import QuantConfig

        return QuantConfig(bits=default_bits, group_size=self.group_size, bits_map=bits_map,
                           quantize_embeddings=self.quantize_embeddings,
                           quantize_head=self.quantize_head, method=method, int8=int8,
                           scale_dtype=self.scale_dtype, embedding_texts=self.embedding_texts)

    def out_dir(self, model):
        return Path(self.out) if self.out else \
            Path(self.results_dir) / "search" / f"{model}-{self.cost}-{self.strategy}"
