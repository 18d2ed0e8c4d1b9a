"""The heavy methods' extra passes (explain.passes): inner batches from a memory budget, the
same results whatever the budget, progress where documented, and a stop between inner
batches that leaves the model as it was."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import ModelState, listening
from torch import nn

import explain
from conftest import ModelState, ModelSteps, listening
from explain import passes
from explain.hooks import preserved_state
from explain.metrics import deletion
from explain.passes import (
    BAR_DELAY,
    PROGRESS_AFTER,
    Passes,
    StopRequested,
    budget_rows,
    fastest_rows,
    inner_rows,
    parse_memory,
    pass_settings,
    row_bytes,
)

REPO = Path(__file__).resolve().parents[1]


def small_cnn(channels: int = 24, classes: int = 5) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, channels, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes),
    ).eval()


def images(n: int = 3, size: int = 16) -> torch.Tensor:
    """Smooth noise: SLIC finds several superpixels in it (one in pixel noise)."""
    torch.manual_seed(1)
    return nn.functional.interpolate(torch.rand(n, 3, 4, 4), size=size, mode="bilinear")


def test_memory_sizes_are_read_with_their_units_and_bad_ones_name_the_form():
    assert parse_memory("2GB") == 2 * 10**9
    assert parse_memory("1.5 GiB") == int(1.5 * 2**30)
    assert parse_memory("800M") == 800 * 10**6
    assert parse_memory(4096) == 4096
    for bad in ("two gigs", "5 parsecs", "0", -3, True):
        with pytest.raises(ValueError, match="max_memory must be"):
            parse_memory(bad)
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        with pass_settings(progress="yes"):
            pass


def test_the_budget_bounds_the_rows_of_a_pass():
    model, x = small_cnn(), images(1, 32)
    with preserved_state(model):
        per_row = row_bytes(model, x, backward=True)
        assert per_row > x.numel() * x.element_size() and row_bytes(model, x, backward=False) > 0
        with pass_settings(max_memory=3 * per_row):
            assert budget_rows(model, x, backward=True, total=100) == 3
            assert 1 <= inner_rows(model, x, backward=True, total=100) <= 3
            assert inner_rows(model, x, backward=True, total=100, given=50) == 50  # the caller's own size wins
        with pass_settings(max_memory=1):  # less than one row: still one row at a time
            assert inner_rows(model, x, backward=True, total=100) == 1


def test_the_fastest_batch_is_measured_once_and_stops_at_sizes_the_model_refuses(monkeypatch):
    class AtMostFour(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.calls = small_cnn(), []

        def forward(self, x):
            self.calls.append(len(x))
            if len(x) > 4:
                raise RuntimeError("out of memory")
            return self.body(x)

    model, x = AtMostFour().eval(), images(1, 16)

    def timed(model, batch, backward):  # each pass 10 ms, whatever its size: larger is faster per row
        model(batch)
        return 0.01

    monkeypatch.setattr(passes, "_timed", timed)
    with preserved_state(model):
        assert fastest_rows(model, x, backward=False, most=64) == 4
        measured = list(model.calls)
        assert 8 in measured and max(measured) == 8  # tried, refused, not tried further
        fastest_rows(model, x, backward=False, most=64)
        assert model.calls == measured  # kept for the process


def test_a_row_costs_the_same_inside_inference_mode():
    # The perturbation methods and metrics size their passes from inside inference_mode, where
    # autograd keeps nothing: measured there, a row once cost only its input copies.
    model, x = small_cnn(), images(1, 32)
    with preserved_state(model):
        outside = row_bytes(model, x, backward=False)
        passes._measured.clear()
        with torch.inference_mode():
            inside = row_bytes(model, x.clone(), backward=False)
    activation = 24 * 32 * 32 * 4  # the widest layer's output, in bytes
    assert inside == outside >= 4 * activation + passes.INPUT_COPIES * x.numel() * 4


def test_the_weights_autograd_keeps_are_not_a_rows_cost():
    # A linear layer keeps its weight for the gradient of its input: a cost of the model, not
    # of each row. Here the weight (3 MB) is far larger than any activation of a row.
    wide = nn.Sequential(nn.Flatten(), nn.Linear(192, 4096), nn.ReLU(), nn.Linear(4096, 2)).eval()
    x = images(1, 8)
    with preserved_state(wide):
        per_row = row_bytes(wide, x, backward=True)
    weight = 192 * 4096 * 4
    activations = 4096 * 4 * 3 + 192 * 4  # the hidden layer's output, its ReLU's, its gradient; the flat input
    assert per_row < weight / 4 and per_row <= 2 * activations + passes.INPUT_COPIES * x.numel() * 4 + 4096 * 4


def test_between_is_called_after_each_inner_batch_and_each_size_the_search_tries():
    model, x = small_cnn(), images(1, 16)
    calls = []
    with preserved_state(model), pass_settings(listener=listening(between=lambda: calls.append("between"))):
        fastest_rows(model, x, backward=False, most=32, allowance=None)
        # sizes 4, 8, 16 and 32 (on a loaded machine a noisy timing may have one tried again)
        assert calls[:4] == ["between"] * 4 and set(calls) == {"between"} and len(calls) <= 6
        calls.clear()
        with Passes("demo", total=5) as running:
            running.advance(2)
            running.advance(3)
        assert calls == ["between"] * 2


def test_a_short_call_spends_little_on_the_search_and_later_calls_go_on_with_it():
    model, x = small_cnn(), images(1, 16)
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(len(args[0])))
    with preserved_state(model):
        assert fastest_rows(model, x, backward=False, most=64, allowance=12) == 4  # the warm-up and size 4
        assert calls == [4, 4, 4]
        fastest_rows(model, x, backward=False, most=64, allowance=16)  # size 8: two passes of 8 rows
        assert calls[3:] == [8, 8]
        assert fastest_rows(model, x, backward=False, most=64, allowance=0) in (4, 8)  # nothing more to spend
        assert calls[5:] == []
        # Where the budget allows fewer rows, the search starts there.
        assert fastest_rows(model, x, backward=True, most=2, allowance=None) in (1, 2)
        assert calls[5:8] == [2, 2, 2]
        # A call too short to search at all runs what the budget allows at once.
        assert fastest_rows(nn.Sequential(nn.Flatten()), x, backward=False, most=5, allowance=2) == 5


def test_a_model_that_refuses_the_first_size_runs_one_row_at_a_time(monkeypatch):
    class OneAtATime(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.calls = small_cnn(), []

        def forward(self, x):
            self.calls.append(len(x))
            if len(x) > 1:
                raise RuntimeError("this model takes one image at a time")
            return self.body(x)

    model, x = OneAtATime().eval(), images(1, 16)
    with preserved_state(model):
        assert fastest_rows(model, x, backward=False, most=64) == 1
        assert model.calls == [4, 1, 1]  # refused, then one row timed twice
        assert fastest_rows(model, x, backward=False, most=64) == 1
        assert model.calls == [4, 1, 1]  # kept for the process


@pytest.mark.parametrize("method, options", [
    ("scorecam", {}), ("sscam", {"n_samples": 2}), ("iscam", {"n_samples": 2}), ("ablationcam", {}),
    ("ig", {"n_steps": 8}), ("smoothgrad", {"n_samples": 6}), ("deeplift", {}), ("deepliftshap", {"n_baselines": 3}),
    ("occlusion", {"window": 8, "stride": 4}), ("lime", {"n_samples": 20, "n_segments": 8}),
    ("kernelshap", {"n_samples": 20, "n_segments": 8}), ("ablation", {"n_segments": 8}),
])
def test_results_do_not_depend_on_the_budget(method, options):
    model, x = small_cnn(), images(3, 32)
    cam = explain.explainer(method, model, **options)
    roomy = cam(x)  # the default budget: half the available memory
    tight = cam(x, max_memory=1)  # one row per pass
    assert torch.allclose(roomy.maps, tight.maps, atol=1e-5), method
    assert torch.allclose(roomy.raw, tight.raw, atol=1e-5, rtol=1e-4), method


def test_gradientshap_draws_from_the_same_distribution_whatever_the_budget():
    model, x = small_cnn(), images(2, 32)
    cam = explain.GradientShap(model, n_samples=400, n_baselines=4)
    roomy, tight = cam(x).raw, cam(x, max_memory=1).raw
    # captum draws each inner batch's path points anew: the estimates agree, not the bits.
    assert torch.allclose(roomy.sum(dim=(1, 2, 3)), tight.sum(dim=(1, 2, 3)), rtol=0.1, atol=1e-3)


def test_progress_bars_show_where_documented(capsys):
    model, x = small_cnn(), images(1, 16)
    explain.IntegratedGradients(model, n_steps=8)(x)  # 9 rows in milliseconds: silent by default
    assert capsys.readouterr().err == ""
    with Passes("slow", 2) as passes:  # a call of a few rows that runs longer than BAR_DELAY (a large model)
        assert passes.bar is not None and passes.bar.delay == BAR_DELAY
        passes.bar.start_t -= 2 * BAR_DELAY  # as if the first row had taken that long (tqdm's clocks)
        passes.bar.last_print_t -= 2 * BAR_DELAY
        passes.advance(1)
    assert "slow:  50%" in capsys.readouterr().err
    explain.IntegratedGradients(model, n_steps=8)(x, progress=True)
    assert "ig" in capsys.readouterr().err
    with Passes("long", PROGRESS_AFTER + 1) as passes, Passes("short", PROGRESS_AFTER) as inner:
        assert passes.bar is not None and passes.bar.delay > 0  # a bar once the call has run a second
        assert inner.bar is None  # a call inside another: the outer call's bar
    with Passes("short", PROGRESS_AFTER) as passes:
        assert passes.bar is None
    with pass_settings(progress=False), Passes("long", PROGRESS_AFTER + 1) as passes:
        assert passes.bar is None
    capsys.readouterr()
    with pass_settings(progress=False):  # -q of the command line
        explain.ScoreCAM(model)(x, progress=None)
    assert capsys.readouterr().err == ""
    explanation = explain.GradCAM(model)(x)
    deletion(model, x, explanation, progress=True, max_memory="1GB")
    assert "deletion" in capsys.readouterr().err


class Slow(nn.Module):
    """A model whose every pass takes a while, as a large one on a CPU does."""

    def __init__(self, model: nn.Module, seconds: float):
        super().__init__()
        self.model, self.seconds = model, seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.model(x)


def test_a_metric_of_a_few_dozen_passes_shows_a_bar_once_it_runs_long(capsys):
    """Deletion of one 16 x 16 image in 17 steps is silent when quick, and shows a bar by
    default when its passes take longer than BAR_DELAY (2 x 225 passes of the bundled model
    ran minutes in silence below the old 256-pass threshold)."""
    model, x = small_cnn(), images(1, 16)
    explanation = explain.GradCAM(model)(x)
    deletion(model, x, explanation, step=16)
    assert capsys.readouterr().err == ""
    slow = Slow(model, BAR_DELAY / 4).eval()
    with pass_settings(max_memory=4 * row_bytes(model, x, backward=False)):  # inner batches of a few rows
        deletion(slow, x, explanation, step=16)
    assert re.search(r"deletion: +\d+%", capsys.readouterr().err)


def test_the_listener_hears_each_inner_batch_of_the_outermost_call():
    model, x = small_cnn(), images(2, 16)
    heard = []
    with pass_settings(listener=listening(lambda method, done, total: heard.append((method, done, total)))):
        explain.IntegratedGradients(model, n_steps=10, internal_batch_size=4)(x)
    assert {method for method, _, _ in heard} == {"ig"}
    done = [d for _, d, _ in heard]
    assert done == sorted(done) and done[-1] == heard[-1][2] == 2 * (1 + 10)  # the images, then 20 rows of steps
    with Passes("outer", 5) as outer:  # a call inside another (a metric that explains again) is not heard
        heard.clear()
        with pass_settings(listener=listening(lambda *args: heard.append(args))):
            explain.IntegratedGradients(model, n_steps=4)(x)
        outer.advance(5)
    assert heard == []


@pytest.mark.parametrize("method, options", [
    ("scorecam", {}), ("ablationcam", {}), ("ig", {"n_steps": 20}), ("smoothgrad", {"n_samples": 20}),
    ("occlusion", {"window": 8, "stride": 4}), ("lime", {"n_samples": 30, "n_segments": 8}),
    ("deepliftshap", {"n_baselines": 4}),
])
def test_a_stop_between_inner_batches_leaves_the_model_as_it_was(method, options):
    model, x = small_cnn(), images(2, 32)
    model.train()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    state = ModelState(model)
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) >= 3

    with pass_settings(listener=listening(should_stop=stop)), pytest.raises(StopRequested):
        explain.explainer(method, model, batch_size=2, **options)(x) if "cam" in method else \
            explain.explainer(method, model, internal_batch_size=2, **options)(x)
    assert len(asked) == 3  # it stopped at the first inner batch after the request
    state.assert_unchanged()


@pytest.mark.parametrize("method, points", [
    ("scorecam", [("forward", 1), ("forward", 1500)]),
    ("sscam", [("forward", 800)]),
    ("rise", [("forward", 800)]),
    ("ig", [("forward", 800), ("backward", 1), ("backward", 600)]),
])
def test_a_stop_is_answered_within_a_layer_at_any_point_of_a_heavy_method(bundled, photos, method, points):
    # The stop was asked only between inner batches: one inner batch at a large memory budget
    # on a loaded 2-core machine took ~9 s. Default settings on the bundled model (266 module
    # calls a forward pass): after the stop is asked for, not one more layer runs.
    model = bundled[0]
    image = photos[1][:1]
    explainer = explain.explainer(method, model)
    state = ModelState(model)
    for kind, at in points:
        with ModelSteps(kind, at) as counted, pass_settings(listener=listening(should_stop=lambda: counted.asked, at_layers=True)):
            with pytest.raises(StopRequested, match=f"^{method}: stopped after"):
                explainer(image)
        assert counted.asked and counted.after == 0, (kind, at, counted.steps, counted.after)
        state.assert_unchanged()
    assert not torch.nn.modules.module._global_forward_pre_hooks  # the stop's hooks are gone
    assert not torch.nn.modules.module._global_forward_hooks


def test_a_metric_stops_between_its_batches_too():
    model, x = small_cnn(), images(2, 16)
    explanation = explain.GradCAM(model)(x)
    state = ModelState(model)
    with pass_settings(listener=listening(should_stop=lambda: True)), pytest.raises(StopRequested, match="deletion"):
        deletion(model, x, explanation, batch_size=2)
    state.assert_unchanged()


class SlowNet(nn.Module):
    """A model whose every pass takes a while, as a large model's would."""

    def __init__(self):
        super().__init__()
        self.body = small_cnn(channels=64)

    def forward(self, x):
        time.sleep(0.02)
        return self.body(x)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_ctrl_c_stops_score_cam_within_a_second_and_restores_the_model():
    model = SlowNet().eval()
    x = images(4, 32)
    state = ModelState(model)
    cam = explain.ScoreCAM(model, "body.2")  # 64 channels x 4 images: 256 masked images
    sent = []
    timer = threading.Timer(0.5, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            cam(x)
        stopped = time.perf_counter()
    finally:
        timer.cancel()
    assert sent and stopped - sent[0] < 1.0
    state.assert_unchanged()


SUBPROCESS = textwrap.dedent("""
    import json, sys, threading, time, torch, torchvision
    import explain
    from explain.hooks import preserved_state
    from explain.passes import row_bytes
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.rand(1, 3, 128, 128)
    with preserved_state(model):
        per_row = row_bytes(model, x, backward=True)
    explain.IntegratedGradients(model, n_steps=2)(x)   # the first call's own costs, before the baseline

    def anonymous():  # the process's own memory: the shared libraries' pages may come and go
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))

    peak, done = [anonymous()], threading.Event()
    baseline = peak[0]

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], anonymous())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    options = json.loads(sys.argv[1])
    explain.IntegratedGradients(model, n_steps=24, **options["init"])(x, **options["call"])
    done.set()
    sampler.join()
    print(json.dumps({"per_row": per_row, "growth": peak[0] - baseline}))
""")



def _peak_growth(init: dict, call: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", SUBPROCESS, json.dumps({"init": init, "call": call})],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_small_budget_bounds_the_peak_memory_of_a_subprocess():
    # IG's 24 steps on resnet18 at 128 px (about 300 MB in one pass; 48 steps at 160 px took
    # 4 times the compute to show the same): all in one pass, then under a budget of two rows.
    whole = _peak_growth({"internal_batch_size": 24}, {})
    budget = 2 * whole["per_row"]
    bounded = _peak_growth({}, {"max_memory": budget})
    assert bounded["growth"] <= budget, (bounded, budget)
    assert whole["growth"] > 4 * bounded["growth"] + 100 * 2**20, (whole, bounded)


def test_the_cpu_budget_keeps_within_the_address_space_limit(monkeypatch):
    # Under `ulimit -v 4G` the budget came from free RAM alone: every inner batch sized from it
    # failed in the CPU allocator, and with it every image.
    import resource

    real = resource.getrlimit
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = mapped + 300 * 2**20

    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else real(which))
    assert 200 * 2**20 < passes.available_memory(torch.device("cpu")) <= 300 * 2**20
    with pass_settings():
        assert passes.memory_budget(torch.device("cpu")) <= 150 * 2**20
