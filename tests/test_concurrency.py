"""Threads sharing one model: calls take turns on the model's lock, give the serial run's
maps, and leave the model exactly as it was (explain.concurrency)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from conftest import ModelState

import explain
from explain.concurrency import model_lock

# Each explainer is called CALLS times, spread evenly over the threads: CALLS times the
# number of explainers (10) must divide by THREADS.
THREADS, CALLS = 4, 4


def _cnn():
    return torchvision.models.resnet18(num_classes=5).eval()


def _vit():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=5).eval()


def _explainers(cnn, vit) -> dict[str, tuple[explain.Explainer, torch.Tensor]]:
    images = torch.rand(2, 3, 32, 32)
    return {
        "gradcam": (explain.GradCAM(cnn), images),
        "scorecam": (explain.ScoreCAM(cnn), images),
        "ig": (explain.IntegratedGradients(cnn, n_steps=8), images),
        "smoothgrad": (explain.SmoothGrad(cnn, n_samples=4), images),    # seeded: the process's generators
        "lrp": (explain.LRP(cnn), images),                                # canonizers change the modules
        "excitation-backprop": (explain.ContrastiveExcitationBackprop(cnn), images),  # and the classifier's rule
        "deeplift": (explain.DeepLift(cnn), images),
        "attention-rollout": (explain.AttentionRollout(vit), images),    # swaps the attention kernel
        "vit-gradcam": (explain.GradCAM(vit), images),
        "attnlrp": (explain.AttnLRP(vit), images),                        # its rules swap forwards and kernels
    }


def test_threads_sharing_a_model_get_the_serial_maps_and_leave_it_untouched():
    cnn, vit = _cnn(), _vit()
    # Trainable models in training mode: what the calls must put back is not the default.
    cnn.train(), vit.train()
    cnn.fc.weight.requires_grad_(False)
    states = [ModelState(cnn), ModelState(vit)]
    kernel = F.scaled_dot_product_attention
    explainers = _explainers(cnn, vit)
    serial = {name: explainer(images).maps for name, (explainer, images) in explainers.items()}

    barrier = threading.Barrier(THREADS)

    def work(start: int) -> list[tuple[str, torch.Tensor]]:
        barrier.wait()  # every thread starts at once
        names = list(explainers)
        maps = []
        for call in range(CALLS * len(names) // THREADS):
            name = names[(start + call) % len(names)]
            explainer, images = explainers[name]
            maps.append((name, explainer(images).maps))
        return maps

    with ThreadPoolExecutor(THREADS) as pool:
        results = [m for future in [pool.submit(work, i) for i in range(THREADS)] for m in future.result()]

    assert len(results) == CALLS * len(explainers)
    assert {name for name, _ in results} == set(explainers)
    for name, maps in results:
        assert torch.allclose(maps, serial[name], atol=1e-6), name  # inner batches' sizes are measured
    for state in states:
        state.assert_unchanged()
    assert F.scaled_dot_product_attention is kernel
    assert torch.backends.mha.get_fastpath_enabled()
    fresh = torchvision.models.resnet18(num_classes=5)
    fresh.load_state_dict(cnn.state_dict())  # no key added or resized (an LRP bias once was)


def test_a_call_waits_for_another_threads_hold_on_the_model():
    model = _cnn()
    explainer = explain.GradCAM(model)
    images = torch.rand(1, 3, 32, 32)
    done = threading.Event()

    def call():
        explainer(images)
        done.set()

    with model_lock(model):
        thread = threading.Thread(target=call)
        thread.start()
        assert not done.wait(1.0), "the call ran while another thread held the model"
    thread.join(30)
    assert done.is_set()


def test_a_method_that_calls_another_on_the_same_model_goes_on():
    model = _cnn()
    explainer = explain.GradCAM(model)
    images = torch.rand(1, 3, 32, 32)
    with model_lock(model):  # re-entrant: a metric holding the lock calls the explainer
        score = explain.metrics.model_randomisation(explainer, images, checkpoints=2)
    assert score.values.shape == (1,)


def test_inference_in_another_thread_is_not_captured():
    model = _cnn()
    images = torch.rand(2, 3, 32, 32)
    expected = explain.GradCAM(model)(images, lambda output: output[:, 0]).maps
    started, go_on = threading.Event(), threading.Event()
    logits = []

    def score(output):  # runs inside the explanation's forward pass, on the calling thread
        started.set()
        go_on.wait(10)
        return output[:, 0]

    def inference():
        started.wait(10)
        with torch.no_grad():
            logits.append(model(torch.rand(3, 3, 32, 32)))  # mid-explanation: must not be captured
        go_on.set()

    thread = threading.Thread(target=inference)
    thread.start()
    maps = explain.GradCAM(model)(images, score).maps
    thread.join(30)
    assert logits and logits[0].shape == (3, 5)
    assert torch.allclose(maps, expected, atol=1e-6)


@pytest.mark.parametrize("method", ["gradcam", "lrp"])
def test_hygiene_holds_when_threads_fail(method):
    model = _cnn()
    state = ModelState(model)
    explainer = explain.explainer(method, model)
    wrong = torch.rand(1, 1, 32, 32)  # one channel: every call fails

    def fail():
        with pytest.raises(Exception):
            explainer(wrong)

    threads = [threading.Thread(target=fail) for _ in range(THREADS)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    state.assert_unchanged()


def test_attention_captures_on_two_models_at_once_put_the_kernel_back():
    kernel, images = F.scaled_dot_product_attention, torch.rand(1, 3, 32, 32)
    explainers = [explain.AttentionRollout(_vit()) for _ in range(2)]
    serial = [explainer(images).maps for explainer in explainers]
    barrier = threading.Barrier(2)

    def work(explainer):
        barrier.wait()
        return [explainer(images).maps for _ in range(10)]

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(work, explainers))
    for maps, expected in zip(results, serial):
        assert all(torch.allclose(m, expected, atol=1e-6) for m in maps)
    assert F.scaled_dot_product_attention is kernel, "the explicit kernel was left in place"
    assert torch.backends.mha.get_fastpath_enabled()


def test_concept_calls_in_threads_get_the_serial_results_and_leave_the_model_untouched():
    from explain.concepts import CRP, AtlasProbe, visualize
    from explain.data import ShortcutCNN

    torch.manual_seed(0)
    model = ShortcutCNN().train()  # batch norms merged by the canonizers, flags put back
    state = ModelState(model)
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    calls = {
        "crp": lambda: CRP(model, "block3")(images, k=2).maps,
        "atlas": lambda: AtlasProbe(model, ["block2", "block4"])(images).layers["block4"].relevance,
        "visualize": lambda: visualize(model, "block3", [0, 1], steps=2, views=2, input_size=32).images,
        "fails": lambda: CRP(model, "block3")(torch.rand(1, 1, 32, 32)),  # one channel: refused mid-call
    }
    serial = {name: call() for name, call in calls.items() if name != "fails"}
    barrier = threading.Barrier(len(calls))

    def work(name):
        barrier.wait()
        try:
            return name, calls[name]()
        except ValueError:
            return name, None

    with ThreadPoolExecutor(len(calls)) as pool:
        results = dict(pool.map(work, calls))
    assert results["fails"] is None
    for name, expected in serial.items():
        assert torch.allclose(results[name], expected, atol=1e-6), name
    state.assert_unchanged()
