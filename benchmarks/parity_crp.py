"""explain.concepts against zennit-crp, on the same model, rules and images.

    pip install --no-deps --target /tmp/crp zennit-crp     # it pins torch<2 and zennit<=0.4.6
    PYTHONPATH=/tmp/crp .venv/bin/python benchmarks/parity_crp.py

zennit-crp 0.6 installs without its pins and runs on torch 2 and zennit 0.5 for what is
compared here: ``CondAttribution`` (conditional heatmaps and the layer's channel relevances,
with ``exclude_parallel`` as its default), ``ChannelConcept.attribute`` and
``reference_sampling`` (the atlas's RelMax reduction and receptive-field neuron), and
``CondAttribution`` with ``start_layer`` and ``ChannelConcept.mask_rf`` (the reference
heatmaps). Both run explain.LRP's composite (rules and canonizers), so the differences are
those of the two implementations, reported as the largest absolute difference over the
largest absolute value. explain never imports zennit-crp.
"""

from __future__ import annotations

import torch
import torchvision
from crp.attribution import CondAttribution
from crp.concepts import ChannelConcept

from explain.concepts import CRP, AtlasProbe
from explain.concepts.propagation import concept_context
from explain.concepts.references import neuron_relevance
from explain.data import load_shortcut_model, shortcut_dataset
from explain.methods.relevance import LRP


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def compare(name: str, model, layer: str, image: torch.Tensor, k: int = 4) -> None:
    ours = CRP(model, layer)(image, k=k)
    target = int(ours.targets[0, 0])
    lrp = LRP(model)
    concept = ChannelConcept()
    with concept_context(model):
        composite = lrp.composite(model, image)
        attribution = CondAttribution(model, no_param_grad=False)
        data = image.clone().requires_grad_()
        full = attribution(data, [{"y": [target]}], composite, record_layer=[layer])
        relevances = concept.attribute(full.relevances[layer], abs_norm=False)[0]
        conditions = [{layer: [c], "y": [target]} for c in ours.concept_ids[0].tolist()]
        data = image.clone().requires_grad_()
        theirs = attribution(data, conditions, lrp.composite(model, image), record_layer=[layer])
        ranked, normed, neurons = concept.reference_sampling(full.relevances[layer], max_target="sum", abs_norm=True)
    print(f"| {name} {layer} | channel relevances | {relative(ours.channel_relevances[0], relevances):.1e} |")
    print(f"| {name} {layer} | conditional heatmaps (k={k}) | {relative(ours.raw[0], theirs.heatmap):.1e} |")
    probe = AtlasProbe(model, [layer])(image)
    values = probe.layers[layer].relevance[0]
    print(f"| {name} {layer} | RelMax value (sum, abs_norm) | {relative(values[ranked[:, 0]], normed[:, 0]):.1e} |")
    same = torch.equal(probe.layers[layer].relevance_at[0][ranked[:, 0]], neurons[:, 0])
    print(f"| {name} {layer} | RelMax neuron (argmax) | {'identical' if same else 'differs'} |")
    reference_heatmaps(name, model, layer, image, probe.layers[layer].activation_at[0][:k], lrp, attribution)


def reference_heatmaps(name, model, layer, image, positions, lrp, attribution) -> None:
    """zennit-crp's receptive-field heatmaps (start_layer, mask_rf, relevance = activation)
    against the pass explain.concepts.reference_patches runs."""
    channels = torch.arange(len(positions))
    rows = image.expand(len(positions), -1, -1, -1)
    with concept_context(model):
        from explain.concepts.propagation import ConceptPasses

        module = model.get_submodule(layer)
        ours, _ = ConceptPasses(lrp).from_layer(rows, (layer, module), neuron_relevance(channels, positions))
        conditions = [{layer: {int(c): [int(p)]}} for c, p in zip(channels, positions, strict=True)]
        data = rows.clone().requires_grad_()
        theirs = attribution(
            data,
            conditions,
            lrp.composite(model, rows),
            mask_map=ChannelConcept.mask_rf,
            start_layer=layer,
            exclude_parallel=False,
        )
    print(f"| {name} {layer} | receptive-field heatmaps | {relative(ours.sum(dim=1), theirs.heatmap):.1e} |")


def main() -> None:
    torch.manual_seed(0)
    print("| model, layer | compared | max |difference| / max |value| |\n|---|---|---|")
    compare("shortcut CNN", load_shortcut_model(), "block3", shortcut_dataset(1, seed=4, mark_rate=1.0).inputs)
    compare("resnet18", torchvision.models.resnet18(num_classes=10).eval(), "layer3", torch.rand(1, 3, 64, 64))
    compare("vgg11", torchvision.models.vgg11(num_classes=10).eval(), "features.10", torch.rand(1, 3, 64, 64))


if __name__ == "__main__":
    main()
