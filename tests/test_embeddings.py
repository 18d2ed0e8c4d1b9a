"""Embedding and multimodal models: SimilarityTarget (to a vector, another image, a text) and
ImageInput (a model whose forward takes the image with other inputs), on hand-made embedders,
a torchvision backbone without its head and a small random CLIP model."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import explain
from conftest import ModelState, hook_count
from explain import ImageInput, SimilarityTarget
from explain.similarity import embedding_of


class BrightColours(nn.Module):
    """Embeds an image by how much of each colour is bright: e_c = mean over pixels of
    ReLU(x_c - 0.8), for c = red, green, blue. ``relu`` (N, 3, H, W) is the target layer."""

    def __init__(self):
        super().__init__()
        self.bright = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.bright.weight.copy_(torch.eye(3)[:, :, None, None])
            self.bright.bias.fill_(-0.8)
        self.relu = nn.ReLU()
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.pool(self.relu(self.bright(x)))


def squares(size=32, red=(4, 4), green=(20, 20), side=8):
    """A dim noisy image (values under 0.5) with a bright red and/or green square."""
    image = torch.rand(1, 3, size, size) * 0.5
    for colour, corner in ((0, red), (1, green)):
        if corner is not None:
            y, x = corner
            image[0, colour, y : y + side, x : x + side] = 1.0
    return image


def test_cosine_similarity_by_hand():
    target = SimilarityTarget([1.0, 0.0])
    assert target(torch.tensor([[3.0, 4.0], [0.0, 2.0]])).tolist() == pytest.approx([0.6, 0.0])
    per_image = SimilarityTarget(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
    assert per_image(torch.tensor([[3.0, 4.0], [1.0, 1.0]])).tolist() == pytest.approx([0.8, 1.0])
    # Rows beyond the images are copies of them in order; score_rows names each row's image.
    assert per_image(torch.tensor([[3.0, 4.0], [1.0, 1.0]] * 2)).tolist() == pytest.approx([0.8, 1.0] * 2)
    rows = per_image.score_rows(torch.tensor([[3.0, 4.0], [3.0, 4.0]]), torch.tensor([1, 0]))
    assert rows.tolist() == pytest.approx([7 / (5 * 2**0.5), 0.8])


def test_embedding_fields_and_errors():
    out = {"image_embeds": torch.ones(2, 4), "pooler_output": torch.zeros(2, 8)}
    assert embedding_of(out).shape == (2, 4)
    assert embedding_of(out, "pooler_output").shape == (2, 8)
    with pytest.raises(ValueError, match="pass embedding='FIELD'"):
        embedding_of({"logits": torch.ones(2, 3), "hidden": torch.ones(2, 3)})
    with pytest.raises(ValueError, match=r"returned \(2, 8, 4, 4\), not an \(N, D\) embedding.*fc = nn.Identity"):
        SimilarityTarget([1.0] * 8)(torch.ones(2, 8, 4, 4))
    with pytest.raises(ValueError, match="has 3 values but the model's embedding has 2; compute the reference"):
        SimilarityTarget([1.0, 0.0, 0.0])(torch.ones(2, 2))
    with pytest.raises(ValueError, match="3 rows to score against 2 per-image references"):
        SimilarityTarget(torch.ones(2, 2))(torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"one embedding \(D,\) or one per image"):
        SimilarityTarget(torch.ones(2, 2, 2))


def test_gradcam_of_a_similarity_matches_a_plain_reference():
    model = BrightColours()
    image = squares()
    reference = torch.tensor([1.0, 0.2, 0.0])
    res = explain.GradCAM(model, "bright")(image, SimilarityTarget(reference))
    # The same map by hand: A = the layer's output, G = d cos(e, r) / dA, weights = mean of G.
    activations = model.bright(image).detach().requires_grad_()
    embedding = model.pool(model.relu(activations))
    score = F.cosine_similarity(embedding, reference[None], dim=1).sum()
    (gradients,) = torch.autograd.grad(score, activations)
    expected = F.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(1))
    torch.testing.assert_close(res.raw, expected.detach())
    assert res.targets.tolist() == [-1]


def test_the_map_of_a_similarity_lands_on_the_shared_object():
    # The image holds a bright red and a bright green square; the reference image only a red
    # one, elsewhere. What the image shares with it is the red square: the map lands there.
    model = BrightColours()
    image, other = squares(red=(4, 4), green=(20, 20)), squares(red=(18, 2), green=None)
    target = SimilarityTarget.of_image(model, other)
    red = torch.zeros(32, 32, dtype=torch.bool)
    red[4:12, 4:12] = True
    for method in ("gradcam", "layercam", "hirescam", "scorecam"):
        res = explain.explainer(method, model, target_layer="relu")(image, target)
        inside, outside = res.maps[0][red].mean(), res.maps[0][~red].mean()
        assert inside > 0.5 and outside < 0.1, (method, inside, outside)
    for method in ("saliency", "occlusion"):
        res = explain.explainer(method, model)(image, target)
        assert res.maps[0][red].mean() > 5 * res.maps[0][~red].mean(), method


def test_of_image_runs_the_model_once_and_leaves_it_as_it_was():
    model = BrightColours().train()
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(module.training))
    state = ModelState(model)
    image = squares()
    target = SimilarityTarget.of_image(model, image)
    assert calls == [False]  # in eval mode, once
    torch.testing.assert_close(target.reference, model.eval()(image).detach())
    model.train()
    state.assert_unchanged()
    assert target(model(image)).item() == pytest.approx(1.0)


def test_per_image_references_match_one_image_at_a_time():
    # Score-CAM scores masked copies of both images in shared passes, LIME and occlusion run
    # their own batches: each row must meet its own image's reference.
    model = BrightColours()
    images = torch.cat([squares(red=(4, 4), green=(20, 20)), squares(red=(20, 4), green=(4, 20))])
    references = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    for method, options in (("scorecam", {"target_layer": "bright"}), ("occlusion", {"window": 8, "stride": 8})):
        cam = explain.explainer(method, model, **options)
        both = cam(images, SimilarityTarget(references))
        for i in range(2):
            alone = cam(images[i : i + 1], SimilarityTarget(references[i]))
            torch.testing.assert_close(both.maps[i], alone.maps[0], msg=method)


# --- a torchvision backbone as an embedder ------------------------------------------------------


def test_resnet_backbone_as_an_embedder():
    model = torchvision.models.resnet18()
    model.fc = nn.Identity()
    model.eval()
    images = torch.randn(2, 3, 64, 64)
    other = torch.randn(1, 3, 64, 64)
    state = ModelState(model)
    target = SimilarityTarget.of_image(model, other)
    assert target.reference.shape == (1, 512)
    for method in ("gradcam", "gradcam++", "ablationcam", "ig"):
        options = {"n_steps": 4} if method == "ig" else {}
        res = explain.explainer(method, model, **options)(images, target)
        assert res.maps.shape == (2, 64, 64) and res.maps.amax(dim=(1, 2)).tolist() == [1.0, 1.0], method
        if method != "ig":
            assert res.layers == ("layer4",)
    state.assert_unchanged()
    # An image is most similar to itself: its score is 1.
    assert SimilarityTarget.of_image(model, other)(model(other)).item() == pytest.approx(1.0, abs=1e-6)


# --- a CLIP model, its text held fixed -----------------------------------------------------------


@pytest.fixture(scope="module")
def clip():
    transformers = pytest.importorskip("transformers")
    vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2)
    text = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    config = transformers.CLIPConfig(vision_config=vision, text_config=text, projection_dim=16)
    return transformers.CLIPModel(config).eval()


def test_clip_explained_against_a_text(clip):
    input_ids = torch.tensor([[0, 17, 42, 23, 1]])
    model = ImageInput(clip, "pixel_values", input_ids=input_ids)
    images = torch.rand(3, 3, 32, 32)
    target = SimilarityTarget.of_text(model, input_ids)
    with torch.no_grad():
        full = clip(pixel_values=images, input_ids=input_ids.expand(3, -1))
    # The target's score is the cosine of CLIP's own image and text embeddings.
    expected = F.cosine_similarity(full.image_embeds, full.text_embeds, dim=1)
    with torch.no_grad():
        torch.testing.assert_close(target(model(images)), expected)
    state, hooks = ModelState(clip), hook_count(clip)
    layer = "model.vision_model.encoder.layers.1.layer_norm1"  # the vision tower's last block, not the text's
    assert explain.find_target_layer(model, images) == layer
    for method in ("gradcam", "layercam", "scorecam"):
        res = explain.explainer(method, model)(images, target)
        assert res.layers == (layer,) and res.maps.shape == (3, 32, 32), method
        assert torch.isfinite(res.maps).all() and res.targets.tolist() == [-1, -1, -1]
    res = explain.IntegratedGradients(model, n_steps=4)(images, target)
    assert res.raw.shape == images.shape and res.maps.amax(dim=(1, 2)).tolist() == [1.0] * 3
    state.assert_unchanged()
    assert hook_count(clip) == hooks == 0


def test_image_input_names_outputs_and_errors(clip):
    input_ids = torch.tensor([[0, 17, 42, 23, 1], [0, 5, 6, 7, 1]])
    images = torch.rand(2, 3, 32, 32)
    # A zero-shot classifier over two texts (CLIP takes its texts as a batch of their own); the
    # model's own layer names work too.
    model = ImageInput(clip, "pixel_values", output="logits_per_image", expand=False, input_ids=input_ids)
    state = ModelState(clip)
    for cam in (explain.GradCAM(model, "vision_model.encoder.layers.1.layer_norm1"), explain.ScoreCAM(model)):
        res = cam(images, [0, 1])
        assert res.logits.shape == (2, 2) and res.targets.tolist() == [0, 1] and res.maps.shape == (2, 32, 32)
    assert res.layers == ("model.vision_model.encoder.layers.1.layer_norm1",)
    state.assert_unchanged()
    with pytest.raises(ValueError, match=r"has 2 rows; ImageInput pairs every image with the same inputs.*expand=False"):
        ImageInput(clip, "pixel_values", input_ids=input_ids)
    with pytest.raises(ValueError, match="'nope' is not a field of the model's output"):
        ImageInput(clip, "pixel_values", output="nope", input_ids=input_ids[:1])(images)
    with pytest.raises(ValueError, match="has no get_text_features"):
        SimilarityTarget.of_text(BrightColours(), input_ids)


# --- the command line: --target similar:IMAGE ------------------------------------------------------


def test_cli_explains_the_similarity_to_an_image(tmp_path, capsys):
    from explain.cli import main

    torch.manual_seed(0)
    embedder = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(embedder, (torch.rand(2, 3, 64, 64),), dynamic_shapes=({0: batch},))
    torch.export.save(program, tmp_path / "embedder.pt2")
    images = Path(__file__).resolve().parents[1] / "data" / "images"
    reference = images / "chelsea.png"

    def run(target, *options):
        out = tmp_path / "out"
        code = main(["run", str(images / "astronaut.png"), str(images / "coffee.png"), "--out", str(out),
                     "--model", str(tmp_path / "embedder.pt2"), "--target", target, "--workers", "0", "-q",
                     "--overwrite", *options])
        return code, out, capsys.readouterr().err

    code, out, _ = run(f"similar:{reference}", "--method", "gradcam,scorecam")
    assert code == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {(r["target"], r["target_id"], r["predicted_id"]) for r in rows} == {(f"similar:{reference}", -1, None)}
    assert all((out / r["output"]).is_file() and "similar" in r["output"] for r in rows)
    code, _, err = run(f"similar:{tmp_path / 'nowhere.png'}")
    assert code == 2 and "cannot read the reference image" in err and "file not found" in err
    (tmp_path / "notes.png").write_text("not a picture")
    code, _, err = run(f"similar:{tmp_path / 'notes.png'}")
    assert code == 2 and "cannot read the reference image" in err
    code, _, err = run("similar:")
    assert code == 2 and "similar:IMAGE names the reference image" in err
    code, _, err = run(f"similar:{reference}", "--metrics", "deletion")
    assert code == 2 and "--metrics rescore the explained class" in err
