import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

# Two test workers share the cores, and the CLI runs, notebook kernels and Ray workers they
# start use torch's threads too: libgomp's threads spin while they wait (its default), which
# slows torch down several times over when another process holds the cores; sleeping
# threads do not. Set before torch loads, for this process and every one it starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))

# ultralytics writes its settings file on import: into a folder of this run's own, not ~/.config,
# and it never goes online (the YOLO tests build models from their yaml, with random weights).
_ULTRALYTICS = tempfile.mkdtemp(prefix="explain-tests-ultralytics-")
atexit.register(shutil.rmtree, _ULTRALYTICS, ignore_errors=True)
os.environ["YOLO_CONFIG_DIR"] = _ULTRALYTICS
os.environ["YOLO_OFFLINE"] = "1"

DATA = Path(__file__).resolve().parent.parent / "data" / "images"

#: What the whole suite may take on the project's 2-core machine (`make test`,
#: CONTRIBUTING.md); the run ends by saying how long it took against it.
SUITE_BUDGET_SECONDS = 600
_STARTED: list[float] = []


def pytest_sessionstart(session):
    _STARTED.append(time.monotonic())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The suite's own duration against its budget, on the run's last lines (not a worker's)."""
    if hasattr(config, "workerinput") or not _STARTED or config.option.collectonly:
        return
    took = time.monotonic() - _STARTED[0]
    verdict = "within" if took <= SUITE_BUDGET_SECONDS else "OVER"
    terminalreporter.write_line(
        f"suite duration: {took // 60:.0f} min {took % 60:02.0f} s, {verdict} the budget of "
        f"{SUITE_BUDGET_SECONDS // 60} min on 2 cores (CONTRIBUTING.md); --durations=20 lists the slowest tests"
    )


@pytest.fixture(autouse=True)
def _seeded():
    """Random weights and inputs are the same on every run, so a failure reproduces."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _pil_open_restored():
    """A test that imports ultralytics itself leaves PIL.Image.open replaced (see
    explain.models.detectors); the next test on the worker gets PIL's own back."""
    pil_open = Image.open
    yield
    Image.open = pil_open


#: The fewest passes that still exercise each method with many passes (samples, steps, masks,
#: superpixels), for the tests that run every method on a model; a test file overrides what
#: its inputs need (a window that fits them, an inner batch to exercise).
CHEAP = {
    "sscam": {"n_samples": 1}, "iscam": {"n_samples": 1}, "smoothgradcam++": {"n_samples": 2},
    "smoothgrad": {"n_samples": 2}, "vargrad": {"n_samples": 2}, "ig": {"n_steps": 2},
    "gradientshap": {"n_samples": 2, "n_baselines": 2}, "deepliftshap": {"n_baselines": 2},
    "occlusion": {"window": 32, "stride": 32}, "lime": {"n_samples": 6, "n_segments": 16},
    "kernelshap": {"n_samples": 6, "n_segments": 16}, "ablation": {"n_segments": 16},
    "shapley-sampling": {"n_samples": 1, "n_segments": 16},
    "guidedig": {"steps": 2}, "blurig": {"steps": 2}, "xrai": {"steps": 2}, "extremal": {"steps": 2, "areas": 0.1},
    "rise": {"n_masks": 8}, "drise": {"n_masks": 8}, "sess": {"num_scales": 1},
    "layer-ig": {"n_steps": 2}, "layer-conductance": {"n_steps": 2}, "internal-influence": {"n_steps": 2},
}


def listening(advanced=None, should_stop=None, between=None, at_layers=False):
    """A :class:`explain.passes.PassListener` made of plain functions (each optional), for
    ``pass_settings(listener=...)`` in the tests (``at_layers``: its stop test is asked at
    each layer too, as a batch job's is)."""
    from explain.passes import PassListener

    class Listening(PassListener):
        asked_at_layers = at_layers

        def advanced(self, method, done, total):
            if advanced is not None:
                advanced(method, done, total)

        def should_stop(self):
            return bool(should_stop()) if should_stop is not None else False

        def between(self):
            if between is not None:
                between()

    return Listening()


def hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        + len(getattr(m, "_backward_pre_hooks", {}))
        for m in model.modules()
    )


class BackwardFails(torch.autograd.Function):
    """The identity, whose backward pass raises: an error in the middle of a backward pass."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward failed")


class BreaksOnPass(nn.Module):
    """``model`` whose forward pass number ``failing`` raises ``RuntimeError("broke in a
    pass")``: an error in the middle of a call's passes (the model's class names kept)."""

    def __init__(self, model: nn.Module, failing: int):
        super().__init__()
        self.body, self.failing, self.calls = model, failing, 0
        self.class_names = getattr(model, "class_names", None)

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.failing:
            raise RuntimeError("broke in a pass")
        return self.body(*args, **kwargs)


class ModelState:
    """Everything an explainer promises not to change, captured for comparison."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.training = [m.training for m in model.modules()]
        self.requires_grad = [p.requires_grad for p in model.parameters()]
        self.grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        self.hooks = hook_count(model)
        self.params = [p.detach().clone() for p in model.parameters()]
        self.buffers = [b.detach().clone() for b in model.buffers()]
        self.modules = [(name, type(m), frozenset(vars(m))) for name, m in model.named_modules()]

    def assert_unchanged(self) -> None:
        model = self.model
        assert hook_count(model) == self.hooks, "hooks left on the model"
        assert [m.training for m in model.modules()] == self.training, "train/eval flags changed"
        assert [p.requires_grad for p in model.parameters()] == self.requires_grad, "requires_grad changed"
        for before, p in zip(self.grads, model.parameters()):
            if before is None:
                assert p.grad is None, ".grad was created"
            else:
                assert p.grad is not None and torch.equal(p.grad, before), ".grad was changed"
        for before, p in zip(self.params, model.parameters()):
            assert torch.equal(before, p.detach()), "a parameter changed"
        for before, b in zip(self.buffers, model.buffers()):
            assert torch.equal(before, b), "a buffer (e.g. batch-norm statistics) changed"
        now = [(name, type(m), frozenset(vars(m))) for name, m in model.named_modules()]
        assert now == self.modules, "modules were replaced, or attributes left on them"


@pytest.fixture(scope="session")
def bundled():
    import explain

    return explain.models.load("efficientnet_lite0")


@pytest.fixture(scope="session")
def photos(bundled):
    """The four sample photos, preprocessed for the bundled model, keyed by file stem."""
    _, preprocess, _ = bundled
    paths = sorted(DATA.iterdir())
    paths = [p for p in paths if p.suffix in (".png", ".jpg")]
    batch = torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])
    return [p.stem for p in paths], batch


@pytest.fixture
def one_image_at_a_time(monkeypatch) -> list[int]:
    """A device that holds one image at a time: the CAMs' capture raises PyTorch's
    out-of-memory error on more. Returns the batch sizes it was called with."""
    from explain.methods import cam_base

    capture = cam_base.BaseCAM.capture
    sizes = []

    def capture_one(self, images, *args, **kwargs):
        sizes.append(len(images))
        if len(images) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return capture(self, images, *args, **kwargs)

    monkeypatch.setattr(cam_base.BaseCAM, "capture", capture_one)
    return sizes


@pytest.fixture
def heavy_method(monkeypatch):
    """A stand-in for a heavy method, registered as ``heavypasses`` for the test: Saliency after
    ``rows`` extra rows per image, run ``inner`` at a time through :class:`explain.passes.Passes`
    (each inner batch sleeps ``pause`` seconds, then calls ``each_inner_batch(images)``), its
    cost per image ``rows`` forward passes. ``budgets`` records the memory budget each inner
    batch ran under."""
    import time

    from explain import base
    from explain.methods.gradient_attribution import Saliency
    from explain.passes import Passes, memory_budget

    class HeavyPasses(Saliency):
        name = "heavypasses"
        rows, inner, pause = 300, 50, 0.0
        budgets: list[int] = []
        inner_batches = 0

        def each_inner_batch(self, images):
            """Told after each inner batch of a call on ``images`` (before the stop test)."""

        def _explain(self, images, targets=None, *, topk=None):
            with Passes(self.name, total=self.rows * len(images)) as passes:
                for _ in range(0, self.rows * len(images), self.inner):
                    time.sleep(self.pause)
                    type(self).budgets.append(memory_budget(images.device))
                    type(self).inner_batches += 1
                    self.each_inner_batch(images)
                    passes.advance(self.inner)
                return super()._explain(images, targets, topk=topk)  # inside: its own pass is not heard

        def pass_cost(self, images):
            return float(self.rows * len(images))

    monkeypatch.setitem(base._REGISTRY, base.method_key(HeavyPasses.name), HeavyPasses)
    return HeavyPasses


class ModelSteps:
    """Counts the model's steps in a heavy method's passes (inside :class:`explain.passes.Passes`:
    each module's forward, and each gradient that reaches a module's output in a backward
    pass) and, at the ``at``-th step of ``kind`` (forward or backward), asks for a stop
    (:attr:`asked`; with ``signal``, that signal is raised there too); then counts the
    steps that still run (:attr:`after`). Its hooks are the process's and come before the
    stop's own (registered first, they run first)."""

    def __init__(self, kind: str, at: int, signal: int | None = None):
        self.kind, self.at, self.signal = kind, at, signal
        self.steps = {"forward": 0, "backward": 0}
        self.after = 0
        self.asked = False

    def step(self, kind: str) -> None:
        if self.asked:
            self.after += 1
            return
        self.steps[kind] += 1
        if kind == self.kind and self.steps[kind] == self.at:
            self.asked = True
            if self.signal is not None:
                import signal

                signal.raise_signal(self.signal)

    def __enter__(self):
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        from explain import passes

        def forward(module, args):
            if passes._running.get() is not None:
                self.step("forward")

        def backward(module, args, output):
            if passes._running.get() is not None and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda gradient: self.step("backward"))

        self.handles = [register_module_forward_pre_hook(forward), register_module_forward_hook(backward)]
        return self

    def __exit__(self, *exc_info):
        for handle in self.handles:
            handle.remove()
