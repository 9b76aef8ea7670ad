"""`ahc lens ...`: build lens packs. Exit 0 success, 2 bad usage, 1 failure with one stderr line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Lens packs: concept directions over one layer's hidden state.")


def _fail(message: str) -> None:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(1)


@app.command("train")
def train(
    model: Annotated[Path, typer.Option(help="Model directory (HF format, with config.json).")],
    examples: Annotated[Path, typer.Option(help="JSON file of concepts with example texts.")],
    layer: Annotated[int, typer.Option(help="hidden_states index (0 = embeddings, N = after layer N).")],
    out: Annotated[Path, typer.Option(help="Directory to write lens.safetensors and lens.json into.")],
    method: Annotated[str, typer.Option(help="means (difference of class means) or logistic.")] = "means",
) -> None:
    """Build a lens pack from labelled example texts (transformers forward on the CPU)."""
    from lens.probes import METHODS

    if method not in METHODS:
        raise typer.BadParameter(f"must be one of {', '.join(METHODS)}", param_hint="--method")
    try:
        from lens.pack import save_pack
        from lens.train import train_pack

        pack = train_pack(model, examples, layer, method)
        save_pack(pack, out)
    except (ValueError, FileNotFoundError, OSError) as exc:
        _fail(str(exc) or type(exc).__name__)
    typer.echo(f"{out} ({pack.n_concepts} concepts, layer {pack.layer}, {pack.method})")
    if "heldout" in pack.extra:
        from lens.evaluate import heldout_table

        for line in heldout_table(pack.extra["heldout"]):
            typer.echo(line)


@app.command("sweep")
def sweep(
    model: Annotated[Path, typer.Option(help="Model directory (HF format, with config.json).")],
    examples: Annotated[Path, typer.Option(help="JSON file of concepts with example and held-out texts.")],
    layers: Annotated[str, typer.Option(help="Comma-separated hidden_states indices; default every 3rd.")] = "",
    methods: Annotated[str, typer.Option(help="Comma-separated methods.")] = "means,logistic",
) -> None:
    """Held-out AUC of every (layer, method), to choose the pack's layer by measurement."""
    from lens.probes import METHODS

    chosen_methods = [m.strip() for m in methods.split(",") if m.strip()]
    if not chosen_methods or any(m not in METHODS for m in chosen_methods):
        raise typer.BadParameter(f"must be among {', '.join(METHODS)}", param_hint="--methods")
    try:
        chosen_layers = [int(x) for x in layers.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter("must be comma-separated integers", param_hint="--layers") from None
    try:
        from lens.evaluate import choose, sweep_table
        from lens.pack import model_fingerprint
        from lens.train import load_examples
        from lens.train import sweep as run_sweep

        num_layers = model_fingerprint(model)["num_layers"]
        rows = run_sweep(str(model), load_examples(examples), chosen_layers or list(range(0, num_layers + 1, 3)),
                         chosen_methods)
    except (ValueError, FileNotFoundError, OSError) as exc:
        _fail(str(exc) or type(exc).__name__)
    for line in sweep_table(rows):
        typer.echo(line)
    best = choose(rows, num_layers)
    typer.echo(f"chosen: --layer {best.layer} --method {best.method} (mean held-out AUC {best.mean_auc:.3f})")


@app.command("show")
def show(pack_dir: Annotated[Path, typer.Argument(help="Lens pack directory.")]) -> None:
    """Print a pack's concepts, layer and model fingerprint."""
    try:
        from lens.pack import load_pack

        pack = load_pack(pack_dir)
    except (ValueError, FileNotFoundError, OSError) as exc:
        _fail(str(exc) or type(exc).__name__)
    typer.echo(f"layer {pack.layer}, method {pack.method}, hidden {pack.hidden_size}, "
               f"model config sha256 {pack.model['config_sha256'][:12]}")
    for i, (cid, name) in enumerate(zip(pack.concept_ids, pack.names)):
        parent = pack.parents[i] if pack.parents else None
        typer.echo(f"{cid}\t{name}" + (f"\t(parent {parent})" if parent else ""))
