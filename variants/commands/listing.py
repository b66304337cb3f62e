"""``variants list``: the registered models and variant families (imports no MLX)."""


def configure(sub):
    """Add the ``list`` subcommand to ``sub``; returns its parser."""
    p = sub.add_parser("list", help="list models and variant families",
                       description="List the registered decision models and variant families "
                                   "(no model is loaded).")
    p.set_defaults(func=run)
    return p


def run(args):
    """Print the model and family names and the quant family's bit widths; returns 0."""
    from variants.families import FAMILIES
    from variants.families.quant.family import BITS, GROUP_SIZES
    from variants.models import MODELS

    print("models:   " + ", ".join(MODELS) + " (or --model-config FILE, --model pkg.mod:factory)")
    print("families: " + ", ".join(FAMILIES))
    from variants.layer_maps.bits_map import RECIPES

    print(f"quant:    bits {BITS}, group sizes {GROUP_SIZES}; --bits-map recipes "
          f"{', '.join(RECIPES)}")
    return 0
