"""The strategies of a class (SpRAy, explain.analysis.strategies) at scale: 10,000 maps of
one class, each step timed, and the peak memory of the whole.

    .venv/bin/python benchmarks/bench_strategies.py [--items 10000] [--repeats 2]
        [--embedding tsne] [--results benchmarks/results/strategies.json]

The maps: 64 x 64 float32, three planted strategies (a blob in one of three places, its
place jittered, on noise) in shares of 50, 30 and 20 %, seeded. Each round runs in a process
of its own (so that its peak RSS, ``ru_maxrss``, is the analysis's alone, the maps included)
and times the steps: pooling to 32 x 32 and normalising; SpRAy (the 10-nearest-neighbour
affinity, the Laplacian's 18 smallest eigenvalues, the spectral embedding and k-means; the
affinity and the eigenvalues also timed alone) and the 2-D embedding (``--embedding``) of
the spectral embedding: the steps of ``strategies()``, whose time is their sum. Also checks
that the three planted strategies are found (the clusters and the purity and recall of the
smallest strategy).

Goal (issue 43): ``strategies()`` on 10,000 maps under 60 s on the 2-core machine, peak
memory under 2 GB. Medians of ``--repeats`` rounds; other processes on the same cores
distort the numbers (say so when reporting them).

``--craft`` times CRAFT (explain.concepts.CRAFT) instead, on the shortcut benchmark's
triangles (``--images``, at 64 x 64, the shortcut CNN at block3) or on the bundled
EfficientNet-Lite0 at 224 (``--craft-model efficientnet_lite0``, the images the benchmark's
triangles enlarged; layer bn2, Grad-CAM's): the whole call, against its baseline in the same
process: the forward passes of the same crops through the whole model plus the NMF of their
activations (scikit-learn's, as CRAFT runs it), and the importances' replays alone. Goal
(issue 43): CRAFT <= 1.3 x that baseline.

    .venv/bin/python benchmarks/bench_strategies.py --craft [--images 16] [--designs 32]

``--tcav`` times TCAV (explain.concepts.TCAV) with 20 random sets (``--random-sets``) on
the shortcut benchmark (the shortcut CNN at block3, 64 x 64: the triangles, 16 mark-only
images as the concept, 20 disjoint sets of 16 drawn from 320 of the benchmark's images) or on the
bundled EfficientNet-Lite0 at 224 (``--tcav-model efficientnet_lite0``, layer blocks.3, the
same images enlarged, 8 a set drawn from 40), against its baseline in the same process: the
forward passes of its images through the whole model (concept and random pool, in batches
of 32), the class images' forward and backward pass to the layer (the weights frozen) and
the same classifiers' fits (explain.concepts.tcav_results.fit_cav on those activations).
Goal (issue 43): TCAV <= 1.2 x that baseline. A first round is run and discarded (the
imports and the first passes would count against TCAV, which runs first).

    .venv/bin/python benchmarks/bench_strategies.py --tcav [--tcav-model shortcut]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

#: The figures of this run, written to --results at the end.
FIGURES: list[dict] = []


def planted_maps(count: int, size: int = 64, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """(count, size, size) maps of three strategies (50, 30, 20 %: a Gaussian blob in one of
    three places, its centre moved by up to 3 pixels, on noise) and each map's strategy."""
    generator = torch.Generator().manual_seed(seed)
    truth = np.repeat([0, 1, 2], [count // 2, count * 3 // 10, count - count // 2 - count * 3 // 10])
    places = torch.tensor([(12.0, 12.0), (12.0, size - 12.0), (size - 12.0, size / 2)])
    centres = places[truth] + 6 * (torch.rand(count, 2, generator=generator) - 0.5)
    grid = torch.arange(size, dtype=torch.float32)
    maps = torch.empty(count, size, size)
    for start in range(0, count, 1000):  # in chunks: the (N, H, W) intermediates stay small
        c = centres[start : start + 1000]
        dy = (grid[None, :, None] - c[:, 0, None, None]) ** 2
        dx = (grid[None, None, :] - c[:, 1, None, None]) ** 2
        maps[start : start + 1000] = torch.exp(-(dy + dx) / (2 * 6.0**2))
    maps += 0.1 * torch.rand(count, size, size, generator=generator)
    return maps, truth


def one_round(items: int, embedding: str) -> dict:
    """The steps timed in this process (the end-to-end time their sum, as strategies() runs
    them), and its peak RSS."""
    from explain.analysis import knn_affinity, laplacian_eigenvalues
    from explain.analysis.clustering import embed_2d, pooled_features, spray

    maps, truth = planted_maps(items)
    times = {}
    start = time.perf_counter()
    features = pooled_features(maps, 32)
    times["pool and normalise"] = time.perf_counter() - start
    start = time.perf_counter()
    affinity = knn_affinity(features, 10)
    times["(affinity alone)"] = time.perf_counter() - start
    start = time.perf_counter()
    laplacian_eigenvalues(affinity, 18)  # as spray() asks: 2 (max_clusters + 1)
    times["(eigenvalues alone)"] = time.perf_counter() - start
    start = time.perf_counter()
    found = spray(features, embedding="spectral")
    times["spray: affinity, eigenvalues, embedding, k-means"] = time.perf_counter() - start
    start = time.perf_counter()
    embed_2d(found.coordinates, embedding, 0)
    times[f"2-D embedding ({embedding})"] = time.perf_counter() - start
    times["end to end"] = sum(value for key, value in times.items() if not key.startswith("("))
    purity, recall = found.purity(truth == 2)
    return {
        "seconds": times,
        "clusters": found.n_clusters,
        "purity": purity,
        "recall": recall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def craft_round(model_name: str, images: int, concepts: int, designs: int, layer: str | None = None) -> dict:
    """CRAFT timed whole, and its baseline: the crops' forward passes and the NMF."""
    import torch.nn.functional as F
    from sklearn.decomposition import NMF

    from explain.concepts import CRAFT, crop_boxes
    from explain.data import SHORTCUT_CLASS, load_shortcut_model, shortcut_dataset
    from explain.methods import LayerReplay

    data = shortcut_dataset(4 * images, seed=1)
    inputs = data.inputs[data.labels == SHORTCUT_CLASS]
    if model_name == "shortcut":
        model, layer = load_shortcut_model(), layer or "block3"
    else:
        import explain

        model, _, _ = explain.models.load(model_name)
        inputs, layer = F.interpolate(inputs, size=224, mode="bilinear"), layer or "bn2"
    craft = CRAFT(model, layer, concepts=concepts, designs=designs)
    times = {}
    start = time.perf_counter()
    found = craft(inputs, SHORTCUT_CLASS)
    times["CRAFT"] = time.perf_counter() - start
    size = round(0.5 * inputs.shape[-1])
    activations = []
    hook = model.get_submodule(layer).register_forward_hook(lambda m, a, out: activations.append(out.mean((2, 3))))
    start = time.perf_counter()  # cutting the crops counts: CRAFT cuts them too
    boxes = crop_boxes(*inputs.shape[2:], size, "grid", torch.Generator())
    crops = torch.cat([
        F.interpolate(image[None, :, t : t + h, x : x + w], size=inputs.shape[2:], mode="bilinear", antialias=True)
        for image in inputs for t, x, h, w in boxes.tolist()
    ])
    with torch.no_grad():
        for batch in crops.split(64):
            model(batch)
    times["forward passes of the crops"] = time.perf_counter() - start
    hook.remove()
    start = time.perf_counter()
    NMF(concepts, init="nndsvda", max_iter=1000, random_state=0).fit(torch.cat(activations).numpy())
    times["NMF"] = time.perf_counter() - start
    times["ratio"] = times["CRAFT"] / (times["forward passes of the crops"] + times["NMF"])
    return {
        "seconds": times,
        "crops": len(crops),
        "images": len(inputs),
        "layer": layer,
        "affine tail": LayerReplay(model, layer).affine,
        "affine start": LayerReplay(model, layer).affine_start() is not None,
        "top importance": float(found.importances[0]),
    }


def run_craft(args) -> None:
    rounds = [
        craft_round(args.craft_model, args.images, args.concepts, args.designs, args.craft_layer)
        for _ in range(args.repeats)
    ]
    tail = (
        "affine: k + 1 replays an image"
        if rounds[0]["affine tail"]
        else "affine at their start: k + 1 runs of it an image, the rest a mask"
        if rounds[0]["affine start"]
        else "not affine: a replay a mask"
    )
    print(f"CRAFT on {rounds[0]['images']} images, {rounds[0]['crops']} crops ({args.craft_model} at "
          f"{rounds[0]['layer']}, the layers after it {tail}; "
          f"{args.concepts} concepts, {args.designs} designs, {torch.get_num_threads()} threads), "
          f"medians of {args.repeats} rounds:")
    for step in rounds[0]["seconds"]:
        median = statistics.median(r["seconds"][step] for r in rounds)
        print(f"  {step:<42} {median:8.2f}" + ("" if step == "ratio" else " s"))
    FIGURES.append({"craft": args.craft_model, "layer": rounds[0]["layer"], "designs": args.designs, "rounds": rounds})


def tcav_inputs(model_name: str):
    """The model, the layer, the class's images, the concept's (the mark alone) and the
    random pool, and the size of a random set."""
    import torch.nn.functional as F

    from explain.data import SHORTCUT_CLASS, load_shortcut_model, mark_images, shortcut_dataset

    data = shortcut_dataset(48, seed=1)
    concept = mark_images(16, seed=5).inputs  # the mark alone, on plain colours
    classes, pool, size = data.inputs[data.labels == SHORTCUT_CLASS], shortcut_dataset(320, seed=7).inputs, 16
    if model_name == "shortcut":
        return load_shortcut_model(), "block3", classes, concept, pool, size
    import explain

    model, _, _ = explain.models.load(model_name)
    big = [F.interpolate(x, size=224, mode="bilinear") for x in (classes[:8], concept[:8], pool[:40])]
    return model, "blocks.3", *big, 8


def tcav_round(model_name: str, random_sets: int) -> dict:
    """TCAV timed whole, and its baseline: the images' forward passes, the class images'
    backward to the layer and the classifiers' fits."""
    from explain.concepts import TCAV, draw_random_sets
    from explain.concepts.tcav_results import fit_cav
    from explain.data import SHORTCUT_CLASS

    model, layer, classes, concept, pool, size = tcav_inputs(model_name)
    times = {}
    start = time.perf_counter()
    result = TCAV(model, layer, min_random_sets=random_sets)(
        {SHORTCUT_CLASS: classes}, {"mark": concept}, pool, random_sets=random_sets, random_size=size
    )
    times["TCAV"] = time.perf_counter() - start
    module = model.get_submodule(layer)
    found = []
    hook = module.register_forward_hook(lambda m, a, out: found.append(out))
    flags = [p.requires_grad for p in model.parameters()]
    model.eval().requires_grad_(False)
    start = time.perf_counter()
    acts = []
    with torch.no_grad():
        for images in (concept, pool):
            parts = []
            for batch in images.split(32):
                model(batch)
                parts.append(found.pop().flatten(1))
            acts.append(torch.cat(parts))
    times["forward passes (concept, random)"] = time.perf_counter() - start
    hook.remove()

    def graph_from_layer(_module, _args, out):  # the graph starts at the layer, as LayerCapture's
        found.append(out.detach().requires_grad_())
        return found[-1]

    hook = module.register_forward_hook(graph_from_layer)
    start = time.perf_counter()
    for batch in classes.split(32):
        logits = model(batch)
        torch.autograd.grad(logits[:, SHORTCUT_CLASS].sum(), found.pop())
    times["class images forward + backward"] = time.perf_counter() - start
    hook.remove()
    for p, flag in zip(model.parameters(), flags, strict=True):
        p.requires_grad_(flag)
    draws = [acts[1][d] for d in draw_random_sets(len(pool), random_sets, size)]
    start = time.perf_counter()
    for i in range(random_sets):
        fit_cav(acts[0], draws[i], seed=i)
        fit_cav(draws[i], draws[(i + 1) % random_sets], seed=i)
    times["classifier fits"] = time.perf_counter() - start
    times["ratio"] = times["TCAV"] / sum(v for k, v in times.items() if k != "TCAV")
    score = result.get("mark")
    return {"seconds": times, "features": acts[0].shape[1], "score": score.mean, "p": score.corrected_p}


def run_tcav(args) -> None:
    tcav_round(args.tcav_model, args.random_sets)  # a round discarded: imports and first passes
    rounds = [tcav_round(args.tcav_model, args.random_sets) for _ in range(args.repeats)]
    print(
        f"TCAV ({args.tcav_model}, {args.random_sets} random sets, {rounds[0]['features']:,} features, "
        f"{torch.get_num_threads()} threads), medians of {args.repeats} rounds:"
    )
    for step in rounds[0]["seconds"]:
        median = statistics.median(r["seconds"][step] for r in rounds)
        print(f"  {step:<42} {median:8.2f}" + ("" if step == "ratio" else " s"))
    print(f"  mark score {rounds[0]['score']:.2f}, corrected p {rounds[0]['p']:.2g}")
    FIGURES.append({"tcav": args.tcav_model, "random_sets": args.random_sets, "rounds": rounds})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--embedding", default="auto", choices=("auto", "tsne", "umap", "spectral"))
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)  # one round, JSON out
    parser.add_argument("--craft", action="store_true", help="time CRAFT instead (see above)")
    parser.add_argument("--craft-model", default="shortcut", choices=("shortcut", "efficientnet_lite0"))
    parser.add_argument("--craft-layer", default=None, help="the layer (block3 or bn2 by default)")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--concepts", type=int, default=10)
    parser.add_argument("--designs", type=int, default=32)
    parser.add_argument("--tcav", action="store_true", help="time TCAV instead (see above)")
    parser.add_argument("--tcav-model", default="shortcut", choices=("shortcut", "efficientnet_lite0"))
    parser.add_argument("--random-sets", type=int, default=20)
    args = parser.parse_args()
    if args.tcav:
        run_tcav(args)
    elif args.craft:
        run_craft(args)
    elif args.round:
        print(json.dumps(one_round(args.items, args.embedding)))
        return
    else:
        run_spray(args)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(FIGURES, indent=1))


def run_spray(args) -> None:
    rounds = []
    for _ in range(args.repeats):
        command = [sys.executable, __file__, "--round", "--items", str(args.items), "--embedding", args.embedding]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"SpRAy on {args.items:,} maps of 64 x 64 ({platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads), medians of {args.repeats} rounds:")
    for step in rounds[0]["seconds"]:
        median = statistics.median(r["seconds"][step] for r in rounds)
        print(f"  {step:<42} {median:8.2f} s")
    rss = statistics.median(r["peak_rss_mb"] for r in rounds)
    print(f"  peak RSS {rss:,.0f} MB; clusters {rounds[0]['clusters']}, purity {rounds[0]['purity']:.3f}, "
          f"recall {rounds[0]['recall']:.3f}")
    FIGURES.append({"items": args.items, "embedding": args.embedding, "rounds": rounds})


if __name__ == "__main__":
    main()
