"""Zero-configuration coverage: every timm family and Hugging Face image classifier, explained
with no arguments (random weights; nothing is downloaded).

    .venv/bin/python benchmarks/bench_zoo_sweep.py [--registry timm|hf|all] [--results FILE]
        [--only NAME,...] [--limit N] [--timeout S]
    .venv/bin/python benchmarks/bench_zoo_sweep.py --report FILE [--before FILE]

One model per timm family (``timm.list_models()`` grouped by module and name with the sizes,
resolutions and patch sizes taken out: 343 families in timm 1.0.31; of each the one with the
fewest parameters, counted on the meta device), at its own default input size, or
``--max-size`` where that is larger (``img_size=`` where the model takes it; 256 by default,
96 for the tables of docs/benchmarks.md, which 2 shared CPU cores could afford); models
above 60 M parameters built with fewer blocks where the constructor takes
``depth``/``depths``. Every Hugging Face
image-classification architecture (``MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES``) from its
default config with at most two layers per stage (and ``image_size`` at most ``--max-size``), and the common backbones (DINOv2/v3,
SigLIP, CLIP, AIMv2, I-JEPA, Hiera, ConvNeXt, Swin, ResNet) explained for a
``SimilarityTarget`` of another image's embedding.

Weight matrices that a library initialises at zero (timm's MLP-Mixer and ResMLP heads,
torchvision's ViT head) are drawn from N(0, 0.02) first, and norm scales started at zero set
to one, so that the output depends on the input. Per model and method (Grad-CAM with no arguments; attention rollout, attention relevance
and LeGrad on models with attention) the outcome is one of:

- ``ok``: one map per image of the input's size, and not blank on both of two random
  batches (a blank map is allowed where the model's output does not depend on its input);
- ``n/a``: ``NotApplicable`` (the method's definition does not apply);
- ``refused``: a ``ValueError`` that names the argument to pass (``target_layer=``,
  ``reshape=``, ``readout=``, ``layout=``);
- ``error``: any other exception;
- ``wrong``: a map of the wrong shape or number, or blank on both batches while the output
  depends on the input (the defect the sweep is for: nothing says so).

Hygiene is checked after every call, failed or not: no hooks left, the same train/eval
flags, ``requires_grad`` flags and ``.grad`` (one parameter is given a ``.grad`` first),
and ``F.scaled_dot_product_attention`` put back. Results are appended to ``--results``
(JSON lines), one line per model, so an interrupted sweep resumes where it stopped; run it
in chunks with ``--only``/``--limit``, or in two processes on one file (the second with
``--reverse``: each skips what is done when it starts, so they meet in the middle once). ``--report`` prints the tables (``--before`` adds
the columns of an earlier run, e.g. of the code before a change). At ``--max-size 96`` the
whole sweep takes about two hours on 2 busy CPU cores.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import signal
import sys
import time
import traceback
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

METHODS = ("gradcam", "attention-rollout", "attention-relevance", "legrad")
OUTCOMES = ("ok", "n/a", "refused", "error", "wrong")
#: Global self-attention over the same tokens in every layer: where the attention methods
#: must work (timm modules, Hugging Face model types).
GLOBAL_TIMM = {"vision_transformer", "vision_transformer_relpos", "deit", "beit", "eva", "vision_transformer_hybrid"}
GLOBAL_HF = {
    "vit", "deit", "beit", "data2vec-vision", "dinov2", "dinov2_with_registers", "ijepa", "siglip", "siglip2",
    "clip", "metaclip_2", "vit_msn", "dinov3_vit", "siglip_vision_model", "clip_vision_model", "aimv2_vision_model",
}
#: Windowed attention, where the attention methods must stay NotApplicable.
WINDOWED_TIMM = {"swin_transformer", "swin_transformer_v2", "swin_transformer_v2_cr", "maxxvit"}
WINDOWED_HF = {"swin", "swinv2", "donut-swin"}
BACKBONES = ("dinov2", "dinov3_vit", "dinov3_convnext", "siglip_vision_model", "clip_vision_model",
             "aimv2_vision_model", "ijepa", "hiera", "convnext", "swin", "resnet")
ARGUMENT = re.compile(r"pass (target_layer|reshape=|readout=|layout=|embedding=|a callable target)|target_layer=|pass reshape")

SIZES = set(
    "atto femto pico nano tiny small base medium large huge giant gigantic enormous xxs xs s m l xl xxl xxxl "
    "mini micro little wide so150m so400m so150m2 plus betwixt xtiny xxtiny mediumd".split()
)
DROP = re.compile(
    r"\d+|[a-z]|patch\d+|(\d+x)?\d+[a-z]{0,2}|[a-z]{1,4}\d+[a-z]*\d*|\d+(\.\d+)?x|[a-z]\d+pt\d+|\d+to\d+"
)


# --- the models --------------------------------------------------------------------------


def timm_family(name: str) -> str:
    """``module:stem`` of a timm model: its name without sizes, resolutions, patch sizes."""
    import timm.models._registry as registry

    tokens = name.split("_")
    if tokens[0] in ("tf", "legacy"):
        tokens = tokens[1:]
    kept = [re.sub(r"\d+[a-z]?$", "", tokens[0]) or tokens[0]]
    kept += [re.sub(r"\d+[a-z]?$", "", t) or t for t in tokens[1:] if t not in SIZES and not DROP.fullmatch(t)]
    return registry._model_to_module[name] + ":" + "_".join(kept)


def meta_params(name: str, **kwargs) -> int | None:
    import timm

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = timm.create_model(name, pretrained=False, **kwargs)
        return sum(p.numel() for p in model.parameters())
    except Exception:
        return None


def timm_cases(cache: str) -> list[dict]:
    """One case per timm family, the smallest model of each (cached in ``cache``)."""
    import timm

    if os.path.exists(cache):
        with open(cache) as file:
            return json.load(file)
    families = collections.defaultdict(list)
    for name in timm.list_models():
        if not name.startswith("test_"):
            families[timm_family(name)].append(name)
    cases = []
    for family, names in sorted(families.items()):
        sized = sorted(((meta_params(n) or math.inf), n) for n in names) if len(names) > 1 else [(0, names[0])]
        cases.append({"registry": "timm", "family": family, "model": sized[0][1], "members": len(names)})
        print(f"{family}: {sized[0][1]} of {len(names)}", file=sys.stderr)
    with open(cache, "w") as file:
        json.dump(cases, file, indent=1)
    return cases


def hf_cases() -> list[dict]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES as mapping

    cases = []
    for model_type, classes in mapping.items():
        for cls in (classes,) if isinstance(classes, str) else classes:
            cases.append({"registry": "hf", "family": model_type, "model": cls, "members": 1})
    for model_type in BACKBONES:
        cases.append({"registry": "hf", "family": model_type, "model": f"AutoModel:{model_type}", "members": 1})
    return cases


MAX_SIZE = [256]


def build_timm(case: dict):
    import timm

    name = case["model"]
    cfg = timm.get_pretrained_cfg(name)
    size = tuple((cfg.input_size if cfg is not None else (3, 224, 224))[-2:])
    kwargs: dict = {}
    if max(size) > MAX_SIZE[0]:
        if meta_params(name, img_size=MAX_SIZE[0]) is not None:
            kwargs["img_size"] = MAX_SIZE[0]
        size = (MAX_SIZE[0], MAX_SIZE[0])
    params = meta_params(name, **kwargs) or 0
    if params > 60e6:
        for shrink in ({"depth": 4}, {"depths": (1, 1, 1, 1)}, {"depths": (1, 1, 2, 1)}):
            smaller = meta_params(name, **kwargs, **shrink)
            if smaller is not None and smaller < params:
                kwargs.update(shrink)
                break
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    case["kwargs"] = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    channels = (cfg.input_size[0] if cfg is not None else 3) if not kwargs.get("in_chans") else kwargs["in_chans"]
    return model, (channels, *size), None


def small_config(config):
    """At most two layers per stage (the widths as they are)."""
    staged = isinstance(getattr(config, "depths", None), (list, tuple))  # num_hidden_layers counts its stages
    if not staged and isinstance(getattr(config, "num_hidden_layers", None), int) and config.num_hidden_layers > 2:
        config.num_hidden_layers = 2
    for key in ("depths", "num_layers_per_stage"):
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            setattr(config, key, type(value)(min(v, 2) for v in value))
    for sub in ("vision_config",):
        inner = getattr(config, sub, None)
        if inner is not None:
            small_config(inner)
    return config


def build_hf(case: dict):
    import transformers

    model_type = case["family"]
    config = small_config(transformers.AutoConfig.for_model(model_type))
    vision = getattr(config, "vision_config", config)
    if isinstance(getattr(vision, "image_size", None), int) and vision.image_size > MAX_SIZE[0]:
        vision.image_size = MAX_SIZE[0]  # position embeddings made for the smaller input
    if case["model"].startswith("AutoModel:"):
        model = transformers.AutoModel.from_config(config)
    else:
        model = getattr(transformers, case["model"])(config)
    model.eval()
    vision = getattr(config, "vision_config", config)
    size = getattr(vision, "image_size", None) or 224
    size = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    if max(size) > MAX_SIZE[0]:
        size = (MAX_SIZE[0], MAX_SIZE[0])
    channels = getattr(vision, "num_channels", 3) or 3
    embedder = case["model"].startswith("AutoModel:")
    return model, (channels, *size), embedder


# --- one model ---------------------------------------------------------------------------


def wake(model) -> int:
    """Draw the weight matrices a library starts at zero (classifier heads, layer-scale-like
    projections) from N(0, 0.02), and set norms' scales started at zero (a residual branch's
    last batch norm) to one: with them at zero the output ignores the input and every map is
    blank, which says nothing about the layer choice. Returns how many were changed."""
    drawn = 0
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if not parameter.is_floating_point() or parameter.any():
                    continue
                if parameter.dim() >= 2:
                    parameter.normal_(0, 0.02)
                elif name == "weight" and "Norm" in type(module).__name__:
                    parameter.fill_(1.0)
                else:
                    continue
                drawn += 1
    return drawn


def hooks(model) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        + len(getattr(m, "_backward_pre_hooks", {}))
        for m in model.modules()
    )


def state(model) -> tuple:
    return (
        hooks(model),
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
    )


def hygiene(before: tuple, after: tuple) -> list[str]:
    problems = []
    if after[0] != before[0]:
        problems.append(f"hooks {before[0]} -> {after[0]}")
    if after[1] != before[1]:
        problems.append("train/eval flags")
    if after[2] != before[2]:
        problems.append("requires_grad")
    if any((a is None) != (b is None) or (a is not None and not torch.equal(a, b)) for a, b in zip(before[3], after[3])):
        problems.append(".grad")
    if F.scaled_dot_product_attention is not torch._C._nn.scaled_dot_product_attention:
        problems.append("scaled_dot_product_attention left replaced")
    return problems


def output_vector(output) -> torch.Tensor:
    from explain.similarity import EMBEDDING_FIELDS

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) or hasattr(output, "keys"):
        for key in ("logits", *EMBEDDING_FIELDS, "last_hidden_state"):
            if key in output and output[key] is not None:
                return output[key]
    if isinstance(output, (tuple, list)):
        return output[0]
    raise TypeError(type(output).__name__)


def blank(explanation) -> bool:
    return bool((explanation.maps.flatten(1).amax(dim=1) == 0).all())


def run_method(method: str, model, batches, target_of, depends: bool) -> dict:
    import explain

    result: dict = {}
    started = time.perf_counter()
    maps_blank = []
    try:
        for images in batches:
            explainer = explain.explainer(method, model)
            res = explainer(images, target_of(images))
            n, _, height, width = images.shape
            if tuple(res.maps.shape) != (n, height, width):
                result = {"outcome": "wrong", "detail": f"maps {tuple(res.maps.shape)} for {n} images"}
                break
            if not torch.isfinite(res.maps).all():
                result = {"outcome": "wrong", "detail": "maps not finite"}
                break
            result = {"outcome": "ok", "layer": ",".join(res.layers)}
            maps_blank.append(blank(res))
            if not maps_blank[-1]:
                break
        if result.get("outcome") == "ok" and all(maps_blank) and depends:
            if method == "gradcam" and constant_layer(model, batches[0], target_of(batches[0])):
                result["detail"] = "blank: the layer's activations are the same at every position (random weights)"
            elif method == "gradcam" and (grid := negative_map(model, batches, target_of)):
                result["detail"] = (f"blank: the map before Grad-CAM's ReLU is negative at every position of "
                                    f"the layer's {grid} grid, for every image (random weights)")
            else:
                result = {"outcome": "wrong", "detail": "blank maps while the output depends on the input",
                          "layer": result.get("layer")}
    except explain.NotApplicable as error:
        result = {"outcome": "n/a", "detail": str(error)[:300]}
    except Exception as error:  # noqa: BLE001 - every failure is a finding
        kind = "refused" if isinstance(error, ValueError) and ARGUMENT.search(str(error)) else "error"
        result = {"outcome": kind, "detail": f"{type(error).__name__}: {str(error)[:300]}"}
        if kind == "error":
            result["where"] = traceback.format_exc().strip().splitlines()[-3][:200]
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def constant_layer(model, images, target) -> bool:
    """Whether the automatic layer's activations are the same at every position (to 1e-4 of
    their size): random weights that collapse the tokens (HF LeViT's, whose batch norms
    start at N(0, 0.02)) make a constant map, which is right, and blank once scaled."""
    import explain

    captured = explain.GradCAM(model).capture(images, target, gradients=False)
    activations = next(iter(captured.activations.values())).float()
    spread = activations.flatten(2).std(dim=2).amax()
    return bool(spread <= 1e-4 * activations.abs().amax().clamp_min(1e-30))


def negative_map(model, batches, target_of) -> str:
    """The automatic layer's grid (``"h x w"``) where Grad-CAM's map before its ReLU (Selvaraju
    et al., eq. 2) is below zero at every position for every image of ``batches``, else ``""``:
    then the blank map is the method's definition (no position adds evidence for the
    class), not a wrong layer. On a small grid of random weights this happens (timm's
    nasnetalarge and pit_xs_distilled_224 at 96 px: 3 x 3; both give maps at their own
    input sizes, 331 and 224 px)."""
    import explain

    cam = explain.GradCAM(model)
    for images in batches:
        captured = cam.capture(images, target_of(images))
        name = next(iter(captured.activations))
        before_relu = cam.layer_maps(captured, name)
        if before_relu.dim() != 4 or not bool((before_relu.flatten(1).amax(dim=1) < 0).all()):
            return ""
    return " x ".join(map(str, before_relu.shape[-2:]))


def has_attention(model) -> bool:
    return any(isinstance(m, torch.nn.MultiheadAttention) or "Attention" in type(m).__name__ for m in model.modules())


def built(case: dict):
    """The case's model, input shape and whether it is an embedder; at its own input size
    where it does not run at the smaller one."""
    build = build_timm if case["registry"] == "timm" else build_hf
    for attempt in range(2):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, shape, embedder = build(case)
            try:
                with torch.no_grad():
                    model(torch.randn(1, *shape))
                return model, shape, embedder
            except Exception:
                if attempt or MAX_SIZE[0] >= 100_000:
                    raise
                saved, MAX_SIZE[0] = MAX_SIZE[0], 100_000
                try:
                    return built(case)
                finally:
                    MAX_SIZE[0] = saved
    raise AssertionError("unreachable")


def sweep_one(case: dict, timeout: int) -> dict:
    import explain

    record = dict(case)
    started = time.perf_counter()

    def expire(signum, frame):
        raise TimeoutError(f"over {timeout} s")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(timeout)
    try:
        model, shape, embedder = built(case)
        zeroed = wake(model)
        if zeroed:
            record["zero_weights_drawn"] = zeroed
        record["input"] = list(shape)
        record["params"] = sum(p.numel() for p in model.parameters())
        generator = torch.Generator().manual_seed(1)
        batches = [torch.randn(2, *shape, generator=generator) for _ in range(2)]
        with torch.no_grad():
            outputs = [output_vector(model(b)).float() for b in batches]
        record["output"] = list(outputs[0].shape)
        depends = not torch.allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-5 * float(outputs[0].abs().max()) + 1e-7)
        record["depends"] = depends
        target_of = lambda images: None  # noqa: E731
        if embedder:
            reference = torch.randn(1, *shape, generator=generator)
            target_of = lambda images: explain.SimilarityTarget.of_image(model, reference)  # noqa: E731
        parameters = [p for p in model.parameters() if p.requires_grad]
        if parameters:
            parameters[0].grad = torch.full_like(parameters[0], 0.5)
        methods = ["gradcam"] + (list(METHODS[1:]) if has_attention(model) else [])
        record["methods"], record["hygiene"] = {}, []
        for method in methods:
            if embedder and method == "legrad":
                continue  # LeGrad explains class logits
            before = state(model)
            record["methods"][method] = run_method(method, model, batches, target_of, depends)
            record["hygiene"] += [f"{method}: {p}" for p in hygiene(before, state(model))]
    except Exception as error:  # noqa: BLE001
        record["skipped"] = f"{type(error).__name__}: {str(error)[:300]}"
    finally:
        signal.alarm(0)
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


# --- the report --------------------------------------------------------------------------


def load(path: str) -> dict:
    records = {}
    with open(path) as file:
        for line in file:
            if line.strip():
                record = json.loads(line)
                for result in record.get("methods", {}).values():  # as ARGUMENT reads them now
                    if result["outcome"] == "error" and result["detail"].startswith("ValueError"):
                        result["outcome"] = "refused" if ARGUMENT.search(result["detail"]) else "error"
                records[(record["registry"], record["model"])] = record
    return records


def expected_attention(record: dict) -> str:
    module = record["family"].split(":")[0]
    if record["registry"] == "timm":
        return "global" if module in GLOBAL_TIMM else "windowed" if module in WINDOWED_TIMM else ""
    return "global" if module in GLOBAL_HF else "windowed" if module in WINDOWED_HF else ""


def counts(records: dict, registry: str, method: str, subset=None) -> collections.Counter:
    counter: collections.Counter = collections.Counter()
    for record in records.values():
        if record["registry"] != registry or "skipped" in record or (subset and not subset(record)):
            continue
        outcome = record["methods"].get(method, {}).get("outcome")
        if outcome:
            counter[outcome] += 1
    return counter


def summary_rows(records: dict) -> list[tuple[str, str]]:
    rows = []
    for registry, label in (("timm", "timm families"), ("hf", "Hugging Face models")):
        ran = [r for r in records.values() if r["registry"] == registry and "skipped" not in r]
        depends = [r for r in ran if r.get("depends")]
        ok = [r for r in depends if r["methods"]["gradcam"]["outcome"] == "ok"]
        rows.append((f"{label}: Grad-CAM ok / output depends on input", f"{len(ok)} / {len(depends)}"))
        blank = [r["methods"]["gradcam"].get("detail", "") for r in ok]
        rows.append((f"{label}: of those, blank by Grad-CAM's ReLU / constant activations",
                     f"{sum('before Grad-CAM' in d for d in blank)} / {sum('same at every' in d for d in blank)}"))
        for method in METHODS:
            c = counts(records, registry, method)
            rows.append((f"{label}: {method}", " · ".join(f"{o} {c[o]}" for o in OUTCOMES if c[o])))
        for kind in ("global", "windowed"):
            for method in METHODS[1:]:
                c = counts(records, registry, method, lambda r, kind=kind: expected_attention(r) == kind)
                if sum(c.values()):
                    rows.append((f"{label}, {kind} attention: {method}",
                                 " · ".join(f"{o} {c[o]}" for o in OUTCOMES if c[o])))
        skipped = [r for r in records.values() if r["registry"] == registry and "skipped" in r]
        rows.append((f"{label}: not run (build or forward failed)", str(len(skipped))))
    problems = sum(len(r.get("hygiene", [])) for r in records.values())
    calls = sum(len(r.get("methods", {})) for r in records.values())
    rows.append(("hygiene problems / calls", f"{problems} / {calls}"))
    return rows


def report(after_path: str, before_path: str | None) -> None:
    after = load(after_path)
    before = load(before_path) if before_path else None
    if before is not None:  # the models both runs reached (a run cut short compares on those)
        common = set(after) & set(before)
        after = {key: after[key] for key in after if key in common}
        before = {key: before[key] for key in before if key in common}
        print(f"{len(common)} models in both runs\n")
        print("| | before | after |\n|---|---|---|")
        for (label, new), (_, old) in zip(summary_rows(after), summary_rows(before), strict=True):
            print(f"| {label} | {old} | {new} |")
    else:
        print("| | result |\n|---|---|")
        for label, value in summary_rows(after):
            print(f"| {label} | {value} |")
    print("\nNot ok (after), with the expected attention kind:\n")
    print("| model | family | method | outcome | detail |\n|---|---|---|---|---|")
    for record in sorted(after.values(), key=lambda r: (r["registry"], r["family"])):
        if "skipped" in record:
            print(f"| {record['model']} | {record['family']} | - | not run | {record['skipped'][:160]} |")
            continue
        for method, result in record["methods"].items():
            if result["outcome"] != "ok":
                detail = result.get("detail", "").replace("|", "/").replace("\n", " ")[:160]
                kind = expected_attention(record)
                print(f"| {record['model']} | {record['family']} {kind} | {method} | {result['outcome']} | {detail} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", choices=("timm", "hf", "all"), default="all")
    parser.add_argument("--results", default="zoo-sweep.jsonl")
    parser.add_argument("--cache", default=None, help="the timm families' chosen models (default: beside --results)")
    parser.add_argument("--only", default="", help="comma-separated model or family names")
    parser.add_argument("--limit", type=int, default=0, help="run at most this many new models")
    parser.add_argument("--reverse", action="store_true", help="run the cases from the last (a second worker)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-size", type=int, default=256,
                        help="inputs larger than this are made this size (img_size= where the model takes it)")
    parser.add_argument("--report", action="store_true", help="print the tables of --results")
    parser.add_argument("--before", default=None, help="an earlier results file, for the report's before column")
    args = parser.parse_args()
    if args.report:
        report(args.results, args.before)
        return
    torch.set_num_threads(args.threads)
    MAX_SIZE[0] = args.max_size
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    cache = args.cache or os.path.splitext(args.results)[0] + "-timm-models.json"
    cases = (timm_cases(cache) if args.registry in ("timm", "all") else []) + (
        hf_cases() if args.registry in ("hf", "all") else [])
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c["model"] in wanted or c["family"] in wanted]
    done = set(load(args.results)) if os.path.exists(args.results) else set()
    todo = [c for c in cases if (c["registry"], c["model"]) not in done][:: -1 if args.reverse else 1]
    if args.limit:
        todo = todo[: args.limit]
    print(f"{len(cases)} cases, {len(done)} done before, running {len(todo)}", file=sys.stderr)
    for case in todo:
        record = sweep_one(case, args.timeout)
        with open(args.results, "a") as file:
            file.write(json.dumps(record) + "\n")
        outcomes = {m: r["outcome"] for m, r in record.get("methods", {}).items()}
        print(f"{record['family']} {record['model']} {record.get('skipped') or outcomes} "
              f"{record['seconds']} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
