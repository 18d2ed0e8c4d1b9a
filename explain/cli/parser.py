"""The command line: its parser and ``main``, which hands each subcommand to its module.

Building the parser imports neither torch nor the models, so that ``--help``, usage errors and
``explain methods`` answer at once; a command's module is imported when it runs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from PIL import Image

from .. import __version__
from ..batch.guards import Terminated, terminated_as_interrupt
from ..batch.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OUT_OF_MEMORY, EXIT_TERMINATED, EXIT_USAGE
from ..errors import UsageError, first_line, is_out_of_memory
from ..options import BUNDLED_MODEL, LOCALISATION_METRICS, METRIC_NAMES, MODEL_FORMS, REDUCTIONS, STEP_METRICS, TASKS
from .common import non_negative_int, positive_int


def console_main() -> None:
    """The ``explain`` command: :func:`main`, then exit with its status. A run stopped by
    Ctrl-C (130) ends at once, without the interpreter's teardown of torch and its threads
    (about a second): its files are written and closed by then, the Ray engine's cluster shut
    down, and a user who pressed Ctrl-C waits for nothing else."""
    status = main()
    if status in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, function = args.handler.split(":")
    try:
        with terminated_as_interrupt():  # SIGTERM stops as Ctrl-C does, with status 143
            return getattr(importlib.import_module(f".{module}", __package__), function)(args)
    except UsageError as error:
        print(f"explain: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:  # before the first batch (loading the model, checking the methods)
        terminated = isinstance(interrupt, Terminated)
        print(f"\nexplain: {'terminated' if terminated else 'interrupted'} before any image was explained",
              file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader left (`explain layers MODEL --all | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as Python's docs advise
        return EXIT_FAILED
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        # Before the first batch: loading the model, checking the methods.
        print(f"explain: error: out of memory before any image was explained ({first_line(error)}); "
              "this is the device's limit, not a mistake in the options: free the device's memory, pick a smaller "
              "model or fewer methods, or pass --device cpu", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY


class DefaultsOnceFormatter(argparse.HelpFormatter):
    """Help that shows each option's default once: argparse's "(default: X)" where the default
    means something, not for None or a flag's False, nor where the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, [], argparse.SUPPRESS) and not action.required
        if shown and action.option_strings and "default:" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="explain",
        description="Explain PyTorch image classifiers with Grad-CAM-family heatmaps.",
    )
    parser.add_argument("--version", action="version", version=f"explain {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run_command(commands)
    _add_evaluate_command(commands)
    _add_concepts_command(commands)
    _add_strategies_command(commands)
    _add_listing_commands(commands)
    return parser


def _add_run_command(commands) -> None:
    run = commands.add_parser(
        "run", formatter_class=DefaultsOnceFormatter, help="write heatmap overlays for images, folders and lists",
        description="Write one heatmap overlay per image, method and target under --out, with "
        "manifest.jsonl and index.html. Re-running the same command skips finished outputs. "
        "Exit status: 0 all ok, 1 some inputs failed, 2 usage error, 3 out of memory (before the first image, "
        "or outputs that failed for it), 4 the output folder's disk refused a write (full, read-only), "
        "130 interrupted (Ctrl-C), 143 terminated (SIGTERM).",
    )
    _add_inputs_and_model(run)
    run.add_argument("--method", "-m", default="gradcam", dest="methods", metavar="METHOD",
                     help="method(s), comma-separated, or 'all'; see `explain methods`. KIND:METHOD (KIND smoothgrad, "
                     "smoothgrad-sq or vargrad) aggregates METHOD's maps of noisy copies, e.g. smoothgrad:ig")
    run.add_argument("--layer", default="auto",
                     help="target layer(s), comma-separated; see `explain layers MODEL`")
    _add_method_option(run)
    run.add_argument("--target", default="top1",
                     help="what to explain. classify: top1, a class id, a class name, topk:K for the K best, or "
                     "similar:IMAGE (the cosine similarity of each image's embedding, the model's (N, D) output, to "
                     "IMAGE's); "
                     "segment: top1 (the predicted class covering the most pixels, background aside) or a class id "
                     "or name, over its predicted mask; detect: top1 (the best box), box:I (the I-th box), a class "
                     "id or name (its boxes), score:T (boxes scoring at least T), or a class and score:T joined "
                     "by a comma")
    run.add_argument("--task", choices=TASKS, default=None,
                     help="what the model does: classify (a class per image), segment (a class per pixel: maps "
                     "explain a class over its region) or detect (boxes: maps explain a detected box, one output "
                     "per box) (default: inferred from the model)")
    _add_batch_size(run)
    _add_max_memory(run)
    run.add_argument("--eigen-smooth", action="store_true",
                     help="map by the first principal component of each method's per-channel terms "
                     "(CAMs that are a sum over channels)")
    run.add_argument("--aug-smooth", action="store_true",
                     help="average each map over flipped and rescaled copies of the image (6 passes)")
    run.add_argument("--reduction", choices=REDUCTIONS, default="abs-sum",
                     help="how attribution methods reduce the colour channels to one map; 'sum' keeps "
                     "the sign (shown with --signed-cmap)")
    run.add_argument("--cmap", default="jet", help="matplotlib colormap of the heatmap")
    run.add_argument("--signed-cmap", default="RdBu_r",
                     help="diverging matplotlib colormap of signed maps (--reduction sum)")
    run.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity, 0..1")
    run.add_argument("--save-maps", action="store_true",
                     help="also write each image's maps (scaled and raw) as .npz next to its overlays")
    run.add_argument("--workers", "-j", type=non_negative_int, default=None,
                     help="processes decoding images, and threads writing overlays (0: decode in the "
                     "main process, write from one thread) (default: on cuda up to 4; on cpu the "
                     "cores the model's threads leave free, up to 4)")
    run.add_argument("--overwrite", action="store_true", help="redo outputs that are already complete")
    _add_max_pixels(run)
    run.add_argument("--quiet", "-q", action="store_true",
                     help="no progress (bar or lines); errors and the summary line still print")
    run.add_argument("--metrics", default=None,
                     help="also score each map with these metrics (comma-separated; see `explain evaluate --help`): "
                     "values per row in the manifest, their summary in index.html")
    _add_step_option(run)
    run.set_defaults(handler="run:run_command")
    _add_explorer_options(run)
    _add_scaling_options(run)


def _add_explorer_options(run: argparse.ArgumentParser) -> None:
    """The files that come with each image (its segments, its label) and the explorer's options."""
    run.add_argument("--segments", default=None, metavar="DIR|model:NAME",
                     help="score these segments of each image instead of a window or superpixels, with the methods "
                     "that take segments (occlusion, lime, kernelshap, ablation, shapley-sampling, xrai): DIR holds a "
                     "mask file per image named by its stem, .npy (a label image (H, W) of integers, or masks "
                     "(K, H, W) of booleans, which may overlap) or .png (a label image), at the image's size (resized "
                     "and cropped as the image, nearest-neighbour) or the model input's; model:NAME[=WEIGHTS] takes "
                     "each class a segmentation model predicts as a segment. The manifest's segments column holds "
                     "each segment's score (--save-maps: the .npz too); an image without a usable mask file fails "
                     "those rows with the reason")
    run.add_argument("--labels", type=Path, default=None, metavar="FILE",
                     help="the images' true classes, a CSV of path,label lines (label: a class id or name); "
                     "each row then records whether the prediction is right, the summary counts the mistakes, "
                     "and index.html filters them")
    run.add_argument("--copy-originals", action="store_true",
                     help="copy a thumbnail of each input image into --out/originals/ for index.html, so that the "
                     "run folder can be moved or shared with its originals (by default index.html links the "
                     "input images relatively from --out: they show only where the inputs are found from there)")
    run.add_argument("--atlas", type=Path, default=None, metavar="DIR",
                     help="an `explain concepts atlas` output folder: index.html links each concept of --method crp "
                     "to its page in the atlas (DIR/index.html#LAYER:CHANNEL), relatively from --out")


#: --engine ray: what it does for each command that has it.
RAY_ENGINE = {
    "run": "a Ray Data pipeline (decode tasks, an actor pool that loads the model once per actor, writes from the "
           "workers), with the same outputs, manifest and resume",
    "evaluate": "a Ray Data pipeline (decode tasks, an actor pool that loads the model once per actor and scores "
                "the images; the scores written here as they come), with the same files and resume",
    "atlas": "a Ray Data pipeline (decode tasks, an actor pool that loads the model once per actor and probes the "
             "images; each shard's values merged into the running atlas here), with the same atlas and resume",
}


def _add_scaling_options(run: argparse.ArgumentParser, command: str = "run") -> None:
    scale = run.add_argument_group("scaling out (the `ray` extra: pip install 'explain-vision[ray]')")
    scale.add_argument("--engine", choices=("local", "ray"), default="local",
                       help=f"local: this process, with DataLoader workers; ray: {RAY_ENGINE[command]}")
    scale.add_argument("--address", default=None,
                       help="the Ray cluster to join (auto, ray://HEAD:10001, HEAD:6379); the inputs must be "
                       "readable from every node" + ("" if command != "run" else ", and --out be a folder every node "
                       "sees or a URI") + " (default: start a local Ray on this machine's cores)")
    scale.add_argument("--actors", type=positive_int, default=None,
                       help="the actors that work the images (default: one per GPU where the cluster has GPUs, else "
                       "one per node, each leaving a CPU to the read and decode tasks)")


def _add_evaluate_command(commands) -> None:
    scoring = commands.add_parser(
        "evaluate", formatter_class=DefaultsOnceFormatter, help="score methods with faithfulness and other metrics",
        description="Explain the images with each method and score the maps with each metric. Writes under --out: "
        "scores.csv (one row per image, method, target and metric column), failures.csv, curves.jsonl, "
        "summary.csv, summary.md and plots/*.png; prints the summary (mean ± std per method and metric, * marks "
        "the best). Re-running skips the scores already in scores.csv. Exit status: 0 all ok, 1 some images "
        "or metrics failed, 2 usage error, 3 out of memory before the first image, 130 interrupted (Ctrl-C), "
        "143 terminated (SIGTERM).",
    )
    _add_inputs_and_model(scoring, evaluate=True)
    scoring.add_argument("--methods", "--method", "-m", default="gradcam",
                          help="method(s), comma-separated, or 'all'; see `explain methods`. KIND:METHOD (KIND "
                          "smoothgrad, smoothgrad-sq or vargrad) aggregates METHOD's maps of noisy copies, e.g. "
                          "smoothgrad:ig")
    scoring.add_argument("--metrics", default="deletion,insertion",
                          help="metric(s), comma-separated, or 'all' (every metric; the localisation ones only "
                          "with --regions): " + ", ".join(METRIC_NAMES))
    scoring.add_argument("--layer", default="auto",
                          help="target layer(s), comma-separated; see `explain layers MODEL`")
    _add_method_option(scoring)
    scoring.add_argument("--target", default="top1",
                          help="class to explain: top1, a class id, a class name, or topk:K for the K best")
    _add_batch_size(scoring)
    _add_max_memory(scoring)
    _add_step_option(scoring)
    scoring.add_argument("--regions", type=Path, metavar="FILE",
                          help="where the objects are, for " + ", ".join(LOCALISATION_METRICS) + ": a CSV with the "
                          "header image,x0,y0,x1,y1 (boxes in pixels of the model input, after resizing and cropping; "
                          "image: file name, stem or path) or a folder of masks named by the images' stems")
    scoring.add_argument("--workers", "-j", type=non_negative_int, default=None,
                          help="processes decoding images (0: decode in the main process) (default: as for run)")
    scoring.add_argument("--overwrite", action="store_true", help="redo scores already in scores.csv")
    _add_max_pixels(scoring)
    _add_scaling_options(scoring, "evaluate")
    scoring.add_argument("--quiet", "-q", action="store_true",
                         help="no progress (bar or lines); errors and the summary still print")
    scoring.set_defaults(handler="evaluate:evaluate_command")


def _add_concepts_command(commands) -> None:
    concepts = commands.add_parser(
        "concepts", help="what a model's channels respond to: the concept atlas of a dataset, feature visualisation, "
        "the concepts a class uses (CRAFT), the concepts you name (TCAV)",
        description="Concepts of a layer (its channels): their atlas across a dataset (`explain concepts atlas "
        "--help`), their feature visualisation (`explain concepts visualize --help`), and the concepts a class "
        "uses, discovered in its images (`explain concepts craft --help`), and whether a class is sensitive to "
        "concepts named by their images (`explain concepts tcav --help`).",
    )
    subcommands = concepts.add_subparsers(dest="concepts_command", required=True, metavar="SUBCOMMAND")
    atlas = subcommands.add_parser(
        "atlas", formatter_class=DefaultsOnceFormatter,
        help="per channel of --layer, the images and regions it responds to most (RelMax, ActMax)",
        description="The concept atlas of the images at --layer (Relevance and Activation Maximization, "
        "Achtibat et al. 2023): per channel, the --top-n images in which it is most relevant for the predicted "
        "class (RelMax) and that activate it most (ActMax), with statistics. Writes under --out: atlas.pt (the "
        "running atlas, saved every few seconds: a rerun after Ctrl-C or kill -9 skips the images in it and "
        "ends with the atlas of one uninterrupted run), patches/LAYER/CHANNEL/{relmax,actmax}_RANK.png (the "
        "region of each reference image where the channel is relevant), concepts.json (per channel: reference "
        "images, boxes, values, classes, statistics) and failures.csv. Exit status: 0 all ok, 1 some images "
        "failed, 2 usage error, 3 out of memory before the first image, 4 the output folder's disk refused a "
        "write, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).",
    )
    atlas.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="image files, folders (searched recursively), glob patterns (quoted), "
                       "or @list.txt naming one input per line")
    atlas.add_argument("--out", "-o", required=True, type=Path, help="output folder")
    atlas.add_argument("--layer", required=True,
                       help="the layer(s) whose channels are the concepts, comma-separated; see `explain layers MODEL`")
    _add_model_options(atlas)
    atlas.add_argument("--top-n", "-n", type=positive_int, default=8,
                       help="reference images per channel and kind (RelMax, ActMax)")
    atlas.add_argument("--channels", default=None, metavar="LIST",
                       help="the channels whose patches and concepts.json entries are written, such as 0-15,31 "
                       "(default: all; the atlas keeps every channel, and a rerun with other --channels writes theirs)")
    atlas.add_argument("--top-k", type=positive_int, default=5,
                       help="an image's most relevant channels, counted in each channel's statistics")
    _add_batch_size(atlas)
    _add_max_memory(atlas)
    atlas.add_argument("--workers", "-j", type=non_negative_int, default=None,
                       help="processes decoding images (0: decode in the main process) (default: as for run)")
    _add_max_pixels(atlas)
    _add_scaling_options(atlas, "atlas")
    atlas.add_argument("--quiet", "-q", action="store_true",
                       help="no progress (bar or lines); errors and the summary still print")
    atlas.set_defaults(handler="concepts:atlas_command")
    _add_visualize_command(subcommands)
    _add_craft_command(subcommands)
    _add_tcav_command(subcommands)


def _add_tcav_command(subcommands) -> None:
    tcav = subcommands.add_parser(
        "tcav", formatter_class=DefaultsOnceFormatter,
        help="whether a class is sensitive to concepts you name by their images (TCAV), significant or not",
        description="TCAV (Kim et al., ICML 2018) of the class --class on the images of FOLDER: for each --concept "
        "NAME=FOLDER and --layer, CAVs (a linear classifier's normal) of the concept's activations against each "
        "random set's and of random sets against each other (the null), the share of the class's images whose "
        "logit grows along each CAV (the TCAV score), and a t-test of the scores against the null, "
        "Bonferroni-corrected for concepts x layers: significant or not. --random given several times: each "
        "folder a random set; given once: --random-sets sets of --random-size images drawn from it with --seed. "
        "Writes --out (default: FOLDER-tcav beside FOLDER), replacing it whole: tcav.csv (one row per concept x "
        "layer: score mean and spread, the null's mean, p-value, corrected p-value, significant, direction, CAV "
        "accuracy) and tcav.json (all of it, each random set's score included); each folder's activations are "
        "cached under --cache (default: OUT-cache beside --out), so a rerun with other concepts or layers "
        "computes only what is new. Exit status: 0 done, 2 usage error.",
    )
    tcav.add_argument("folder", metavar="FOLDER", help="a folder of the class's images (searched recursively)")
    tcav.add_argument("--class", required=True, dest="class_name", metavar="C",
                      help="the class: a name of the model's classes or an id")
    tcav.add_argument("--concept", required=True, action="append", metavar="NAME=FOLDER",
                      help="a concept and the folder of its images (repeat for several)")
    tcav.add_argument("--random", required=True, action="append", metavar="FOLDER",
                      help="a folder of random images: repeat for one folder per random set, or give one to "
                      "draw --random-sets sets from it")
    tcav.add_argument("--layer", required=True, action="append", metavar="L",
                      help="a layer where the concepts are looked for (repeat, or comma-separated, for several; "
                      "`explain layers MODEL`)")
    tcav.add_argument("--random-sets", type=positive_int, default=20,
                      help="random sets drawn from a single --random folder")
    tcav.add_argument("--random-size", type=positive_int, default=None,
                      help="images per drawn random set (default: the largest concept's, fewer than the folder's)")
    tcav.add_argument("--min-random-sets", type=positive_int, default=10,
                      help="the fewest random sets the test accepts (at least 2)")
    tcav.add_argument("--alpha", type=float, default=0.05, help="the test's level, for the corrected p-value")
    tcav.add_argument("--alternative", choices=("two-sided", "greater", "less"), default="two-sided",
                      help="the t-test's alternative: two-sided (the paper's: up or down), greater (the concept "
                      "turns the logit up)")
    tcav.add_argument("--out", "-o", type=Path, default=None, help="output folder (default: FOLDER-tcav)")
    tcav.add_argument("--cache", type=Path, default=None,
                      help="the folder of the cached activations (default: OUT-cache beside --out)")
    _add_model_options(tcav)
    tcav.add_argument("--batch-size", "-b", type=positive_int, default=32, help="images per forward pass")
    tcav.add_argument("--seed", type=int, default=0, help="seed of the classifiers, their splits and the draws")
    tcav.set_defaults(handler="tcav:tcav_command")


def _add_craft_command(subcommands) -> None:
    craft = subcommands.add_parser(
        "craft", formatter_class=DefaultsOnceFormatter,
        help="the concepts a class uses, discovered in a folder of its images (CRAFT)",
        description="CRAFT (Fel et al., CVPR 2023) on the images of FOLDER, all of the class --class: crops of "
        "each image resized to the model's input, their activations at --layer factorized by NMF into --concepts "
        "concepts, each concept ranked by its total-order Sobol index for the class's logit, its best crops "
        "and its maps on a few images. Writes --out (default: FOLDER-craft beside FOLDER), replacing it whole: "
        "craft.json (class, layer, settings, NMF error; per concept, most important first: importance, its "
        "spread over the images, best crops with image, box and coefficient), craft.csv (one row per concept), "
        "crops/cJ_R.png (concept J's R-th best crop), maps/IMAGE__cJ.png and index.html (the concepts ranked by "
        "importance with their crops and maps, opened from file://). Exit status: 0 done, 2 usage error.",
    )
    craft.add_argument("folder", metavar="FOLDER", help="a folder of the class's images (searched recursively)")
    craft.add_argument("--class", required=True, dest="class_name", metavar="C",
                       help="the class: a name of the model's classes or an id")
    craft.add_argument("--out", "-o", type=Path, default=None, help="output folder (default: FOLDER-craft)")
    craft.add_argument("--layer", default=None,
                       help="the layer factorized, after a ReLU (default: Grad-CAM's; see `explain layers MODEL`)")
    _add_model_options(craft)
    craft.add_argument("--concepts", "-k", type=positive_int, default=10, help="the number of concepts")
    craft.add_argument("--crops", default="grid",
                       help="'grid' (crops spanning each image, the step 80%% of their side) or a number of random "
                       "crops per image")
    craft.add_argument("--crop-size", default="0.5",
                       help="the crops' side: pixels (such as 96, at least 8) or a share of the image's side "
                       "(a number with a point: 0.5, or 1.0 for the whole image)")
    craft.add_argument("--positions", choices=("mean", "all"), default="mean",
                       help="a crop's activations averaged over its positions (the paper's), or each position a row")
    craft.add_argument("--relu", action="store_true",
                       help="factorize the positive part of a layer whose output is signed (a transformer's block)")
    craft.add_argument("--designs", type=positive_int, default=32,
                       help="quasi-Monte-Carlo designs per concept for the Sobol indices")
    craft.add_argument("--best", type=positive_int, default=10, help="best crops written per concept")
    craft.add_argument("--maps", type=non_negative_int, default=4, help="images whose concept maps are written")
    craft.add_argument("--batch-size", "-b", type=positive_int, default=64, help="crops, or images, per forward pass")
    craft.add_argument("--seed", type=int, default=0, help="seed of the random crops, the NMF and the Sobol sequence")
    craft.set_defaults(handler="craft:craft_command")


def _add_visualize_command(subcommands) -> None:
    visualize = subcommands.add_parser(
        "visualize", formatter_class=DefaultsOnceFormatter,
        help="an image of what each concept responds to, with no data (feature visualisation)",
        description="The feature visualisation of each CONCEPT of MODEL: an image optimised to activate it "
        "(Olah et al. 2017's decorrelated Fourier image with transformation robustness, or MaCo, Fel et al. "
        "2023, which stays readable on deep CNNs and vision transformers), the model left as it was. Writes "
        "under --out: LAYER/CCCC.png per channel (CCCC_yY_xX.png a neuron, direction_NAME.png a direction) and "
        "visualizations.json (per concept: the file, the "
        "objective at the first and last step and on the whole image, the settings). Concepts of a layer are "
        "optimised --batch-size at a time and written as each group ends; a rerun skips the concepts written "
        "with the same settings. Exit status: 0 all written, 2 usage error, 3 out of memory, 4 the output "
        "folder's disk refused a write, 130 interrupted (Ctrl-C: the running group stops at once, those "
        "written are kept), 143 terminated (SIGTERM).",
    )
    visualize.add_argument("model", metavar="MODEL", help=MODEL_FORMS)
    visualize.add_argument("concepts", nargs="+", metavar="LAYER:CHANNEL",
                           help="what to visualise: LAYER:CHANNEL (a channel's mean activation), channels and "
                           "ranges such as blocks.5:0-7,12, LAYER:CHANNEL@Y,X (one neuron of the layer's grid) or "
                           "LAYER:FILE.npy (a direction: one weight per channel); see `explain layers MODEL`")
    visualize.add_argument("--out", "-o", required=True, type=Path, help="output folder")
    _add_model_options(visualize, with_model=False)
    visualize.add_argument("--parameterization", "-p", choices=("fourier", "maco"), default="fourier",
                           help="fourier: the decorrelated Fourier image (lucid's), robust to jitter, scale and "
                           "rotation; maco: the phase under a fixed natural spectrum, on random crops")
    visualize.add_argument("--steps", type=positive_int, default=256, help="steps of gradient ascent")
    visualize.add_argument("--size", type=positive_int, default=None,
                           help="the image's side in pixels (default: the model's input for fourier, 512/224 of "
                           "it for maco, whose crops are resized to the input)")
    visualize.add_argument("--views", type=positive_int, default=None,
                           help="transformed views (fourier) or random crops (maco) of each image per step, in "
                           "one batch (default: 8 for fourier, 32 for maco)")
    visualize.add_argument("--lr", type=float, default=None,
                           help="the optimiser's step (default: Adam's 0.05 for fourier, NAdam's 1.0 for maco)")
    visualize.add_argument("--seed", type=int, default=0, help="the seed of the initial image and the views")
    visualize.add_argument("--batch-size", "-b", type=positive_int, default=None,
                           help="concepts of a layer optimised together (default: 1 on the CPU, where a batch "
                           "saves nothing and Ctrl-C loses less; 8 on a GPU)")
    visualize.add_argument("--overwrite", action="store_true", help="redo concepts already written")
    visualize.add_argument("--quiet", "-q", action="store_true",
                           help="no progress bar; errors and the summary still print")
    visualize.set_defaults(handler="concepts:visualize_command")


def _add_strategies_command(commands) -> None:
    spray = commands.add_parser(
        "strategies", formatter_class=DefaultsOnceFormatter,
        help="the strategies of each class across a finished run: clusters of its maps (SpRAy)",
        description="Spectral Relevance Analysis (SpRAy, Lapuschkin et al. 2019) of a finished `explain run "
        "--save-maps` folder: per class explained, its maps sum-pooled to --grid and normalised, clustered by "
        "spectral clustering on a nearest-neighbour graph (the number of clusters by the eigengap, or "
        "--clusters), and placed in 2-D (--embedding). A --method crp run is clustered on its concepts' "
        "relevances (which concepts, not where). Writes under RUN_DIR/strategies (or --out), replacing it "
        "whole: strategies.csv (one row per image and target: input, method, target, class, cluster, x, y, "
        "distance), strategies.json (per class: eigenvalues, clusters with size, prototype, nearest images, "
        "mean probability, share of mistakes with --labels) and prototypes/CLASS__cN.png; then shows them in "
        "RUN_DIR/index.html (RUN_DIR/index-data/strategies.js: a cluster filter and sort, and a strategies view "
        "per class), which later runs into RUN_DIR keep (flagged stale where the run changed). Exit status: 0 "
        "written, 2 usage error (nothing written).",
    )
    spray.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of a finished `explain run --save-maps`")
    spray.add_argument("--out", "-o", type=Path, default=None, help="output folder (default: RUN_DIR/strategies)")
    spray.add_argument("--classes", default=None,
                       help="the classes to analyse, names or ids, comma-separated (default: every class explained)")
    spray.add_argument("--method", "-m", default=None,
                       help="the run's method whose maps are clustered (default: the run's only method)")
    spray.add_argument("--features", choices=("auto", "maps", "concepts"), default="auto",
                       help="what is clustered: maps (where the relevance lies) or concepts (a crp run's concept "
                       "relevances); auto: concepts for crp, maps otherwise")
    spray.add_argument("--clusters", default="auto",
                       help="the number of clusters per class, or auto: where the eigengap of the graph's "
                       "Laplacian is largest")
    spray.add_argument("--max-clusters", type=positive_int, default=8, help="the most clusters auto picks")
    spray.add_argument("--neighbors", type=positive_int, default=10,
                       help="neighbours per item in the affinity graph (at most a quarter of a class's items)")
    spray.add_argument("--grid", type=positive_int, default=32, help="the side of the grid the maps are pooled to")
    spray.add_argument("--embedding", choices=("auto", "tsne", "umap", "spectral"), default="auto",
                       help="the 2-D picture's coordinates: t-SNE, UMAP (where the umap package is installed; "
                       "t-SNE otherwise), the spectral embedding's first two axes, or auto: t-SNE up to 5000 "
                       "items of a class (its cost grows past the clustering's), spectral beyond")
    spray.add_argument("--seed", type=int, default=0, help="the seed of k-means and the 2-D embedding")
    spray.set_defaults(handler="strategies:strategies_command")


def _add_listing_commands(commands) -> None:
    listing = commands.add_parser("methods", help="list the explanation methods",
                                  description="List the registered methods with their family, their cost "
                                  "per image and target, whether they explain through a --layer, and a "
                                  "one-line description.")
    listing.set_defaults(handler="listing:methods_command")

    layers = commands.add_parser(
        "layers", formatter_class=DefaultsOnceFormatter, help="a model's target layers, sizes and cost",
        description="Print a summary of the model (parameters, multiply-adds, the layer picked when --layer is "
        "auto) and its main candidate target layers (spatial outputs; '*' marks the automatic choice). --all "
        "prints every layer in execution order with its output shape, parameters and multiply-adds (measured "
        "with forward hooks on one image, see explain.summary), then every candidate target layer.",
    )
    layers.add_argument("model", metavar="MODEL", help=MODEL_FORMS)
    layers.add_argument("--all", action="store_true", help="the full per-layer table and every candidate layer")
    _add_model_options(layers, with_model=False)
    layers.set_defaults(handler="listing:layers_command")

    samples = commands.add_parser(
        "samples", help="the folder of the sample photos installed with explain",
        description="Print the folder that holds the sample photos installed with the package "
        "(explain.data.sample_folder()), an input for a first run from any folder: "
        'explain run "$(explain samples)" --out out',
    )
    samples.set_defaults(handler="listing:samples_command")


def _add_inputs_and_model(parser: argparse.ArgumentParser, evaluate: bool = False) -> None:
    """The images, the output folder and the model: what ``run`` and ``evaluate`` both take."""
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="image files, folders (searched recursively), glob patterns (quoted), "
                        "or @list.txt naming one input per line")
    parser.add_argument("--out", "-o", required=True, type=Path if evaluate else str,
                        help="output folder" + ("" if evaluate else "; with --engine ray also a URI of a folder on any "
                                               "filesystem pyarrow reaches (s3://bucket/run, gs://..., file:///...)"))
    _add_model_options(parser)


def _add_method_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method-option", "-M", action="append", default=[], dest="method_options",
                        metavar="METHOD:KEY=VALUE",
                        help="a keyword option of one method's class, repeatable, e.g. -M ig:n_steps=32 "
                        "-M lrp:composite=epsilon-plus-flat -M layer-ig:neuron=3,2,2 -M rise:n_masks=2000 "
                        "-M smoothgrad:ig:n_samples=10. The entry is cut at its first '=' and at the last ':' "
                        "before it; METHOD is one of --method's; VALUE is a Python literal where it is one (3,2,2 a "
                        "tuple; true, false, none in any case), else a string. target_layer, eigen_smooth, "
                        "aug_smooth and reduction are not among them: --layer and explain run's flags of those names "
                        "set them for all the methods")


def _add_batch_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", "-b", type=positive_int, default=16,
                        help="images explained together on the device; a batch that runs out of device memory is "
                        "redone in halves")


def _add_max_memory(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-memory", metavar="SIZE", default=None,
                        help="memory the extra passes of a method or metric (Score-CAM's masked copies, IG's steps, "
                        "...) may take at once, such as 2GB or 512MiB: their inner batches are sized to fit it "
                        "(default: half the memory available on the device)")


def _add_max_pixels(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-pixels", type=non_negative_int, default=None,
                        help="refuse images with more pixels as decompression bombs (0: no limit) "
                        f"(default: Pillow's limit, {Image.MAX_IMAGE_PIXELS})")


def _add_model_options(parser: argparse.ArgumentParser, with_model: bool = True) -> None:
    if with_model:
        parser.add_argument("--model", default=BUNDLED_MODEL, help=MODEL_FORMS)
    parser.add_argument("--weights", help="state-dict file (.safetensors, or loaded weights_only) for a torchvision "
                        "or timm model name, or DEFAULT for torchvision's own weights, the one choice that downloads "
                        "(default: none: such a name gets random weights, with a warning)")
    parser.add_argument("--trust-model-file", action="store_true",
                        help="allow loading a pickled nn.Module, which runs code from the file")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")


def _add_step_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=positive_int, default=None,
                        help="pixels removed or inserted per step by " + ", ".join(STEP_METRICS) + " (fewer steps "
                        "run faster) (default: each metric's own: one row of the image for deletion, insertion and "
                        "non-sensitivity, 1 %% of it for pixel-flipping)")
