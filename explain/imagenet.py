"""ImageNet's normalisation: the channel means and standard deviations that torchvision's
and most timm models expect their inputs normalised with."""

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD"]

#: ImageNet's per-channel mean, as torchvision's and timm's ImageNet models normalise.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
#: ImageNet's per-channel standard deviation.
IMAGENET_STD = (0.229, 0.224, 0.225)
