"""Cost of each metric in explain.metrics against the bare model passes it needs, and against
Quantus on the same work, in one run.

    .venv/bin/python benchmarks/bench_metrics.py [--repeats 3] [--slow-repeats 1] [--step 896]
        [--batch-size N] [--layers 0] [--smooth-samples 50] [--only TEXT,TEXT] [--no-quantus] [--device cpu]
        [--images 8]

Setting: torchvision resnet18 with random weights (seed 0, eval mode), 8 images at 224x224
(the 4 photos of data/images, resized to 256, centre-cropped to 224, ImageNet-normalised,
and their horizontal flips), maps from ``explain.GradCAM(model, "layer4")`` for each
image's top class. torch uses as many threads as the process has cores.

Per metric, these calls run round-robin and the median is taken:

- ours: the metric's call in ``explain.metrics``, everything included (rankings, masks,
  imputation, SLIC, similarity measures, Python loops);
- bare: exactly the model passes that call makes, replayed on the very tensors it made them
  on. Our call runs once beforehand (untimed: it is also its warm-up) through a wrapper that
  keeps a copy of every batch it gives the model (or every (images, targets) it gives the
  explainer); bare then runs ``model(batch)`` on each under ``torch.inference_mode`` (or
  ``GradCAM(images, targets)`` on each, for the metrics that explain again).
  ``ours / bare`` is the metric's own overhead; the goal is at most 1.2;
- Quantus 0.6.0 on the same work, where it has the metric (skipped when quantus is not
  installed; for the information curves, PAIR's ``saliency.metrics.pic``), with the
  workarounds for numpy 2.4 (``np.trapz``) and 3-channel inputs that the notes of each row
  give. ``Quantus / ours`` >= 1 means ours is not slower. For ARCC, pytorch-grad-cam's
  (where installed, the ``peers`` extra) is timed beside and reported in the notes; for
  MST-C, a Quantus that has ``MSTC`` (HEAD, after 0.6.0).

Cheap metrics: one more warm-up each, median of ``--repeats`` rounds. Costly ones (the
perturbation curves, ROAD, IROF, randomisation): ``--slow-repeats`` rounds. Other work on the
same cores moves the times (see OMP_WAIT_POLICY below); the ratios compare calls made side
by side, and single rounds of the costly metrics are the noisiest.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# Spinning OpenMP threads (libgomp's default) slow torch down by 5-20x when other processes
# share the cores, far more for small operations than for large ones; sleeping threads do not.
# Set before torch loads; OMP_WAIT_POLICY=ACTIVE in the environment restores the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import torchvision.transforms as T  # noqa: E402
from PIL import Image  # noqa: E402

import explain  # noqa: E402
from bench_gradcam import interleaved_medians  # noqa: E402
from explain import metrics  # noqa: E402
from explain.superpixels import superpixels  # noqa: E402
from explain.metrics.randomisation import randomisable_layers  # noqa: E402

try:
    import quantus
except ImportError:  # the Quantus columns are left empty
    quantus = None


class RecordingModel(torch.nn.Module):
    """The model, keeping a copy of every batch it is given: what the bare passes replay."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.batches: list[torch.Tensor] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.batches.append(inputs.detach().clone())
        return self.model(inputs)


class RecordingExplainer:
    """The explainer, keeping a copy of every (images, targets) it is asked to explain."""

    def __init__(self, explainer):
        self.explainer = explainer
        self.model = explainer.model
        self.calls: list[tuple] = []

    def __call__(self, images, targets=None, **options):
        self.calls.append((images.detach().clone(), targets.clone() if isinstance(targets, torch.Tensor) else targets))
        return self.explainer(images, targets, **options)


@dataclass
class Case:
    name: str
    #: ``run(model)`` or ``run(explainer)``: our metric's call.
    run: object
    #: What ``run`` takes: "model", "explainer" or "none" (the map alone).
    needs: str
    quantus: object | None = None
    slow: bool = False
    #: The times are divided by these before Quantus / ours (a per-layer comparison).
    quantus_per: float = 1.0
    ours_per: float = 1.0
    notes: list[str] = field(default_factory=list)
    #: For IROF: SLIC alone, timed beside the others.
    slic: object | None = None
    work: str = "none"
    #: The metric runs the model itself too (besides the explainer): bare replays those
    #: forward passes as well (the explainer's model is wrapped in a RecordingModel).
    forwards: bool = False
    #: Other peers timed beside ours (name -> call), reported in the notes.
    others: dict = field(default_factory=dict)


def load_images(device: str, size: int = 224) -> torch.Tensor:
    preprocess = T.Compose([T.Resize(size * 256 // 224), T.CenterCrop(size), T.ToTensor(),
                            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    photos = sorted(p for p in (Path(__file__).parents[1] / "data" / "images").iterdir() if p.suffix in (".png", ".jpg"))
    x = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in photos])
    return torch.cat([x, x.flip(-1)]).to(device)


def build_cases(args, model, x, explanation, cam) -> list[Case]:
    m, height, width = explanation.maps.shape
    pixels = height * width
    ids = explanation.targets

    # Quantus inputs, converted outside the timings.
    xq = x.cpu().numpy()
    yq = ids.cpu().numpy()
    aq = explanation.maps[:, None].cpu().numpy()
    regions = torch.zeros(m, height, width, dtype=torch.bool, device=x.device)
    regions[:, height // 4: 3 * height // 4, width // 4: 3 * width // 4] = True
    sq = regions[:, None].float().cpu().numpy()

    def gradcam_numpy(model, inputs, targets, **kwargs):
        """Our GradCAM as Quantus's explain_func (it passes the raw, possibly randomised, model)."""
        maps = explain.GradCAM(model, "layer4")(torch.from_numpy(np.asarray(inputs)).to(x.device),
                                                torch.as_tensor(np.asarray(targets)).long().to(x.device)).maps
        maps = maps[:, None].cpu().numpy()
        if not maps.any():  # Quantus rejects a batch of all-zero maps (a randomised layer can give them)
            maps[0, 0, 0, 0] = 1e-6
        return maps

    def q(metric, **call):
        if quantus is None or metric is None:
            return None

        def run():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return metric(x_batch=xq, y_batch=yq, device=args.device, **call)
        return run

    bs = {} if args.batch_size is None else {"batch_size": args.batch_size}

    def want(name: str) -> bool:
        return any(part in name for part in args.only.split(","))

    cases = []
    # --- faithfulness: model passes over perturbed images ------------------------------------
    for name, fn in (("deletion", metrics.deletion), ("insertion", metrics.insertion)):
        if want(name):
            cases.append(Case(name, lambda net, fn=fn: fn(net, x, explanation, step=args.step, **bs), "model", slow=True,
                              notes=[f"{name}: step={args.step} pixels ({math.ceil(pixels / args.step) + 1} points "
                                     "per curve); Quantus has no deletion/insertion AUC."]))
    if want("average_drop"):
        cases.append(Case("average_drop", lambda net: metrics.average_drop(net, x, explanation, **bs), "model",
                          notes=["average_drop: Quantus has no Average Drop."]))
    if want("road"):
        percentages = (10, 20, 30, 40, 50, 60, 70, 80, 90)
        road_q = None
        if quantus is not None:
            from quantus.functions.perturb_func import noisy_linear_imputation

            def per_pixel(arr, indices, **kwargs):  # the 3-channel workaround of the notes
                return noisy_linear_imputation(arr=arr, indices=np.unique(indices % (arr.shape[1] * arr.shape[2])),
                                               **kwargs)
            # Quantus ranks the map broadcast to C*H*W: its top 3p % of H*W entries are the top p % of pixels.
            road = quantus.ROAD(percentages=[3 * p for p in percentages], noise=0.01, perturb_func=per_pixel)
            morf, lerf = q(road, model=model, a_batch=aq), q(road, model=model, a_batch=aq.max() - aq)
            road_q = (lambda: (morf(), lerf()))
        cases.append(Case("road", lambda net: metrics.road(net, x, explanation, percentages=percentages, **bs), "model",
                          road_q, slow=True, notes=[
                              "road: ours computes MoRF and LeRF at 10..90 % (9 x 2 curves, one imputation per "
                              "forward); Quantus (MoRF only) is called twice, on the map and on max - map for LeRF, "
                              "with percentages 3p and the indices taken modulo H*W (its 3-channel crash workaround), "
                              "so it imputes the same p % of pixels; both with noise 0.01. Quantus imputes one image "
                              "at a time with scipy's spsolve."]))
    if want("pixel_flipping"):
        # Quantus's features_in_step must divide H*W (50176 = 2^10 * 7^2 at 224), which no
        # multiple of 3 does: no step flips whole pixels. 3 * H*W / 96 values per step gives it
        # 96 steps; ours flips ceil(H*W / 96) pixels (all channels) per step: 96 steps as well,
        # plus the intact image.
        step = math.ceil(pixels / 96)
        fis = 3 * pixels // 96
        flip_q = quantus.PixelFlipping(features_in_step=fis, perturb_baseline=0.0) if quantus else None
        cases.append(Case("pixel_flipping", lambda net: metrics.pixel_flipping(net, x, explanation, step=step, **bs), "model",
                          q(flip_q, model=model, a_batch=aq), slow=True,
                          notes=[f"pixel_flipping: ours step={step} pixels (all channels, 96 steps + the intact "
                                 f"image); Quantus features_in_step={fis} values ({3 * pixels // fis} steps): it must "
                                 f"divide H*W={pixels}, which no multiple of 3 does, so Quantus cannot flip whole "
                                 "pixels here; both replace with 0."]))
    if want("region_perturbation"):
        region_q = quantus.RegionPerturbation(patch_size=9, regions_evaluation=100) if quantus else None
        cases.append(Case("region_perturbation",
                          lambda net: metrics.region_perturbation(net, x, explanation, patch_size=9, regions=100, **bs),
                          "model", q(region_q, model=model, a_batch=aq), slow=True,
                          notes=["region_perturbation: 9 x 9 patches, 100 regions, both; ours replaces with uniform "
                                 "noise (the paper's), Quantus with the image minimum (its default)."]))
    if want("irof"):
        count = int(superpixels(x, 100).max()) + 1
        irof_q, q_count = None, None
        if quantus is not None:
            from quantus.functions.perturb_func import baseline_replacement_by_mask
            from skimage.segmentation import slic as sk_slic

            def bmask(arr, mask, **kwargs):  # the broadcast-mask workaround of the notes
                return baseline_replacement_by_mask(arr=arr, mask=np.broadcast_to(mask, arr.shape), **kwargs)
            irof_q = q(quantus.IROF(return_aggregate=False, perturb_func=bmask), model=model, a_batch=aq)
            q_count = max(len(np.unique(sk_slic(np.moveaxis(i, 0, -1).astype("double"), start_label=0))) for i in xq)
        cases.append(Case("irof", lambda net: metrics.irof(net, x, explanation, **bs), "model", irof_q, slow=True,
                          slic=lambda: superpixels(x, 100), notes=[
                              f"irof: SLIC with 100 segments, both; ours found at most {count} segments per image "
                              f"(1 + {count} forwards each)"
                              + (f", Quantus at most {q_count} (1 + {q_count}; its SLIC runs on the unscaled input)"
                                 if q_count else "") + "."]))

    # --- robustness and randomisation: they explain again ----------------------------------------
    if want("sensitivity"):
        n_samples = 10
        sens_q = quantus.MaxSensitivity(nr_samples=n_samples, lower_bound=0.2) if quantus else None
        cases.append(Case("sensitivity", lambda ex: metrics.sensitivity(ex, x, explanation, n_samples=n_samples, **bs),
                          "explainer", q(sens_q, model=model, a_batch=aq, explain_func=gradcam_numpy),
                          notes=["sensitivity: 10 samples, radius 0.2; ours returns max and average in one call; "
                                 "the Quantus column is MaxSensitivity alone (AvgSensitivity costs as much again). "
                                 "Quantus explains each sample's 8 noisy images as one batch; ours 8 at a time on the CPU (its default there)."]))
    if want("model_randomisation"):
        all_layers = randomisable_layers(model, x)[::-1]
        layers = all_layers if args.layers <= 0 else all_layers[:args.layers]
        restricted = len(layers) < len(all_layers)
        cases.append(Case("model_randomisation, every layer",
                          lambda ex: metrics.model_randomisation(ex, x, explanation, layers=layers, checkpoints=None,
                                                                 **bs),
                          "explainer",
                          q(quantus.MPRT() if quantus else None, model=model, a_batch=aq, explain_func=gradcam_numpy),
                          slow=True, quantus_per=len(all_layers) + 1 if restricted else 1.0,
                          ours_per=len(layers) if restricted else 1.0,
                          notes=[f"model_randomisation: ours randomises {len(layers)} of resnet18's "
                                 f"{len(all_layers)} layers, top down, explains again after each (checkpoints=None) "
                                 f"and scores Spearman and SSIM; Quantus's MPRT randomises all {len(all_layers)} and "
                                 f"explains the intact model once more ({len(all_layers) + 1} explanations), Spearman "
                                 "only" + ("; Quantus / ours compares the time per layer." if restricted else ".")
                                 + " The default (10 checkpoints) explains 10 times instead."]))
        cases.append(Case("model_randomisation, default", lambda ex: metrics.model_randomisation(ex, x, explanation, **bs),
                          "explainer"))
    if want("local_lipschitz"):
        lle_q = (quantus.LocalLipschitzEstimate(nr_samples=10, perturb_std=0.1, normalise=False)
                 if quantus else None)
        cases.append(Case("local_lipschitz_estimate",
                          lambda ex: metrics.local_lipschitz_estimate(ex, x, explanation, n_samples=10, **bs),
                          "explainer", q(lle_q, model=model, a_batch=aq, explain_func=gradcam_numpy),
                          notes=["local_lipschitz_estimate: 10 neighbours, ours uniform in the L-inf ball of 0.1, "
                                 "Quantus Gaussian of std 0.1 (its default noise; 10 samples instead of its 200), "
                                 "normalise=False (the paper's scale)."]))
    if want("continuity"):
        cont_q = quantus.Continuity(nr_steps=28, abs=False, normalise=False) if quantus else None
        cases.append(Case("continuity", lambda ex: metrics.continuity(ex, x, explanation, **bs), "explainer",
                          q(cont_q, model=model, a_batch=aq, explain_func=gradcam_numpy), slow=True,
                          notes=["continuity: 28 horizontal shifts of 16 px, both; ours leaves out the shift 0 "
                                 "(27 explanations per image), Quantus explains all 28 and the image once more."]))
    stabilities = (("relative_input_stability", metrics.relative_input_stability, "RelativeInputStability", {}),
                   ("relative_output_stability", metrics.relative_output_stability, "RelativeOutputStability", {}),
                   ("relative_representation_stability", metrics.relative_representation_stability,
                    "RelativeRepresentationStability", {"layer_names": ["layer4.1"]}))
    for name, fn, q_name, q_options in stabilities:
        if want(name):
            stab_q = getattr(quantus, q_name)(nr_samples=10, **q_options) if quantus else None
            cases.append(Case(name, lambda ex, fn=fn: fn(ex, x, explanation, n_samples=10, **bs), "explainer",
                              q(stab_q, model=model, a_batch=aq, explain_func=gradcam_numpy),
                              forwards=name == "relative_representation_stability",
                              notes=[f"{name}: 10 neighbours, both (ours uniform in [-0.1, 0.1], Quantus its "
                                     "default uniform [0.02, 0.2]); Quantus runs the model on the images and on "
                                     "every neighbour besides explaining them, to find changed classes"
                                     + ("; the representation is layer4's output in both (Quantus skips "
                                        "Sequential modules: it is given layer4.1, the same tensor; ours reads it "
                                        "with one forward per neighbour, which bare replays)."
                                        if "representation" in name else ".")]))
    if want("smooth_model_randomisation"):
        all_layers = randomisable_layers(model, x)
        layers = all_layers if args.layers <= 0 else all_layers[:args.layers]
        samples = args.smooth_samples
        smooth_q = None
        if quantus is not None:
            smprt = quantus.SmoothMPRT(nr_samples=samples, noise_magnitude=0.1)
            run_smprt = q(smprt, model=model, a_batch=aq, explain_func=gradcam_numpy)

            def gradcam_float32(model, inputs, targets, **kwargs):  # its noise is float64
                return gradcam_numpy(model, np.asarray(inputs, dtype=np.float32), targets)

            def smooth_q():  # Quantus's SmoothMPRT explains with quantus.explain: ours, as its explain_func
                explain_before, quantus.explain = quantus.explain, gradcam_float32
                try:
                    return run_smprt()
                finally:
                    quantus.explain = explain_before
        cases.append(Case("smooth_model_randomisation",
                          lambda ex: metrics.smooth_model_randomisation(ex, x, explanation, n_samples=samples,
                                                                        layers=layers, checkpoints=None, **bs),
                          "explainer", smooth_q, slow=True, quantus_per=len(all_layers) + 1,
                          ours_per=len(layers) + 1,
                          notes=[f"smooth_model_randomisation: {samples} noisy copies per map (the paper's 50 in "
                                 f"the default), bottom up; ours randomises {len(layers)} of {len(all_layers)} layers "
                                 f"and smooths the original too ({len(layers) + 1} smoothed explanations), Quantus "
                                 f"all {len(all_layers)} and the original ({len(all_layers) + 1}); Quantus / ours "
                                 "compares the time per smoothed explanation. Quantus calls quantus.explain, here "
                                 "replaced by the same Grad-CAM (its float64 noisy copies cast to float32)."]))
    if want("efficient_model_randomisation"):
        cases.append(Case("efficient_model_randomisation",
                          lambda ex: metrics.efficient_model_randomisation(ex, x, explanation, **bs), "explainer",
                          q(quantus.EfficientMPRT() if quantus else None, model=model, a_batch=aq,
                            explain_func=gradcam_numpy),
                          notes=["efficient_model_randomisation: every layer randomised, one explanation per image "
                                 "and the entropy of 100-bin histograms, both; Quantus explains the intact model "
                                 "again (2 explanations) and deep-copies the model."]))
    if want("random_logit"):
        cases.append(Case("random_logit", lambda ex: metrics.random_logit(ex, x, explanation, **bs), "explainer",
                          q(quantus.RandomLogit(num_classes=1000) if quantus else None, model=model, a_batch=aq,
                            explain_func=gradcam_numpy),
                          notes=["random_logit: ours scores 2-D SSIM and Spearman, Quantus 1-D SSIM on the flattened "
                                 "maps; both draw the other class as Quantus does (1000 classes)."]))

    cases += issue30_cases(args, model, x, explanation, q, want, bs)
    cases += issue44_cases(args, model, x, explanation, cam, q, want, bs, regions, gradcam_numpy)

    # --- no model pass ---------------------------------------------------------------------
    has = quantus is not None
    for name, ours, qmetric in (
        ("pointing_game", lambda: metrics.pointing_game(explanation, regions), None),
        ("pointing_game tolerance=0", lambda: metrics.pointing_game(explanation, regions, tolerance=0),
         has and quantus.PointingGame()),
        ("relevance_mass", lambda: metrics.relevance_mass(explanation, regions),
         has and quantus.RelevanceMassAccuracy()),
        ("relevance_rank", lambda: metrics.relevance_rank(explanation, regions),
         has and quantus.RelevanceRankAccuracy()),
        ("energy_pointing_game", lambda: metrics.energy_pointing_game(explanation, regions), None),
        ("top_k_intersection", lambda: metrics.top_k_intersection(explanation, regions),
         has and quantus.TopKIntersection(k=1000)),
        ("sparseness", lambda: metrics.sparseness(explanation), has and quantus.Sparseness()),
        ("complexity", lambda: metrics.complexity(explanation), has and quantus.Complexity()),
    ):
        if not want(name):
            continue
        call = {"model": None, "a_batch": aq}
        if "game" in name or "relevance" in name or "intersection" in name:
            call["s_batch"] = sq
        cases.append(Case(name, lambda _, ours=ours: ours(), "none", q(qmetric or None, **call)))
    for case in cases:
        if case.name == "pointing_game":
            case.notes.append("pointing_game: ours with the paper's 15-pixel tolerance (a disc dilation of the "
                              "region); Quantus has none, so it is compared with tolerance=0.")
    return cases


def issue30_cases(args, model, x, explanation, q, want, bs) -> list[Case]:
    """Infidelity, sensitivity-n, faithfulness correlation and estimate, monotonicity and its
    correlation, selectivity and the information curves (issue 30), with Quantus (PAIR for the
    information curves) set to the same number of model passes where it can be."""
    pixels = x.shape[-2] * x.shape[-1]
    aq = explanation.maps[:, None].cpu().numpy()
    has = quantus is not None
    cases = []

    def add(name, run, qmetric=None, note="", **call):
        if want(name):
            cases.append(Case(name, run, "model", q(qmetric or None, model=model, a_batch=aq, **call), slow=True,
                              notes=[f"{name}: {note}"] if note else []))

    add("selectivity", lambda net: metrics.selectivity(net, x, explanation, **bs),
        has and quantus.Selectivity(patch_size=16, perturb_baseline=0.0),
        "16 x 16 patches, both (1 + 196 forwards per image at 224 px); baseline 0; logits (Quantus: softmax=False).",
        softmax=False)
    add("infidelity", lambda net: metrics.infidelity(net, x, explanation, **bs),
        has and quantus.Infidelity(perturb_patch_sizes=[x.shape[-1]], n_perturb_samples=100),
        "100 random squares (1 + 100 forwards per image); Quantus 100 samples of one whole-image patch (its "
        "default, 10 samples of every 4 x 4 patch removed cumulatively, is 31 360 forwards per image at 224 px).")
    add("sensitivity_n", lambda net: metrics.sensitivity_n(net, x, explanation, **bs),
        has and len(x) > 1 and quantus.SensitivityN(features_in_step=3 * pixels // 192, n_max_percentage=1.0),
        "ours 10 subset sizes x 20 random subsets (1 + 200 forwards per image); Quantus removes the top "
        "features cumulatively, 192 steps, and correlates across the images (so needs 2 or more): not the same "
        "test, see the notes of tests/test_metrics_quantus.py.")
    add("faithfulness_correlation", lambda net: metrics.faithfulness_correlation(net, x, explanation, **bs),
        has and quantus.FaithfulnessCorrelation(nr_runs=100, subset_size=3 * 224, perturb_baseline=0.0),
        "100 random subsets of 224 pixels (Quantus: 672 channel values), 1 + 100 forwards per image.")
    step = math.ceil(pixels / 96)  # 96 groups: Quantus's features_in_step must divide H*W (see pixel_flipping)
    add("faithfulness_estimate", lambda net: metrics.faithfulness_estimate(net, x, explanation, step=step, **bs),
        has and quantus.FaithfulnessEstimate(features_in_step=3 * pixels // 96, perturb_baseline=0.0),
        f"96 groups of {step} pixels, both; probabilities (Quantus: softmax=True).", softmax=True)
    add("monotonicity", lambda net: metrics.monotonicity(net, x, explanation, step=step, **bs),
        has and quantus.Monotonicity(features_in_step=3 * pixels // 96, perturb_baseline=0.0, abs=False),
        "96 steps, both (Quantus 0.6 never puts the image's values back: the same passes, a flat curve).")
    group = math.ceil(pixels / 48)  # 48 groups, Quantus's 3 * H*W / 48 values dividing H*W
    add("monotonicity_correlation",
        lambda net: metrics.monotonicity_correlation(net, x, explanation, step=group, **bs),
        has and quantus.MonotonicityCorrelation(nr_samples=10, features_in_step=3 * pixels // 48),
        f"48 groups of {group} pixels x 10 noise draws, both (1 + 480 forwards per image).")
    if want("sic"):
        def ours(net):
            return metrics.pic(net, x, explanation, normalization=NORMALIZATION, **bs)

        cases.append(Case("sic (+ aic)", ours, "model", pair_pic(model, x, explanation), slow=True, notes=[
                              "sic: ours makes the 15 copies of each image once for both curves (one Delaunay "
                              "triangulation each, exact barycentric rasterisation, WebP size) and runs them in "
                              "batches; the PAIR column is the work of one compute_pic_metric call per image "
                              "(create_blurred_image: griddata per channel, estimate_image_entropy, one model "
                              "pass per copy), which SIC and AIC each make (so 2x this for both)."]))
    return cases


def gradcam_peer():
    """pytorch-grad-cam's metrics, where it is installed (the ``peers`` extra), else None."""
    try:
        from pytorch_grad_cam.metrics import arcc
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget
    except ImportError:
        return None
    return arcc, ClassifierOutputSoftmaxTarget


def issue44_cases(args, model, x, explanation, cam, q, want, bs, regions, gradcam_numpy) -> list[Case]:
    """The metrics of issue 44 (ARCC, the axioms, sufficiency, consistency, focus, AUC,
    attribution localisation, effective complexity, MST-C), against Quantus where it has the
    metric (MST-C: Quantus HEAD, where the installed Quantus has ``MSTC``) and
    pytorch-grad-cam's ARCC where it is installed."""
    aq = explanation.maps[:, None].cpu().numpy()
    sq = regions[:, None].float().cpu().numpy()
    has = quantus is not None
    cases = []

    if want("arcc"):
        peer = gradcam_peer()
        others = {}
        if peer is not None:
            gc_arcc, softmax_target = peer
            wanted = [softmax_target(int(t)) for t in explanation.targets]
            cams = explanation.maps.cpu().numpy()

            def base_method(input_tensor, targets):  # the same Grad-CAM as ours, as pytorch-grad-cam's base_method
                return cam(input_tensor, torch.tensor([t.category for t in targets], device=x.device)).maps.cpu().numpy()

            metric = gc_arcc.ARCC(base_method, road_percentiles=[20, 40, 60, 80])
            others["pytorch-grad-cam"] = lambda: metric(x, cams, wanted, model)
        cases.append(Case("arcc", lambda ex: metrics.arcc(ex, x, explanation, **bs), "explainer", slow=True,
                          forwards=True, others=others, notes=[
                              "arcc: 1 explanation of the masked image (coherency) + 8 forwards of imputed copies "
                              "(ROAD at 20..80 %, MoRF and LeRF) per image; the imputation is work the bare passes "
                              "do not do. pytorch-grad-cam's ARCC on the same maps, its base_method our Grad-CAM: "
                              "it imputes one image at a time with scipy's spsolve."]))
    if want("completeness"):
        cases.append(Case("completeness", lambda net: metrics.completeness(net, x, explanation, **bs), "model",
                          q(has and quantus.Completeness(perturb_baseline=0.0), model=model, a_batch=aq),
                          notes=["completeness: 2 forwards per image, both (Quantus replaces only the first H x W "
                                 "of the C x H x W values: the same passes)."]))
    if want("non_sensitivity"):
        cases.append(Case("non_sensitivity", lambda net: metrics.non_sensitivity(net, x, explanation, **bs), "model",
                          slow=True, notes=[
                              "non_sensitivity: the default, runs of 224 pixels (about 226 forwards per image); "
                              "Quantus 0.6 perturbs one input value per forward (150 528 per image at 224 px, "
                              "features_in_step above 1 fails there): not timed."]))
    if want("input_invariance"):
        cases.append(Case("input_invariance", lambda ex: metrics.input_invariance(ex, x, explanation, **bs),
                          "explainer", forwards=True, notes=[
                              "input_invariance: 1 explanation + 2 forwards per image, 2 forwards of the batch "
                              "to read the first layer's change; Quantus's InputInvariance sets the first "
                              "module's bias, which resnet18's conv1 lacks (bias=False): it fails, not timed."]))
    for name, fn, q_name in (("sufficiency", metrics.sufficiency, "Sufficiency"),
                             ("consistency", metrics.consistency, "Consistency")):
        if want(name):
            qm = getattr(quantus, q_name)() if has else None
            cases.append(Case(name, lambda net, fn=fn: fn(net, x, explanation, **bs), "model",
                              q(qm, model=model, a_batch=aq),
                              notes=[f"{name}: 1 forward per image (the predicted class) and the {len(x)} x "
                                     f"{len(x)} comparison of the maps, both."]))
    if want("focus"):
        labels = torch.arange(len(x), device=x.device) % (len(x) // 2)  # each photo and its mirror image
        focused = cam(x, labels)
        made, shows, _ = metrics.mosaics(x, labels, labels)
        focus_q = None
        if has:
            made_np, labels_np = made.cpu().numpy(), labels.cpu().numpy()
            flags = [list(map(bool, row)) for row in shows.cpu().numpy()]

            def focus_q(metric=quantus.Focus()):  # the same mosaics, explained by Quantus with our Grad-CAM
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return metric(model=model, x_batch=made_np, y_batch=labels_np, a_batch=None,
                                  explain_func=gradcam_numpy, device=args.device, custom_batch=flags)
        cases.append(Case("focus", lambda ex: metrics.focus(ex, x, focused, labels=labels, **bs), "explainer",
                          focus_q, notes=[
                              "focus: each photo's class shared with its mirror image, one mosaic per image "
                              "(built, then explained: 1 explanation per image); Quantus is given the same mosaics "
                              "and explains them with the same Grad-CAM."]))
    for name, ours, qmetric, call in (
        ("auc", lambda: metrics.auc(explanation, regions), has and quantus.AUC(), {"s_batch": sq}),
        ("attribution_localisation", lambda: metrics.attribution_localisation(explanation, regions, magnitude=True),
         has and quantus.AttributionLocalisation(), {"s_batch": sq}),
        ("effective_complexity", lambda: metrics.effective_complexity(explanation),
         has and quantus.EffectiveComplexity(), {}),
        ("mst_c", lambda: metrics.mst_c(explanation), has and getattr(quantus, "MSTC", lambda: None)(), {}),
    ):
        if want(name):
            note = {"mst_c": ["mst_c: per map on the CPU (scikit-learn's k-NN graph, SciPy's hull and spanning "
                              "tree), both; the Quantus column needs a Quantus with MSTC (HEAD, after 0.6.0)."]}
            cases.append(Case(name, lambda _, ours=ours: ours(), "none", q(qmetric or None, model=None, a_batch=aq,
                                                                           **call),
                              slow=name == "mst_c", notes=note.get(name, [])))
    return cases


#: The ImageNet normalisation of load_images.
NORMALIZATION = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def pair_pic(model, x, explanation):
    """The work of PAIR's compute_pic_metric for each image (without its early exits: a random
    model's images would be skipped before any copy is made)."""
    try:
        from saliency.metrics import pic
    except ImportError:
        return None
    from explain.metrics.faithfulness.information_curves import PIC_THRESHOLDS, eight_bit, random_pixels

    pixels = eight_bit(x, NORMALIZATION)
    maps = explanation.maps.cpu().numpy()
    mean, std = (torch.tensor(v, device=x.device).view(1, 3, 1, 1) for v in NORMALIZATION)

    def predict(batch):
        with torch.inference_mode():
            inputs = (torch.from_numpy(batch).to(x.device).permute(0, 3, 1, 2).float() / 255 - mean) / std
            return model(inputs).softmax(1)[:, 0].tolist()

    def run():
        for image, saliency in zip(pixels, maps, strict=True):
            mask = random_pixels(image, 0.01, 0)
            copies = [image, pic.create_blurred_image(image, mask)]
            for threshold in PIC_THRESHOLDS:
                revealed = saliency >= np.quantile(saliency, 1 - threshold)
                copies.append(pic.create_blurred_image(image, revealed | mask))
            for copy in copies:
                pic.estimate_image_entropy(copy)
                predict(copy[None])
    return run


def with_bare(case: Case, model, cam):
    """Run our metric once, recording what it passes to the model or the explainer (this
    is also its warm-up), and return the bare passes that replay exactly that."""
    if case.needs == "model":
        recording = RecordingModel(model)
        case.run(recording)
        batches = recording.batches
        case.work = f"{sum(len(b) for b in batches)} fw (batches of {'/'.join(sorted({str(len(b)) for b in batches}, key=int, reverse=True))})"

        def bare():
            with torch.inference_mode():
                for batch in batches:
                    model(batch)
        return bare
    if case.needs == "explainer":
        recording = RecordingExplainer(cam)
        if case.forwards:
            recording.model = RecordingModel(model)
        case.run(recording)
        calls = recording.calls
        forwards = recording.model.batches if case.forwards else []
        case.work = (f"{sum(len(i) for i, _ in calls)} explanations ({len(calls)} call{'s' * (len(calls) > 1)}, batches of "
                     f"{'/'.join(sorted({str(len(i)) for i, _ in calls}, key=int, reverse=True))})"
                     + (f" + {sum(len(b) for b in forwards)} fw" if forwards else ""))

        def bare():
            for images, targets in calls:
                cam(images, targets)
            with torch.inference_mode():
                for batch in forwards:
                    model(batch)
        return bare
    return None


def warm_up(model, x, cam, ids):
    from explain.metrics.imputation import noisy_linear_impute

    with torch.inference_mode():
        for b in (64, 8):
            model(x.repeat(8, 1, 1, 1)[:b])
    cam(x, ids)
    cam(x.repeat(8, 1, 1, 1), ids.repeat(8))
    superpixels(x[:1], 100)
    noisy_linear_impute(x[:2], torch.rand(len(x[:2]), *x.shape[-2:]) < 0.5, noise=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-repeats", type=int, default=1)
    parser.add_argument("--step", type=int, default=224 * 4, help="pixels per step of deletion and insertion")
    parser.add_argument("--layers", type=int, default=0, help="randomise only the top N layers (0: all 41)")
    parser.add_argument("--smooth-samples", type=int, default=50,
                        help="noisy copies per map of smooth_model_randomisation (the paper's 50)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch_size for every metric (default: each metric's own default)")
    parser.add_argument("--only", default="", help="run the metrics whose name contains one of these comma-separated texts")
    parser.add_argument("--no-quantus", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=224, help="image side (smaller only to try the script out)")
    parser.add_argument("--images", type=int, default=8, help="the first N of the 8 images (fewer for a short run)")
    args = parser.parse_args()
    global quantus
    if args.no_quantus:
        quantus = None
    if quantus is not None:
        np.trapz = np.trapezoid  # Quantus 0.6.0 calls np.trapz, gone in numpy 2.4
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(cores)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().to(args.device).eval()
    x = load_images(args.device, args.size)[: args.images]
    cam = explain.GradCAM(model, "layer4")
    explanation = cam(x)
    warm_up(model, x, cam, explanation.targets)
    started = time.perf_counter()
    rows = []
    for case in build_cases(args, model, x, explanation, cam):
        functions = {"ours": (lambda case=case: case.run(model if case.needs == "model" else cam))}
        bare = with_bare(case, model, cam)
        if bare is not None:
            functions["bare"] = bare
        if case.quantus is not None:
            functions["quantus"] = case.quantus
        if case.slic is not None:
            functions["slic"] = case.slic
        functions.update(case.others)
        medians = interleaved_medians(functions, args.slow_repeats if case.slow else args.repeats, warm_up=not case.slow)
        del bare, functions  # the recorded batches
        rows.append((case, medians))
        print(f"{case.name}: " + ", ".join(f"{k} {v:.3f} s" for k, v in medians.items())
              + f"  [{time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"Metrics on resnet18 (random weights), {len(x)} images at {args.size}x{args.size}, GradCAM maps, {args.device} ({device}), "
          f"torch {torch.__version__}" + (f", quantus {quantus.__version__}" if quantus else ", quantus not installed")
          + f"; batch_size {args.batch_size or 'default (8 on the CPU, 64 on a GPU)'}"
          + f"; median of {args.repeats} rounds ({args.slow_repeats} for the costly metrics)\n")
    print("| metric | forwards (+ explanations) | ours (s) | bare (s) | ours / bare | Quantus (s) | Quantus / ours |")
    print("|---|---|---|---|---|---|---|")
    for case, med in rows:
        ours = med["ours"]
        bare = med.get("bare")
        qt = med.get("quantus")
        ratio = f"**{ours / bare:.2f}**" if bare else "-"
        qratio = f"{(qt / case.quantus_per) / (ours / case.ours_per):.2f}" if qt else "-"
        print(f"| {case.name} | {case.work} | {ours:.3g} | {f'{bare:.3g}' if bare else '-'} | {ratio} | "
              f"{f'{qt:.3g}' if qt else '-'} | {qratio} |")
    print()
    for case, med in rows:
        for note in case.notes:
            print(f"- {note}")
        for peer in case.others:
            print(f"- {case.name}: {peer} {med[peer]:.3g} s, {med[peer] / med['ours']:.2f} x ours.")
        if "slic" in med:
            print(f"- irof: SLIC alone (8 images) {med['slic']:.2f} s, {100 * med['slic'] / med['ours']:.0f} % of ours; "
                  f"ours without it / bare = {(med['ours'] - med['slic']) / med['bare']:.2f}.")
    print(f"- total {time.perf_counter() - started:.0f} s for the timings.")


if __name__ == "__main__":
    main()
