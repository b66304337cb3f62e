"""The report's memory columns: the call's own memory, MLX's allocator peak and the process
RSS, each labelled, never summed into one number (``variants.runtime.memory`` measures them); the
cold start's loading apart from its first call. No MLX.

MLX's buffer cache is emptied before each timed measurement
(:func:`variants.runtime.warmth.clear_buffer_cache`); what it then holds after the calls stays in
timing.json and summary.csv (``*_cache_memory_bytes``) but is no report column: it is the
calls' freed buffers, already inside the RSS. Runs written before the RSS was recorded have
only the allocator peak: their RSS column and summary.csv cells are left out rather than shown
empty.
"""

import math

#: timing.json entry key -> summary.csv suffix (``b<B>_`` / ``e2e_b<B>_`` prefixed), written
#: only when the entry holds it.
HELD = ("var_cache_memory_bytes", "ref_cache_memory_bytes", "var_process_rss_bytes",
        "ref_process_rss_bytes")

#: Cold-start memory (key in the cold_start dict, header), shown when measured.
COLD_MEMORY = (("load_peak_memory_bytes", "load: allocator peak MB"),
               ("load_process_rss_bytes", "load: RSS MB"),
               ("first_call_peak_memory_bytes", "1st call: allocator peak MB"),
               ("first_call_cache_memory_bytes", "1st call: cache MB"),
               ("first_call_process_rss_bytes", "1st call: RSS MB"),
               ("process_peak_rss_bytes", "process peak RSS MB"))

NOTE = ("Memory, three numbers never added together, MB = 10^6 bytes, max over rounds: "
        "**call's own** = the allocator peak during the call minus the bytes active just "
        "before it (its activations and workspace); **allocator peak** = "
        "`mx.get_peak_memory`, reset before every call (every array alive, i.e. both models' "
        "weights too); **process RSS** = the resident set of the whole process (interpreter, "
        "libraries, both models, MLX's buffer cache) just after the call, as the operating "
        "system counts it. MLX's buffer cache is emptied before each measurement "
        "(`mx.clear_cache`), so earlier work's freed buffers are in none of them; what the "
        "cache holds after the calls is in timing.json and summary.csv "
        "(`*_cache_memory_bytes`). **cold calls** = timed calls that were the first of their "
        "(B, L) shape for their model since that clear (warm-ups excluded; any flags the "
        "speed-up).")

COLD_NOTE = ("Cold-start memory: **load** = after the weights are loaded and the variant built, "
             "before any call; **1st call** = the first tokenisation and forward (allocator peak "
             "reset after loading, so this is the call's own peak, weights included; cache and "
             "RSS just after it); process peak RSS = the child's peak resident set (`VmHWM`). "
             "peak MB = allocator peak of the whole process. **loads from**: `exported "
             "artifact` = the variant's weights folder as `variants export` writes it (packed "
             "weights, factored layers, head, temperatures; no fp32 checkpoint read, nothing "
             "built: quant and low-rank variants timed natively); `fp32 checkpoint + build` = "
             "the fp32 checkpoint, then the family's builder (the families that do not "
             "export); the reference loads its fp32 checkpoint.")


def _num(v):
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def held_cells(prefix, entry):
    """summary.csv cells ``<prefix>var_cache_memory_bytes`` ... of one timing.json entry (only
    the keys it holds)."""
    return {prefix + k: entry[k] for k in HELD if k in entry}


def held_columns(r, p):
    """The timing table's ``process RSS MB`` cell of summary row ``r`` at prefix ``p``; {} when
    the row has none (a run from before it was recorded)."""
    if not _num(r.get(p + "var_process_rss_bytes")):
        return {}
    # of the whole process (one resident set), read after calls of the two models in turn:
    # one number, never a variant's and a reference's
    rss = max(r[p + "var_process_rss_bytes"], r[p + "ref_process_rss_bytes"])
    return {"process RSS MB": f"{rss / 1e6:.0f}"}


def cold_columns(d):
    """The cold-start table's memory cells of one cold_start dict; {} when none was measured."""
    if not any(_num(d.get(k)) for k, _ in COLD_MEMORY):
        return {}
    return {head: (f"{d[k] / 1e6:.1f}" if _num(d.get(k)) else "—") for k, head in COLD_MEMORY}
