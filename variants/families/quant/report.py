"""Report lines of a learned quantizer's variant (AWQ, GPTQ, DWQ) from its build.json. No MLX."""


def _short(path):
    return path.removeprefix("encoder.layers.")


def method_lines(info):
    """Markdown for ``info`` (a build.json dict) of a learned method: the method, its settings,
    the fit rows it learned from, its build time, and per Linear the relative output error
    tr(ΔW G ΔWᵀ) / tr(W G Wᵀ) on the fit split's activations of round-to-nearest and of the
    method (DWQ: also its start, AWQ scales with GPTQ codes by default). None for round-to-nearest (no ``method`` or "rtn")."""
    method = info.get("method", "rtn")
    if method == "rtn":
        return None
    rows = info.get("layers", [])
    settings = ", ".join(f"{k} {v}" for k, v in info.get("method_settings", {}).items())
    n_reused = info.get("layers_reused", 0)
    cached = (" (read from the cache; the first build's time)" if info.get("cached") else
              f" ({n_reused} Linears read from the per-layer cache, their first learning's "
              "seconds included)" if n_reused else "")
    lines = [f"- quantizer: **{method}** ({settings}); learned from {info.get('calibration_rows')} "
             f"fit-split rows (no calibration or eval row); build {info.get('build_s', 0):.1f} "
             f"s{cached}"]
    if rows:
        rtn = sum(r["rtn_rel_error"] for r in rows) / len(rows)
        got = sum(r["rel_error"] for r in rows) / len(rows)
        better = sum(r["rel_error"] < r["rtn_rel_error"] for r in rows)
        lines.append(f"- per-layer relative output error, mean over {len(rows)} Linears: RTN "
                     f"{rtn:.4g} -> {method} {got:.4g} (lower in {better} of {len(rows)})")
    if info.get("input_scaled_layers"):
        lines.append(f"- AWQ input scales: {info['input_scaled_layers']} Linears multiply their "
                     "input by 1/s before the packed matmul (not foldable into a post-LN "
                     "LayerNorm; these layers leave the fused whole-layer CPU kernel)")
    if "loss_before" in info:
        kl = (f" (its KL part {info['kl_before']:.4g} -> {info['kl_after']:.4g})"
              if "kl_before" in info else "")
        lines.append(f"- distilled scales: loss to the reference on {info.get('valid_texts')} "
                     f"held-out fit texts {info['loss_before']:.4g} -> {info['loss_after']:.4g}"
                     f"{kl} in {info.get('steps')} steps on {info.get('texts')} fit texts; "
                     f"{info.get('trained_norms', 0)} LayerNorm tensors trained; kept: "
                     f"{info.get('trained_scales_kept')}")
    if rows:
        extra = "init_rel_error" in rows[0]
        lines += ["", "| layer | bits | RTN rel. err | " + ("start | " if extra else "")
                  + f"{method} rel. err |" + (" α | clipped |" if "alpha" in rows[0] else ""),
                  "|---|---:|---:|" + ("---:|" if extra else "") + "---:|"
                  + ("---:|---:|" if "alpha" in rows[0] else "")]
        for r in rows:
            cells = [_short(r["path"]), str(r["bits"]), f"{r['rtn_rel_error']:.4g}"]
            if extra:
                cells.append(f"{r['init_rel_error']:.4g}")
            cells.append(f"{r['rel_error']:.4g}")
            if "alpha" in r:
                clipped = r.get("clipped_groups")  # AWQ's; the AWQ-scaled GPTQ start clips none
                cells += [f"{r['alpha']:.2f}", "—" if clipped is None else f"{clipped:.0%}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
