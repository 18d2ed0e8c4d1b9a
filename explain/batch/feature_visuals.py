"""``explain concepts visualize``: the data-free feature visualisation of concepts (channels,
neurons, directions of a layer) by :func:`explain.concepts.visualize`, written as one PNG per
concept and ``visualizations.json`` (per concept: its file, the objective it reached, the
settings), both under ``--out``.

The concepts of a layer are optimised ``--batch-size`` at a time, in groups cut from the
command's list of concepts in its order (so the same command makes the same groups, and the
same seeded images, whether it ran through or was stopped and run again). A group's images
are written as it ends; a rerun with the same settings skips the groups whose images are all
written (``--overwrite`` redoes them). The first Ctrl-C (or SIGTERM) stops the running group
at the model's next layer (:class:`~explain.batch.guards.StopFlag`, through the passes'
listener), the model left as it was; the groups finished before are on disk."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..concepts import FeatureVisualization, check_objectives, visualize
from ..drawing import normalization_of
from ..errors import Option, UsageError, first_line, is_out_of_memory
from ..models import LoadedModel, load_model, warn_if_random
from ..pass_listener import PassListener
from ..passes import StopRequested, pass_settings
from ..report import atomic_write, remove_temp_files
from .concept_files import png_bytes, visual_file
from .guards import StopFlag, sole_run
from .manifest import safe_name
from .options import ConceptSpec, VisualizeOptions, parse_concept
from .outcome import EXIT_OK, EXIT_OUT_OF_MEMORY, EXIT_OUTPUT_DEVICE, exit_code
from .storage import OutputDeviceError, device_errors, out_folder

#: Per concept: its image's file, the objective it reached and the settings it was made with.
VISUALS_FILE = "visualizations.json"
#: The ``format`` entry of ``visualizations.json``.
VISUALS_FORMAT = "explain.concepts.visualize-files/1"


@dataclass(frozen=True)
class PlannedConcept:
    """One concept to visualise: its ``key`` in visualizations.json (``LAYER:CHANNEL``,
    ``LAYER:CHANNEL@Y,X``, ``LAYER:FILE.npy``), its layer, the objective
    :func:`~explain.concepts.visualize` takes and its image's file under ``--out``."""

    key: str
    layer: str
    objective: object
    file: str


def _direction(spec: ConceptSpec) -> torch.Tensor:
    path = Path(spec.direction or "")
    try:
        values = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"{spec.text}: cannot read the direction {path} ({first_line(error)})") from None
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.number):
        raise UsageError(
            f"{spec.text}: a direction is a 1-D array of numbers, one per channel; {path} holds "
            f"{values.dtype} of shape {values.shape}"
        )
    return torch.from_numpy(values.astype(np.float32))


def _expand(spec: ConceptSpec) -> list[PlannedConcept]:
    """The concepts one ``LAYER:WHAT`` names."""
    folder = safe_name(spec.layer)
    if spec.direction is not None:
        name = f"direction_{safe_name(Path(spec.direction).stem)}.png"
        return [PlannedConcept(f"{spec.layer}:{spec.direction}", spec.layer, _direction(spec), f"{folder}/{name}")]
    if spec.position is not None:
        (channel,), (y, x) = spec.channels, spec.position
        key, name = f"{spec.layer}:{channel}@{y},{x}", f"{channel:04d}_y{y}_x{x}.png"
        return [PlannedConcept(key, spec.layer, (channel, y, x), f"{folder}/{name}")]
    return [PlannedConcept(f"{spec.layer}:{c}", spec.layer, c, visual_file(spec.layer, c)) for c in spec.channels]


def plan_concepts(options: VisualizeOptions, loaded: LoadedModel, normalization) -> list[PlannedConcept]:
    """The concepts ``options.concepts`` name, in order without repeats, each checked against
    the model (its layer, channel, neuron or direction: a :class:`UsageError` naming the fix)."""
    planned: dict[str, PlannedConcept] = {}
    hint = f"see `explain layers {options.model} --all` for the layers and their output shapes"
    for text in options.concepts:
        try:
            spec = parse_concept(text)
        except ValueError as error:
            raise UsageError(f"concept {text!r}: {error}") from None
        concepts = _expand(spec)
        try:
            grid = check_objectives(
                loaded.model,
                spec.layer,
                [c.objective for c in concepts],
                input_size=tuple(loaded.example.shape[-2:]),
                normalization=normalization,
            )
        except (ValueError, TypeError, KeyError) as error:
            message = first_line(error)
            raise UsageError(
                f"concept {text}: {message}" + ("" if "explain layers" in message else f"; {hint}")
            ) from None
        if grid[1] * grid[2] == 0:
            raise UsageError(f"concept {text}: {spec.layer}'s output has no grid to read a concept on; {hint}")
        files = {c.file: c.key for c in planned.values()}
        for concept in concepts:
            if concept.key not in planned and files.get(concept.file, concept.key) != concept.key:
                raise UsageError(
                    f"concept {text}: its image would be {concept.file}, as {files[concept.file]}'s is; "
                    "give the direction files different names"
                )
        planned.update((c.key, c) for c in concepts if c.key not in planned)
    return list(planned.values())


def groups_of(concepts: list[PlannedConcept], size: int) -> list[list[PlannedConcept]]:
    """``concepts`` by layer (in the order the layers first come), ``size`` at a time."""
    layers: dict[str, list[PlannedConcept]] = {}
    for concept in concepts:
        layers.setdefault(concept.layer, []).append(concept)
    return [members[i : i + size] for members in layers.values() for i in range(0, len(members), size)]


def read_written(out_dir: Path) -> dict:
    """The concepts ``visualizations.json`` under ``out_dir`` lists (none where there is none)."""
    path = out_dir / VISUALS_FILE
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(
            f"cannot read {path} ({first_line(error)}); remove it, or pass another ", Option("out")
        ) from None
    if not isinstance(document, dict) or document.get("format") != VISUALS_FORMAT:
        raise UsageError(f"{path} is not of `explain concepts visualize`; pass another ", Option("out"))
    return dict(document.get("concepts", {}))


class StepListener(PassListener):
    """What :func:`~explain.concepts.visualize`'s passes tell the command: the steps done move
    the bar (``rows`` views per step), the first Ctrl-C stops the call at the model's next layer."""

    asked_at_layers = True

    def __init__(self, bar: tqdm, stop: StopFlag, rows: int):
        self.bar, self.stop, self.rows, self.start = bar, stop, rows, bar.n

    def advanced(self, method: str, done: int, total: int) -> None:
        self.bar.n = self.start + done // self.rows
        self.bar.refresh()

    def should_stop(self) -> bool:
        return self.stop.set


class VisualizeRun:
    """One ``explain concepts visualize``: the groups to do, each optimised and written."""

    def __init__(self, options: VisualizeOptions, loaded: LoadedModel, out_dir: Path):
        self.options, self.loaded, self.out_dir = options, loaded, out_dir
        mean, std = _normalization(loaded)
        self.normalization = None if mean is None or std is None else (mean, std)
        height, width = loaded.example.shape[-2:]
        self.input_size = (int(height), int(width))
        batch = options.batch_size or (1 if loaded.device.type == "cpu" else 8)
        self.settings = {
            "model": options.model,
            "weights": options.weights or "",
            "parameterization": options.parameterization,
            "steps": options.steps,
            "size": options.size,
            "views": options.views,
            "lr": options.lr,
            "seed": options.seed,
            "batch_size": batch,
            "input_size": list(self.input_size),
            "normalization": None if self.normalization is None else [list(v) for v in self.normalization],
            "device": loaded.device.type,
        }
        self.concepts = plan_concepts(options, loaded, self.normalization)
        self.written = read_written(out_dir)
        groups = groups_of(self.concepts, batch)
        self.todo = [group for group in groups if options.overwrite or not all(map(self.current, group))]
        self.skipped = len(self.concepts) - sum(map(len, self.todo))
        self.made = 0

    def current(self, concept: PlannedConcept) -> bool:
        """Whether ``concept``'s image is written, with this run's settings."""
        entry = self.written.get(concept.key) or {}
        return entry.get("settings") == self.settings and (self.out_dir / concept.file).is_file()

    def optimise(self, group: list[PlannedConcept], bar: tqdm, stop: StopFlag) -> FeatureVisualization:
        options = self.options
        views = options.views or (8 if options.parameterization == "fourier" else 32)
        bar.set_description(f"{group[0].layer} {', '.join(c.key.partition(':')[2] for c in group)}"[:40])
        with pass_settings(listener=StepListener(bar, stop, len(group) * views), progress=False):
            return visualize(
                self.loaded.model,
                group[0].layer,
                [c.objective for c in group],
                method=options.parameterization,
                size=options.size,
                input_size=self.input_size,
                steps=options.steps,
                views=views,
                lr=options.lr,
                normalization=self.normalization,
                seed=options.seed,
            )

    def write(self, group: list[PlannedConcept], result: FeatureVisualization) -> None:
        """The group's images, then visualizations.json naming them."""
        images = result.images.clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
        with device_errors(self.out_dir):
            for k, concept in enumerate(group):
                (self.out_dir / concept.file).parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.out_dir / concept.file, png_bytes(images[k]))
                self.written[concept.key] = {
                    "layer": concept.layer,
                    "objective": result.labels[k],
                    "file": concept.file,
                    "size": list(images.shape[-2:]),
                    "value": float(result.values[k]),
                    "first_step": float(result.history[0, k]),
                    "last_step": float(result.history[-1, k]),
                    "settings": self.settings,
                }
            document = {"format": VISUALS_FORMAT, "concepts": dict(sorted(self.written.items()))}
            atomic_write(self.out_dir / VISUALS_FILE, (json.dumps(document, indent=1) + "\n").encode())
        self.made += len(group)

    def run(self) -> int:
        """Every group to do, optimised and written; the exit status."""
        status = EXIT_OK
        bar = tqdm(
            total=self.options.steps * len(self.todo),
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=self.options.quiet or not self.todo,
        )
        with StopFlag("the running group of concepts stops at the model's next layer; those written are kept") as stop:
            try:
                for done, group in enumerate(self.todo, 1):
                    self.write(group, self.optimise(group, bar, stop))
                    bar.n = done * self.options.steps
                    bar.refresh()
            except (StopRequested, KeyboardInterrupt):
                status = exit_code(0, True, terminated=stop.terminated)
            except OutputDeviceError as error:
                print(f"explain: error: {error}", file=sys.stderr)
                status = EXIT_OUTPUT_DEVICE
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                print(
                    f"explain: error: out of memory ({first_line(error)}): pass a smaller --batch-size, "
                    "--views or --size, or --device cpu",
                    file=sys.stderr,
                )
                status = EXIT_OUT_OF_MEMORY
            finally:
                bar.close()
        print(self.summary(status))
        return status

    def summary(self, status: int) -> str:
        left = len(self.concepts) - self.made - self.skipped
        stopped = "interrupted, run the same command again to finish; " if left and status else ""
        return (
            f"explain: {stopped}{self.made} concepts visualised now, {self.skipped} skipped (already written), "
            f"{left} left; see {self.out_dir / VISUALS_FILE}"
        )


def _normalization(loaded: LoadedModel) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """The (mean, std) the model's preprocessing normalises with (None, None where it says none)."""
    try:
        return normalization_of(loaded.preprocess)
    except ValueError:
        return None, None


def run_visualize(options: VisualizeOptions) -> int:
    """``explain concepts visualize``: the images of ``options.concepts`` under ``options.out``;
    the exit status."""
    out_dir = out_folder(options.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with sole_run(out_dir, "concepts visualize"):  # a second run on the folder is refused before the model loads
        loaded = load_model(options.model, options.weights, options.trust_model_file, options.device)
        if loaded.kind != "images":
            raise UsageError(f"explain concepts visualize takes image models; {options.model} takes {loaded.kind}")
        job = VisualizeRun(options, loaded, out_dir)
        warn_if_random(loaded, options.model)
        remove_temp_files(out_dir)
        return job.run()
